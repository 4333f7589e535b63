"""The plain Flower peer: a quickstart-pytorch style app (a ``NumPyClient`` and Flower's
``flwr.server.strategy.FedAvg`` in the compat layer), run by ``flower_launch.py`` with
``flwr run`` on a local simulation SuperLink.

Its run config (``pyproject.toml``, written by ``benchmarks/peers_setting.py``) names the run
folder; ``setting.json`` there holds the experiment. Partition ``k`` of the simulation trains
client ``k``'s shard of ``partition.json``; the strategy samples ``clients_per_round`` nodes a
round with Flower's own sampler (a quickstart app does; ``partition.json``'s ``schedule`` is
not followed) and evaluates centrally (before round 1 and after the last). Each client reports
its partition id in its fit metrics; the strategy's ``fit_metrics_aggregation_fn``, which
Flower calls with every reply's ``(num_examples, metrics)`` before the round's central
evaluation, notes the round's clients and training images for ``rounds.jsonl``, and the
clients' local training time (``train_time_sum``, ``train_time_max``: seconds of
``local_train`` in each client, as the project's ``client_time_sum`` / ``client_time_max``),
so a round's overlap of its clients' training can be read as in the project's records.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import torch
from common import Clock, Shared, evaluate, load_setting, local_train, set_threads
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg


@functools.lru_cache(maxsize=1)
def _setting(run_dir: str) -> tuple[dict, Shared]:
    setting = load_setting(Path(run_dir))
    set_threads(setting["experiment"]["threads"])
    return setting, Shared(setting["shared"])


def _get(model: torch.nn.Module) -> list[np.ndarray]:
    return [v.detach().cpu().numpy() for v in model.state_dict().values()]


def _set(model: torch.nn.Module, arrays: list[np.ndarray]) -> None:
    keys = model.state_dict().keys()
    model.load_state_dict(
        {k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, arrays, strict=True)}
    )


class CifarClient(NumPyClient):
    def __init__(self, run_dir: str, partition: int) -> None:
        self.setting, self.shared = _setting(run_dir)
        self.partition = partition
        self.model = self.shared.new_model()

    def fit(self, parameters, config):
        exp = self.setting["experiment"]
        _set(self.model, parameters)
        x, y = self.shared.client_tensors(self.partition)
        gen = torch.Generator().manual_seed(
            exp["seed"] * 100003 + int(config["round"]) * 1009 + self.partition
        )
        started = time.perf_counter()
        loss = local_train(
            self.model,
            x,
            y,
            epochs=exp["local_epochs"],
            batch_size=exp["batch_size"],
            lr=exp["lr"],
            momentum=exp["momentum"],
            weight_decay=exp["weight_decay"],
            generator=gen,
        )
        seconds = time.perf_counter() - started
        metrics = {"train_loss": loss, "partition": self.partition, "train_time": seconds}
        return _get(self.model), len(y), metrics


def client_fn(context: Context):
    run_dir = str(context.run_config["run-dir"])
    return CifarClient(run_dir, int(context.node_config["partition-id"])).to_client()


def server_fn(context: Context):
    run_dir = str(context.run_config["run-dir"])
    setting, shared = _setting(run_dir)
    exp, conf = setting["experiment"], setting["config"]
    model = shared.new_model()
    test_x, test_y = shared.test_tensors()
    clock = Clock(Path(run_dir))
    trained: dict = {}  # the round's clients and images, from its fit replies

    def fit_metrics(replies):
        trained["clients"] = [int(m["partition"]) for _, m in replies]
        trained["images"] = int(sum(n for n, _ in replies))
        times = [float(m["train_time"]) for _, m in replies]
        trained["train_time_sum"], trained["train_time_max"] = sum(times), max(times, default=0.0)
        losses = [(n, float(m["train_loss"])) for n, m in replies]
        total = sum(n for n, _ in losses)
        return {"train_loss": sum(n * v for n, v in losses) / total} if total else {}

    def central(server_round: int, arrays, _config):
        done = trained if server_round else {}
        if server_round not in (0, exp["rounds"]):
            clock.round_done(server_round, **done)
            return None
        _set(model, arrays)
        acc, loss = evaluate(model, test_x, test_y, exp["eval_batch_size"])
        clock.round_done(server_round, accuracy=acc, **done)
        if server_round == exp["rounds"]:
            clock.finish(acc, loss)
        return loss, {"accuracy": acc}

    strategy = FedAvg(
        fraction_fit=conf["fraction_fit"],
        fraction_evaluate=0.0,
        min_fit_clients=conf["min_fit_clients"],
        min_available_clients=conf["min_available_clients"],
        initial_parameters=ndarrays_to_parameters(_get(model)),
        evaluate_fn=central,
        on_fit_config_fn=lambda r: {"round": r},
        fit_metrics_aggregation_fn=fit_metrics,
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=exp["rounds"]))


client = ClientApp(client_fn=client_fn)
server = ServerApp(server_fn=server_fn)
