"""The FedLab peer: FedLab's standalone simulation (``StandalonePipeline``), its serial SGD trainer.

``python fedlab_runner.py RUN_DIR`` (FedLab's venv). The clients of ``partition.json`` are a
``FedDataset`` whose ``get_dataloader`` gives each client's shard (a shuffled ``DataLoader``);
``SGDSerialClientTrainer`` trains the sampled clients one after another with FedLab's loop. The
clients of a round come from the handler's ``sample_clients`` (FedLab's extension point for
client selection, which the pipeline calls once a round): with the config's ``schedule: true``
the handler returns ``partition.json``'s ``schedule[r - 1]`` for round ``r``
(``common.scheduled_clients``), the project's draw; otherwise ``SyncServerHandler``'s own
``sample_ratio * num_clients`` clients without replacement. Each round's clients and their
uploaded sample counts are recorded in ``rounds.jsonl``.
FedLab's stock handler averages the client models with equal weights; FedAvg weights them by
data size, so, as FedLab's docs invite, the trainer also uploads its sample count and the
handler's ``global_update`` passes the counts as ``fedavg_aggregate``'s weights. Central
evaluation (``common.evaluate``) before the first and after the last round.
"""

from __future__ import annotations

import torch
from common import (
    Clock,
    Shared,
    evaluate,
    load_setting,
    run_dir_from_argv,
    scheduled_clients,
    set_threads,
)
from fedlab.contrib.algorithm.basic_client import SGDSerialClientTrainer
from fedlab.contrib.algorithm.basic_server import SyncServerHandler
from fedlab.contrib.dataset.basic_dataset import FedDataset
from fedlab.core.standalone import StandalonePipeline
from fedlab.utils.aggregator import Aggregators
from fedlab.utils.serialization import SerializationTool
from torch.utils.data import DataLoader, TensorDataset


class SharedFedDataset(FedDataset):
    """The clients of ``partition.json``."""

    def __init__(self, shared: Shared, seed: int) -> None:
        super().__init__()
        self.shared, self.num = shared, len(shared.clients)
        self.generator = torch.Generator().manual_seed(seed)

    def get_dataset(self, id, type="train"):  # noqa: A002 - FedLab's signature
        return TensorDataset(*self.shared.client_tensors(int(id)))

    def get_dataloader(self, id, batch_size, type="train"):  # noqa: A002
        return DataLoader(
            self.get_dataset(id), batch_size=batch_size, shuffle=True, generator=self.generator
        )


class WeightedTrainer(SGDSerialClientTrainer):
    """FedLab's serial SGD trainer, uploading ``[parameters, sample count]``."""

    def train(self, model_parameters, train_loader):
        (parameters,) = super().train(model_parameters, train_loader)
        return [parameters, torch.tensor(float(len(train_loader.dataset)))]


class WeightedHandler(SyncServerHandler):
    """FedLab's synchronous handler, averaging weighted by the uploaded sample counts; with a
    ``schedule`` (``partition.json``'s), round ``r`` samples ``schedule[r - 1]``."""

    schedule: list[list[int]] | None = None

    def sample_clients(self):
        if self.schedule is None:
            return super().sample_clients()
        return scheduled_clients(self.schedule, self.round + 1)  # self.round: rounds done

    def global_update(self, buffer):
        parameters = [ele[0] for ele in buffer]
        weights = torch.stack([ele[1] for ele in buffer])
        SerializationTool.deserialize_model(
            self._model, Aggregators.fedavg_aggregate(parameters, weights)
        )


class TimedPipeline(StandalonePipeline):
    """``StandalonePipeline.main``'s loop, with the round clock and central evaluation."""

    def __init__(self, handler, trainer, clock: Clock, shared: Shared, batch: int) -> None:
        super().__init__(handler, trainer)
        self.clock, self.batch = clock, batch
        self.x, self.y = shared.test_tensors()

    def main(self):
        acc, _ = evaluate(self.handler.model, self.x, self.y, self.batch)
        self.clock.round_done(0, accuracy=acc)
        done = 0
        while self.handler.if_stop is False:
            sampled_clients = self.handler.sample_clients()
            broadcast = self.handler.downlink_package
            self.trainer.local_process(broadcast, sampled_clients)
            packs = self.trainer.uplink_package
            images = int(sum(float(pack[1]) for pack in packs))
            for pack in packs:
                self.handler.load(pack)
            done += 1
            trained = {"clients": [int(c) for c in sampled_clients], "images": images}
            if self.handler.if_stop:
                acc, loss = evaluate(self.handler.model, self.x, self.y, self.batch)
                self.clock.round_done(done, accuracy=acc, **trained)
                self.clock.finish(acc, loss)
            else:
                self.clock.round_done(done, **trained)


def main() -> None:
    run_dir = run_dir_from_argv()
    setting = load_setting(run_dir)
    exp, conf = setting["experiment"], setting["config"]
    set_threads(exp["threads"])
    torch.manual_seed(exp["seed"])
    import random

    random.seed(exp["seed"])  # FedLab's sampler draws from ``random``
    shared = Shared(setting["shared"])
    trainer = WeightedTrainer(shared.new_model(), conf["num_clients"], cuda=False)
    trainer.setup_dataset(SharedFedDataset(shared, exp["seed"]))
    trainer.setup_optim(conf["epochs"], conf["batch_size"], conf["lr"])
    handler = WeightedHandler(
        shared.new_model(), conf["global_round"], conf["sample_ratio"], cuda=False
    )
    if conf.get("schedule"):
        handler.schedule = shared.schedule
    TimedPipeline(handler, trainer, Clock(run_dir), shared, exp["eval_batch_size"]).main()


if __name__ == "__main__":
    main()
