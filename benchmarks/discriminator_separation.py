"""Diagnostic: do a FedGO run's discriminators tell the clients apart?

FedGO's weights w_k(x) = n_k Phi_k(x) / sum_i n_i Phi_i(x) are near-optimal when each
discriminator approaches D_k = p_k / (p_k + p_g) (Jang et al., ICML 2025, Thm 3.6). Under label
skew, p_k(x) / p(x) is then the share of x's class in client k's data, so the odds rank a
sample of client k's own classes above one of a class k never saw. This script measures that
directly on the server's (labelled, for diagnostics only) set, for all K discriminators of a
finished run, with no client model involved:

- ``auc_own_vs_unseen``: per client, the probability that z_k(x) is larger on an image of a class
  holding >= 10% of k's data than on an image of a class k holds no example of (ROC AUC; 0.5 =
  no separation, 1 = perfect). Mean and range over the clients;
- ``weight_on_knowing_clients``: the mean over server images of the total weight, over all K
  clients, that falls on clients holding at least one training example of the image's class,
  for n_k-only weights, FedGO's double and single sigmoid, and the label oracle (which puts all
  of it there);
- ``mean_sigmoid`` and the share above 0.99: how saturated the discriminators are.

    .venv/bin/python -m benchmarks.discriminator_separation outputs/bench/<tag>/fedgo-seed0 \
        [--save benchmarks/results/<tag>/fedgo-seed0/separation.json]

With ``--save`` the report is also written as JSON; ``fedgo_table3.py`` puts the reports it
finds beside the FedGO runs' summaries (loose, or packed into the results' ``runs.tar.xz`` by
``python -m benchmarks.sweep pack benchmarks/results/<tag>``) into ``table.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from fedgo_flwr.gan import discriminator_logits
from fedgo_flwr.learning.task import load_bundle, make_partition
from fedgo_flwr.learning.training import get_device
from fedgo_flwr.runtime.fileio import strict_json
from fedgo_flwr.weighting import WeightingInputs, compute_weights
from strategies import load_experiment

OWN_SHARE = 0.10
ROOT = Path(__file__).resolve().parent.parent


def shown(path: Path) -> str:
    """``path`` relative to the repository if it lies inside it (a saved report is committed)."""
    full = path.resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(path)


def own_vs_unseen_aucs(z: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> list[float]:
    """Per client (rows of ``z``: logits ``(K, N)``; ``counts``: its class histogram
    ``(K, C)``), the ROC AUC of ``z_k`` on images of its own classes (>= :data:`OWN_SHARE` of
    its data) against images of classes it holds none of; clients without both are skipped."""
    aucs = []
    for row in range(len(z)):
        share = counts[row] / counts[row].sum()
        own = share[y] >= OWN_SHARE
        unseen = counts[row][y] == 0
        if own.any() and unseen.any():
            keep = own | unseen
            aucs.append(float(roc_auc_score(own[keep].numpy(), z[row][keep].numpy())))
    return aucs


def weight_on_knowing(w: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> float:
    """Mean over the samples of the weight (``w``: ``(K, N)``) on the clients that hold at
    least one training example of the sample's class (``counts``: ``(K, C)``), in %."""
    knows = (counts[:, y] > 0).double()
    return round(100 * (w.double() * knows).sum(0).mean().item(), 1)


def separation(run_dir: str) -> dict:
    """The report above for the finished FedGO run in ``run_dir`` (needs its discriminators.pt)."""
    run = Path(run_dir)
    if not (run / "discriminators.pt").is_file():
        sys.exit(f"{run / 'discriminators.pt'} not found: give the output folder of a FedGO run")
    cfg = load_experiment(run / "config.yaml")
    params = cfg.strategy.params
    bundle = load_bundle(cfg.data)
    partition = make_partition(cfg)
    server = bundle.train.subset(partition.server)
    _, y = server.to_tensors()
    counts = torch.as_tensor(
        np.asarray(partition.histogram(bundle.train.y, bundle.train.num_classes)),
        dtype=torch.float64,
    )  # (K, C)
    sizes = counts.sum(1)
    saved = torch.load(run / "discriminators.pt", map_location="cpu")
    k_all = sorted(saved)
    discs = []
    for pid in k_all:
        disc = params.discriminator.build(bundle.train.input_shape)
        disc.load_state_dict(saved[pid])
        discs.append(disc)
    z = discriminator_logits(dict(enumerate(discs)), server, device=get_device(cfg.device))
    z = z[:, 0]  # (K, N): rows in k_all order

    aucs = own_vs_unseen_aucs(z, y, counts[k_all])
    inputs = WeightingInputs(
        logits=torch.zeros(len(k_all), len(y), bundle.train.num_classes),
        num_examples=sizes[k_all],
        disc_logits=z,
        labels=y,
        class_counts=counts[k_all],
    )

    def mass(name: str, **kw) -> float:
        return weight_on_knowing(compute_weights(name, inputs, **kw), y, counts[k_all])

    sig = torch.sigmoid(z)
    report = {
        "run": shown(run),
        "clients": len(k_all),
        "server_images": len(y),
        "auc_own_vs_unseen": {
            "mean": round(statistics.mean(aucs), 3),
            "min": round(min(aucs), 3),
            "max": round(max(aucs), 3),
            "clients": len(aucs),
        },
        "weight_on_knowing_clients_pct": {
            "data_size": mass("data_size"),
            "fedgo_double_sigmoid": mass("fedgo"),
            "fedgo_single_sigmoid": mass("fedgo", disc_mode="sigmoid"),
            "oracle": mass("oracle"),
        },
        "mean_sigmoid": round(sig.mean().item(), 3),
        "share_sigmoid_above_0.99": round((sig > 0.99).double().mean().item(), 3),
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="output folder of a finished FedGO run")
    parser.add_argument("--save", type=Path, help="also write the report to this JSON file")
    args = parser.parse_args()
    report = separation(args.run_dir)
    text = strict_json(report, name="separation report", indent=2)
    print(text)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(text + "\n")


if __name__ == "__main__":
    main()
