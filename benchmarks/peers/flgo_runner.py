"""The FLGo peer: FLGo's ``fedavg`` on a benchmark made from ``partition.json``.

``python flgo_runner.py RUN_DIR`` (FLGo's venv). FLGo's way to bring one's own data: a benchmark
generated from a config file (``train_data``, ``test_data``, ``get_model``; here the shared
arrays as datasets of (image tensor, int label), like torchvision's, and
:class:`common.SmallCNN` with ``init.pt``), and a task generated with a partitioner, here one
that returns the clients of ``partition.json``. Training is FLGo's own (``fedavg.Server`` /
``Client``, its option dict from ``setting.json``: aggregation weighted by data size, SGD); its
client dataset gets the ``__getitems__`` torch 2.14 asks of a ``Subset`` subclass. The clients
of a round: with the config's ``schedule: true``, the ``Server`` subclass overrides
``sample``, the method FLGo's ``iterate`` calls for a round's clients (FLGo's extension point
for client selection), to return ``partition.json``'s ``schedule[current_round - 1]``
(``common.scheduled_clients``), the project's draw; otherwise FLGo's own ``sample`` (the
option's ``sample``: uniform without replacement). A Logger subclass (FLGo's extension point)
evaluates with ``common.evaluate`` before round 1 and after the last (``eval_interval =
rounds``); the ``Server`` subclass notes the end of every round, with the clients that replied
and their training images (FLGo's ``datavol``), in ``rounds.jsonl``.
"""

from __future__ import annotations

import os
import sys

from common import (
    Clock,
    Shared,
    evaluate,
    load_setting,
    run_dir_from_argv,
    scheduled_clients,
    set_threads,
)

BENCHMARK_CONFIG = '''\
"""FLGo benchmark config: the data and model of benchmarks/peers_speed.py's experiment."""
import json
from pathlib import Path

import torch

from common import Shared, images


class Split(torch.utils.data.Dataset):
    """Images as tensors, labels as ints (as torchvision's CIFAR10 gives them: FLGo's plot of the
    partition counts the classes with set(labels), which tensors would make one per sample)."""

    def __init__(self, x, y):
        self.x, self.y = images(x), [int(v) for v in y]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


_setting = json.loads((Path(__file__).resolve().parents[1] / "setting.json").read_text())
_shared = Shared(_setting["shared"])
train_data = Split(_shared.train_x, _shared.train_y)
test_data = Split(_shared.test_x, _shared.test_y)


def get_model():
    return _shared.new_model()
'''


def main() -> None:
    run_dir = run_dir_from_argv()
    setting = load_setting(run_dir)
    exp, option = setting["experiment"], dict(setting["config"])
    follow_schedule = bool(option.pop("schedule", False))  # ours, not an FLGo option
    set_threads(exp["threads"])
    os.chdir(run_dir)  # FLGo names a generated benchmark by its path relative to the cwd
    sys.path.insert(0, str(run_dir))

    import flgo
    import flgo.benchmark.partition
    import flgo.benchmark.toolkits.cv.classification as cv_classification
    import flgo.experiment.logger
    from flgo.algorithm import fedavg

    # FLGo 0.4.4's client dataset subclasses torch's Subset and overrides __getitem__ only,
    # which torch 2.14 refuses ("must also override __getitems__"); the method torch's message
    # gives, added here, is all it takes.
    task_dataset = cv_classification.FromDatasetPipe.TaskDataset
    if "__getitems__" not in vars(task_dataset):
        task_dataset.__getitems__ = lambda self, indices: [self[i] for i in indices]

    shared = Shared(setting["shared"])
    test_x, test_y = shared.test_tensors()
    clock = Clock(run_dir)
    rounds = exp["rounds"]

    class SharedPartitioner(flgo.benchmark.partition.BasicPartitioner):
        """The clients of ``partition.json``, as indices into ``train_data``."""

        num_clients = len(shared.clients)  # read by FLGo's plot of the partition

        def __call__(self, data):
            return [c.tolist() for c in shared.clients]

    trained: dict = {}  # the last round's clients and images, for its record

    class RoundLogger(flgo.experiment.logger.BasicLogger):
        """Evaluates the global model (called before round 1 and every ``eval_interval``)."""

        evaluated = 0

        def log_once(self, *args, **kwargs):
            done = 0 if self.evaluated == 0 else self.coordinator.current_round
            self.evaluated += 1
            acc, loss = evaluate(self.coordinator.model, test_x, test_y, exp["eval_batch_size"])
            clock.round_done(done, accuracy=acc, **(trained if done else {}))
            if done == rounds:
                clock.finish(acc, loss)

    class TimedServer(fedavg.Server):
        def sample(self):
            if follow_schedule:
                return scheduled_clients(shared.schedule, self.current_round)
            return super().sample()

        def iterate(self):
            updated = super().iterate()
            clients = [int(c) for c in self.received_clients]
            trained["clients"] = clients
            trained["images"] = sum(int(self.clients[c].datavol) for c in clients)
            if self.current_round != rounds:  # the last round ends with its evaluation
                clock.round_done(self.current_round, **trained)
            return updated

    class FedAvgTimed:
        Server = TimedServer
        Client = fedavg.Client

    bmk = run_dir / "peers_cifar10"
    config_file = run_dir / "flgo_benchmark_config.py"
    config_file.write_text(BENCHMARK_CONFIG)
    module = flgo.gen_benchmark_from_file(
        "peers_cifar10",
        str(config_file),
        str(run_dir),
        data_type="cv",
        task_type="classification",
        overwrite=True,
    )
    assert bmk.is_dir(), module
    import importlib

    task = str(run_dir / "task")
    flgo.gen_task_by_(
        importlib.import_module(module), SharedPartitioner(), task, seed=exp["seed"], overwrite=True
    )
    runner = flgo.init(task, FedAvgTimed, option=option, Logger=RoundLogger)
    runner.run()


if __name__ == "__main__":
    main()
