"""How far do FedGO's odds move Co-Boosting + FedGO's one-shot ensemble from uniform?

In ``coboosting_fedgo`` (``strategies/coboosting_fedgo.py``) every client trains a
discriminator against the server's generator, untrained in the one-shot preset, and the
ensemble weighs client ``k`` on image ``x`` by ``n_k Phi_k(x) / sum_i n_i Phi_i(x)`` (FedGO,
Jang et al. ICML 2025, Eq. 9). With the paper's double sigmoid (App. E.2, the strategy's
default ``disc_mode``) the odds are ``exp(sigmoid(z))``, inside ``(1, e)``; FedGO's Def. 3.5
odds (``disc_mode: sigmoid``) are ``exp(z)``. This script runs the preset's one round per seed
(``strategy.epochs=1``: the uploads do not depend on the server's epochs), loads the uploaded
models and discriminators (``client_models.pt``), and measures on the test images:

- each discriminator's ``D_k(x) = sigmoid(z)`` (median over images, and the share above 0.99),
- for each ``disc_mode``: the mean over images of the largest weight (uniform: ``1/N``) and
  the weighted ensemble's test accuracy, beside the uniform ensemble's.

    python -m benchmarks.oneshot_odds --seeds 0 1 2 [--config ...] [--out ...] [k=v ...]

Writes ``table.md`` and ``summary.json`` in ``--out``; the runs go to ``outputs/oneshot-odds/``
(a seed whose run is there is not run again).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.sweep import RunFailed, run_command
from fedgo_flwr.datafree import fedgo_multipliers, weighted_logits
from fedgo_flwr.learning.task import load_bundle, new_model
from fedgo_flwr.learning.training import predict_logits
from fedgo_flwr.runtime.fileio import atomic_write_text
from fedgo_flwr.weighting import DISC_MODES
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "outputs" / "oneshot-odds"
CONFIG = "conf/bench/coboosting-cifar10-cpu.yaml"
BATCH = 500


def run_seed(config: str, seed: int, overrides: Sequence[str]) -> Path:
    """The preset's one round for ``seed`` (kept: not run again); its folder. The run's output
    goes to its ``run.log`` (:func:`benchmarks.sweep.run_command`)."""
    out = SCRATCH / f"seed{seed}"
    if (out / "summary.json").is_file() and (out / "client_models.pt").is_file():
        return out
    cmd = [sys.executable, "-m", "fedgo_app.inprocess", config,
           "strategy.name=coboosting_fedgo", f"seed={seed}", "strategy.epochs=1", *overrides,
           f"output_dir={out}", "overwrite=true"]  # fmt: skip
    try:
        run_command(cmd, out / "run.log")
    except RunFailed as exc:
        sys.exit(str(exc))
    return out


def _arrays(state: dict) -> dict[str, torch.Tensor]:
    """A saved state (tensors or arrays) as tensors."""
    return {k: torch.as_tensor(v) for k, v in state.items()}


def measure(run: Path) -> dict:
    """The odds' spread and the ensembles' test accuracy for the uploads of ``run``."""
    cfg = load_experiment(str(run / "config.yaml"), [])
    bundle = load_bundle(cfg.data)
    uploads = torch.load(run / "client_models.pt", weights_only=False)
    clients = sorted(uploads["clients"].items(), key=lambda kv: int(kv[0]))
    disc_cfg, shape = cfg.strategy.params.discriminator, bundle.train.input_shape
    z, logits, sizes = [], [], []
    for _, upload in clients:
        disc = disc_cfg.build(shape, seed=0)
        disc.load_state_dict(_arrays(upload["extra"]))
        z.append(predict_logits(disc.eval(), bundle.test, BATCH, "cpu").float().view(-1))
        model = new_model(cfg, bundle)
        model.load_state_dict(_arrays(upload["state"]))
        logits.append(predict_logits(model.eval(), bundle.test, BATCH, "cpu").float())
        sizes.append(upload["size"])
    z_all, teacher = torch.stack(z), torch.stack(logits)
    labels = torch.as_tensor(bundle.test.y, dtype=torch.long)
    n = len(sizes)

    def accuracy(weights: torch.Tensor) -> float:
        return float((weighted_logits(teacher, weights).argmax(1) == labels).float().mean())

    d = torch.sigmoid(z_all)
    out = {
        "clients": n,
        "d_median": [round(float(v), 4) for v in d.median(1).values],
        "d_above_099": float((d > 0.99).float().mean()),
        "uniform": accuracy(torch.full((n,), 1.0 / n)),
    }
    for mode in DISC_MODES:
        w = fedgo_multipliers(z_all, torch.tensor(sizes, dtype=torch.float32), mode)
        out[mode] = {"max_weight": float(w.max(0).values.mean()), "accuracy": accuracy(w)}
    return out


def table(results: dict[int, dict]) -> str:
    head = "| seed | D_k(x) median (range over clients) | D > 0.99 | largest weight: " + " / ".join(
        DISC_MODES
    )
    lines = [
        "# Co-Boosting + FedGO: how far the odds move the one-shot ensemble (oneshot_odds.py)",
        "",
        "Test images; uniform weights give each of the N clients 1/N. Accuracy %.",
        "",
        head + " | ensemble accuracy: uniform / " + " / ".join(DISC_MODES) + " |",
        "|---|---|---|---|---|",
    ]
    for seed, r in sorted(results.items()):
        d = r["d_median"]
        med = f"{statistics.median(d):.3f} ({min(d):.3f}-{max(d):.3f})"
        weights = " / ".join(f"{r[m]['max_weight']:.4f}" for m in DISC_MODES)
        accs = " / ".join(f"{100 * r[m]['accuracy']:.2f}" for m in DISC_MODES)
        lines.append(
            f"| {seed} | {med} | {100 * r['d_above_099']:.1f}% | {weights} (1/N = "
            f"{1 / r['clients']:.4f}) | {100 * r['uniform']:.2f} / {accs} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/oneshot-odds")
    parser.add_argument("overrides", nargs="*", help="k=v config overrides for every run")
    args = parser.parse_args(argv)
    results = {}
    for seed in args.seeds:
        results[seed] = measure(run_seed(args.config, seed, args.overrides))
        print(f"oneshot_odds: seed {seed}: {results[seed]}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"config": args.config, "overrides": args.overrides, "seeds": results}
    (args.out / "summary.json").write_text(json.dumps(payload, indent=1) + "\n")
    text = table(results)
    atomic_write_text(args.out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
