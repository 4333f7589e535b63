"""One-shot FedGO's message: the model and the discriminator D_k in one ``train`` reply
(:data:`DISCRIMINATOR_KEY`), with D_k's training statistics (``disc_*``). The client's
parameters are FedGO's (:class:`~fedgo_flwr.gan.settings.GanConfig`)."""

from __future__ import annotations

from fedgo_flwr.gan.settings import GanConfig
from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import TRAIN_METRICS, ReplySpec, Scalar

DISCRIMINATOR_KEY = "discriminator"

PROTOCOL = Declaration(
    "oneshot_fedgo",
    {
        TRAIN: ReplySpec(
            arrays=("arrays", DISCRIMINATOR_KEY),
            metrics=dict(TRAIN_METRICS),
            metric_prefixes={"disc_": Scalar()},
        )
    },
    Config=GanConfig,
    server_state=True,  # the generator and the discriminators
)
