"""One-shot client with a FedGO discriminator: local training and D_k in the same round.

The beyond-the-paper variant of Co-Boosting's one-shot setting: the one training
message carries a generator G besides the model; the client trains its model as FedAvg does,
then its discriminator D_k against G (FedGO, Jang et al. ICML 2025, Alg. 3: local data
labelled 1, samples of the frozen G labelled 0; :meth:`clients.fedgo.FedGOClient.
train_discriminator`), and uploads both in one reply (``discriminator`` ArrayRecord beside the
model). The generator may be untrained: FedGO's Table 12 found odds against a random G
already informative.
"""

from __future__ import annotations

from flwr.app import ArrayRecord

from clients.base import ClientAlgorithm, ClientJob
from clients.fedgo import FedGOClient
from fedgo_flwr.learning.training import TrainStats
from fedgo_flwr.protocol.oneshot_fedgo import DISCRIMINATOR_KEY, PROTOCOL
from fedgo_flwr.runtime.messages import ARRAYS


class OneShotFedGOClient(ClientAlgorithm):
    """FedAvg's local training, then the discriminator, one reply."""

    name = "oneshot_fedgo"
    Config = PROTOCOL.Config

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        stats, extra = super().train(job)
        records, metrics = FedGOClient().train_discriminator(job)
        stats.metrics.update(metrics)
        return stats, {**extra, DISCRIMINATOR_KEY: records[ARRAYS]}
