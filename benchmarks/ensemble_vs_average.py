"""Does the clients' ensemble beat their parameter average? A FedAvg trajectory with probes.

Distillation (FedDF, FedGO) can only help if the round's client models, combined as an
ensemble, predict better than their parameter average (the FedAvg model the student starts
from). This script runs the config's rounds as FedAvg through the library in one process
(:func:`replay.replay`: the ServerApp, strategy and ClientApp code of ``./run.sh`` on the
in-process grid, so the same partition, sampling, initialisation and client training) and looks
at every round's client models as their replies pass through the grid. Every round it scores,
on the test split:

- ``avg``: the n_k-weighted parameter average of the round's client models (the strategy's
  :class:`fedgo_flwr.learning.aggregation.RunningAverage`, the model FedAvg makes of them);
- ``logits``: the ensemble of the clients' logits with ``uniform`` weights (FedDF's AVGLOGITS);
- ``probs``: the uniform mean of the clients' softmax outputs (a mean of probabilities, not a
  logit weighting: a plain mean);
- ``nk_logits``: the logit ensemble with ``data_size`` weights, n_k / sum n_i (FedGO's weights
  with equal odds);
- ``oracle``: the logit ensemble with ``oracle`` weights, n_{k,y} / sum_i n_{i,y} (the label
  oracle; an image of a class none of the round's clients holds gets uniform weights);
- ``client_mean``: the mean accuracy of one client model alone;
- ``logit_norm``: the mean L2 norm of a client's logit vector (confidence scale);
- ``seconds``: the round's wall time up to the probes' scores (client training and probes).

The weights come from the weighting registry (:func:`fedgo_flwr.weighting.compute_weights`),
the same code the distillation strategies use. The run's own files (``metrics.jsonl`` etc.) go
to a temporary folder; ``--out`` keeps the probes, one JSON line per round.

    .venv/bin/python -m benchmarks.ensemble_vs_average CONFIG [k=v ...] [--rounds R] \
        [--test-size N] [--out probes.jsonl]
"""

from __future__ import annotations

import argparse
import time
from typing import IO

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Message

from benchmarks.replay import client_model, replay
from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.data import stratified_subset
from fedgo_flwr.learning.aggregation import RunningAverage
from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
from fedgo_flwr.learning.training import get_device, predict_logits
from fedgo_flwr.runtime.fileio import strict_json
from fedgo_flwr.weighting import WeightingInputs, compute_weights, ensemble_logits
from strategies import load_experiment


def acc(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(-1) == y).float().mean())


class Probes:
    """Scores a round's client models on the test split, one reply at a time."""

    def __init__(self, cfg: ExperimentConfig, test_size: int | None, out: IO[str] | None) -> None:
        self.device = get_device(cfg.device)
        bundle = load_bundle(cfg.data)
        counts = make_partition(cfg).histogram(bundle.train.y, bundle.train.num_classes)
        self.class_counts = torch.as_tensor(np.asarray(counts), dtype=torch.float64)  # (K, C)
        self.test = bundle.test
        if test_size:
            self.test = self.test.subset(stratified_subset(self.test.y, test_size))
        self.y = torch.as_tensor(self.test.y).long()
        self.model = new_model(cfg, bundle)
        self.out = out
        self.round = 0
        self.new_round()

    def new_round(self) -> None:
        self.pids: list[int] = []
        self.sizes: list[float] = []
        self.logits: list[torch.Tensor] = []
        self.average = RunningAverage()
        self.started = time.perf_counter()

    def add(self, reply: Message) -> None:
        """One client model of the round (a train reply)."""
        pid, size = client_model(reply, self.model)
        arrays = {k: v.numpy() for k, v in reply.content["arrays"].items()}
        self.average.add(arrays, size)  # as the FedAvg strategy does
        self.logits.append(predict_logits(self.model, self.test, 1000, self.device))
        self.pids.append(pid)
        self.sizes.append(float(size))

    def end_round(self) -> None:
        """Score the round's client models; print and write one row."""
        self.round += 1
        y = self.y
        lg = torch.stack(self.logits)  # (K, N, C)
        self.model.load_state_dict(
            {k: torch.from_numpy(v) for k, v in self.average.result().items()}
        )
        avg_logits = predict_logits(self.model, self.test, 1000, self.device)
        inputs = WeightingInputs(
            logits=lg,
            num_examples=torch.tensor(self.sizes),
            labels=y,
            class_counts=self.class_counts[self.pids],
        )

        def ensemble(name: str) -> torch.Tensor:
            return ensemble_logits(lg, compute_weights(name, inputs))

        row = {
            "round": self.round,
            "avg": acc(avg_logits, y),
            "logits": acc(ensemble("uniform"), y),
            "probs": acc(F.softmax(lg, -1).mean(0), y),
            "nk_logits": acc(ensemble("data_size"), y),
            "oracle": acc(ensemble("oracle"), y),
            "client_mean": float(np.mean([acc(x, y) for x in self.logits])),
            "logit_norm": float(lg.norm(dim=-1).mean()),
            "seconds": time.perf_counter() - self.started,
        }
        print(
            " ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
            ),
            flush=True,
        )
        if self.out:
            self.out.write(strict_json(row, name="ensemble_vs_average row") + "\n")
            self.out.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=None, help="write one JSON line per round here")
    parser.add_argument("--test-size", type=int, default=None, help="stratified test subset")
    args = parser.parse_args()
    overrides = [*args.overrides, *([f"rounds={args.rounds}"] if args.rounds else [])]
    cfg = load_experiment(args.config, overrides)
    out = open(args.out, "w") if args.out else None
    try:
        probes = Probes(cfg, args.test_size, out)
        replay(args.config, overrides, probes.add, probes.new_round, probes.end_round)
    finally:
        if out:
            out.close()


if __name__ == "__main__":
    main()
