"""Does the clients' ensemble beat their parameter average? A FedAvg trajectory with probes.

Distillation (FedDF, FedGO) can only help if the round's client models, combined as an
ensemble, predict better than their parameter average (the FedAvg model the student starts
from). This script runs plain FedAvg rounds in one process (the same partition, sampling,
initialisation and client training as ``./run.sh`` for the config) and, every round, scores on
the test split:

- ``avg``: the n_k-weighted parameter average of the round's client models;
- ``logits``: softmax of the uniform mean of the clients' logits (FedDF's AVGLOGITS);
- ``probs``: the uniform mean of the clients' softmax outputs;
- ``nk_logits``: the n_k-weighted mean of logits (FedGO's weights with equal odds);
- ``oracle``: logits weighted by n_{k,y} / sum_i n_{i,y} (the label oracle);
- ``logit_norm``: the mean L2 norm of a client's logit vector (confidence scale).

    .venv/bin/python benchmarks/ensemble_vs_average.py CONFIG [k=v ...] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients import CLIENTS, ClientJob  # noqa: E402
from fedgo_flwr.aggregation import weighted_average  # noqa: E402
from fedgo_flwr.config import load_config  # noqa: E402
from fedgo_flwr.rng import make_rng  # noqa: E402
from fedgo_flwr.task import (  # noqa: E402
    client_dataset,
    load_bundle,
    make_partition,
    new_model,
    sample_clients,
    stratified_subset,
)
from fedgo_flwr.training import get_device, predict_logits  # noqa: E402


def acc(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(-1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=None, help="write one JSON line per round here")
    parser.add_argument("--test-size", type=int, default=None, help="stratified test subset")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    rounds = args.rounds or cfg.rounds
    device = get_device(cfg.device)
    bundle = load_bundle(cfg.data)
    partition = make_partition(cfg)
    counts = partition.histogram(bundle.train.y, bundle.train.num_classes)
    hist = torch.tensor(np.asarray(counts), dtype=torch.float32)  # (K, C)
    test = bundle.test
    if args.test_size:
        test = test.subset(stratified_subset(test.y, args.test_size))
    y = torch.as_tensor(test.y).long()
    model = new_model(cfg, bundle)
    glob = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    out = open(args.out, "w") if args.out else None
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        pids = sample_clients(cfg.seed, rnd, cfg.data.num_clients, cfg.clients_per_round)
        states, sizes, logits = [], [], []
        for pid in pids:
            local = new_model(cfg, bundle)
            local.load_state_dict({k: torch.from_numpy(v) for k, v in glob.items()})
            data = client_dataset(cfg, pid)
            job = ClientJob(
                cfg,
                pid,
                rnd,
                local,
                data,
                device,
                make_rng(cfg.seed, "train", rnd, pid),
                None,
                None,
            )
            CLIENTS["fedavg"]().train(job)
            states.append({k: v.detach().cpu().numpy() for k, v in local.state_dict().items()})
            sizes.append(len(data))
            logits.append(predict_logits(local, test, device=device, batch_size=1000).cpu())
        glob = weighted_average(states, sizes)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in glob.items()})
        avg_logits = predict_logits(model, test, device=device, batch_size=1000).cpu()
        lg = torch.stack(logits)  # (K, N, C)
        nk = torch.tensor(sizes, dtype=torch.float32)
        h = hist[pids][:, y]  # (K, N): n_{k, y(x)}
        w_or = h / h.sum(0, keepdim=True).clamp_min(1e-12)
        row = {
            "round": rnd,
            "avg": acc(avg_logits, y),
            "logits": acc(lg.mean(0), y),
            "probs": acc(F.softmax(lg, -1).mean(0), y),
            "nk_logits": acc((lg * (nk / nk.sum())[:, None, None]).sum(0), y),
            "oracle": acc((lg * w_or[..., None]).sum(0), y),
            "client_mean": float(np.mean([acc(x, y) for x in logits])),
            "logit_norm": float(lg.norm(dim=-1).mean()),
            "seconds": time.perf_counter() - t0,
        }
        print(
            " ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
            ),
            flush=True,
        )
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
