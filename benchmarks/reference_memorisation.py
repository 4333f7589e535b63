"""Do a run's server-referenced discriminators remember the server images they were trained
against?

With ``strategy.discriminator.reference: server`` (the ``fedgo_server`` variant), client k
trains its discriminator with its own images as positives and the server's unlabeled images as
negatives, and the server then weights the teachers on those same images with the
discriminators' odds (FedGO, Jang et al. 2025, Eq. 9 with the server's distribution as the
reference). A discriminator that memorised its negatives would score them lower than unseen
images of the same distribution, so the weights on the distillation set would not be the
weights the odds estimate.

For each client's discriminator in the run's ``discriminators.pt``, this reports the ROC AUC of
its logits on images it never saw (label 1) against the reference images it was trained on
(label 0): 0.5 when it cannot tell them apart, above 0.5 when it scores its own negatives lower.
The unseen images are the server images outside the reference when
``strategy.discriminator.reference_size`` sent only part of the share, else the test split
(``data.test_subset`` of it). Both are drawn from the same distribution as the reference, so a
difference is memorisation, not a domain gap (on CIFAR-10 the test split is the dataset's own
held-out half; ``--unseen test`` forces it).

    .venv/bin/python -m benchmarks.reference_memorisation RUN_DIR [--unseen auto|server|test]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.discriminator_variants import memorisation_aucs as aucs_of_sent
from fedgo_flwr.config.experiment import load_config
from fedgo_flwr.data.arrays import ArrayDataset
from fedgo_flwr.gan.sampling import discriminator_logits
from fedgo_flwr.gan.settings import DiscriminatorConfig
from fedgo_flwr.learning.task import load_bundle, make_partition
from fedgo_flwr.runtime.fileio import safe_torch_load
from strategies._prefl import reference_indices


def memorisation_aucs(seen: torch.Tensor, unseen: torch.Tensor) -> list[float]:
    """Per discriminator (rows: ``(K, N_seen)`` and ``(K, N_unseen)`` logits), the ROC AUC of
    the unseen images (label 1) against the seen ones (label 0), as
    :func:`benchmarks.discriminator_variants.memorisation_aucs` computes it."""
    sent = torch.cat([torch.ones(seen.shape[1]), torch.zeros(unseen.shape[1])]).bool()
    return aucs_of_sent(torch.cat([seen, unseen], dim=1), sent)


def sets(cfg, bundle, unseen: str) -> tuple[ArrayDataset, ArrayDataset, str]:
    """The reference images the discriminators saw, the unseen images, and what those are."""
    if cfg.data.public_path is not None:
        raise SystemExit("a run with data.public_path: its reference is not the server's share")
    server = bundle.train.subset(make_partition(cfg).server)
    size = cfg.strategy.raw_params["discriminator"].get("reference_size", 0)
    sent = reference_indices(len(server), size, cfg.seed)
    rest = np.setdiff1d(np.arange(len(server)), sent)
    if unseen == "server" and len(rest) == 0:
        raise SystemExit("every server image was sent as the reference: use --unseen test")
    if unseen == "server" or (unseen == "auto" and len(rest) > 0):
        return server.subset(sent), server.subset(rest), "server images outside the reference"
    return server.subset(sent), bundle.test, "the test split"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run's folder (config.yaml, discriminators.pt)")
    parser.add_argument("--unseen", choices=["auto", "server", "test"], default="auto")
    args = parser.parse_args(argv)
    cfg = load_config(args.run / "config.yaml")
    params = cfg.strategy.raw_params.get("discriminator")
    if params is None or params.get("reference") != "server":
        raise SystemExit(f"{args.run}: not a run with strategy.discriminator.reference: server")
    bundle = load_bundle(cfg.data)
    seen, unseen, what = sets(cfg, bundle, args.unseen)
    disc_cfg = DiscriminatorConfig(**params)
    states = safe_torch_load(args.run / "discriminators.pt", "discriminator file")
    discs = {}
    for key, state in states.items():
        disc = disc_cfg.build(bundle.train.input_shape)
        disc.load_state_dict(state)
        discs[int(key)] = disc
    k = cfg.data.num_clients
    z_seen = discriminator_logits(discs, seen, num_clients=k)[sorted(discs), 0]
    z_unseen = discriminator_logits(discs, unseen, num_clients=k)[sorted(discs), 0]
    aucs = memorisation_aucs(z_seen, z_unseen)
    result = {
        "run": args.run.name,
        "seed": cfg.seed,
        "discriminator": {
            key: params.get(key) for key in ("epochs", "spectral_norm", "reference_size")
        },
        "seen": len(seen),
        "unseen": f"{len(unseen)} {what}",
        "memo_auc": dict(zip(sorted(discs), aucs, strict=True)),
        "memo_auc_mean": statistics.mean(aucs),
        "memo_auc_range": [min(aucs), max(aucs)],
        "mean_logit_seen": float(z_seen.mean()),
        "mean_logit_unseen": float(z_unseen.mean()),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
