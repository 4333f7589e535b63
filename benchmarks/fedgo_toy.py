"""FedGO's toy example (paper 001, Fig. 1 and App. E.1): four Gaussians, four clients.

Jang, Park, Lee, ICML 2025, App. E.1: a mixture of four 2-D Gaussians (covariance 3 I, means
(+-4, +-4), 300 points each; red in quadrants 1 and 3, blue in 2, green in 4). Client k holds 90%
of one Gaussian and 10 points of each other one (clients 1-4 own quadrants 3, 4, 2, 1:
:func:`fedgo_flwr.data.partition.component_partition` with the paper's owners). Each client trains a
3-layer MLP classifier (2 epochs, Adam 1e-3, batch 64) and a 3-layer MLP discriminator with its
own data as real and the server's 300 unlabeled points, uniform on [-12, 12]^2, as fake
(1 epoch, RMSprop 5e-5, batch 64). So the reference of the discriminators is the server's data,
not a generator: the odds estimate p_k / p_server, and the uniform reference cancels in the
weights (FedGO Eq. 9). The server model starts from the parameter average (FedAvg) and is
distilled for 2 epochs (Adam 1e-3, batch 64) on the clients' 1,200 points pseudo-labelled by
the weighted ensemble (App. E.1: "the global dataset is pseudo-labeled").

Rows: ``fedavg`` (the parameter average), and one distilled server model per weighting of
:mod:`fedgo_flwr.weighting`: ``uniform`` (FedDF), ``variance`` (Fed-ET), ``entropy``
(FedHKT/FedDS), ``domain`` (DaFKD), ``fedgo`` (the paper's double sigmoid, odds in (1, e)) and
``fedgo_exact`` (single sigmoid, odds exp(z)); ``--clip C`` adds ``fedgo_exact_clip`` (log-odds
clamped to [-C, C]: ``weighting_params.fedgo.clip``). ``--byzantine M`` makes M seeded clients'
discriminators output their maximum everywhere (App. F.8; :func:`fedgo_flwr.weighting.
make_byzantine`). Per row and seed: the server model's test accuracy on 1,200 fresh points of
the mixture (true labels), the weighted ensemble's test accuracy, and the owner share: the mean
weight the ensemble puts, on a test point, on the client that owns the point's Gaussian (0.25
for uniform weights; near 0.9 is what the paper's Fig. 1 shows FedGO achieving).

``--disc-epochs``/``--disc-lr``: the paper's budget (1 epoch at 5e-5, five RMSprop steps per
client) leaves the discriminators nearly untrained; more shows what an informative
discriminator does. Writes ``table.md``, ``results.json`` and, for the first seed,
``boundaries.png`` (decision regions in RGB, one panel per row, the oracle boundary in black)
under ``--out``. Seconds on a CPU for ten seeds.

    .venv/bin/python -m benchmarks.fedgo_toy --seeds 0 1 2 3 4 5 6 7 8 9 \\
        --out benchmarks/results/fedgo-toy
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from fedgo_flwr.config.experiment import TrainConfig
from fedgo_flwr.data import (
    FOUR_GAUSSIANS_PAPER_OWNERS,
    ArrayDataset,
    four_gaussians_oracle_labels,
    four_gaussians_server_data,
    make_four_gaussians,
)
from fedgo_flwr.data.partition import component_partition
from fedgo_flwr.gan import build_discriminator
from fedgo_flwr.learning.distill import DistillConfig, distill
from fedgo_flwr.learning.training import predict_logits, train_local
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.runtime.fileio import atomic_write_text, strict_json
from fedgo_flwr.runtime.rng import derive_seed, make_rng
from fedgo_flwr.weighting import (
    WeightingInputs,
    byzantine_clients,
    compute_weights,
    ensemble_logits,
    make_byzantine,
    pseudo_labels,
)

CPU = torch.device("cpu")
HALF_WIDTH = 12.0
WEIGHTINGS: dict[str, tuple[str, dict[str, object]]] = {
    "uniform": ("uniform", {}),
    "variance": ("variance", {}),
    "entropy": ("entropy", {}),
    "domain": ("domain", {}),
    "fedgo": ("fedgo", {"disc_mode": "double_sigmoid"}),
    "fedgo_exact": ("fedgo", {"disc_mode": "sigmoid"}),
}
"""Row name -> (weighting method, its parameters)."""
LABELS = {
    "client": "one client's model (mean)",
    "fedavg": "FedAvg (parameter average)",
    "uniform": "FedDF (uniform)",
    "variance": "Fed-ET (variance)",
    "entropy": "FedHKT/FedDS (entropy)",
    "domain": "DaFKD (domain-aware)",
    "fedgo": "FedGO (double sigmoid, paper)",
    "fedgo_exact": "FedGO (exact odds)",
    "fedgo_exact_clip": "FedGO (exact odds, clip {clip:g})",
}


def train_discriminator_vs_server(
    disc: nn.Module,
    real: Tensor,
    fake: Tensor,
    epochs: int,
    lr: float,
    batch_size: int,
    rng: torch.Generator,
) -> None:
    """App. E.1: real = the client's points, fake = the server's uniform points; RMSprop on
    the vanilla GAN loss, one fake batch (drawn from the server set) per real batch."""
    opt = torch.optim.RMSprop(disc.parameters(), lr=lr)
    bce = nn.functional.binary_cross_entropy_with_logits
    for _ in range(epochs):
        order = torch.randperm(len(real), generator=rng)
        for start in range(0, len(real), batch_size):
            xr = real[order[start : start + batch_size]]
            xf = fake[torch.randint(len(fake), (len(xr),), generator=rng)]
            zr, zf = disc(xr), disc(xf)
            loss = bce(zr, torch.ones_like(zr)) + bce(zf, torch.zeros_like(zf))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def average(models: Sequence[nn.Module], sizes: Sequence[int]) -> dict[str, Tensor]:
    """The n_k-weighted parameter average (FedAvg)."""
    total = float(sum(sizes))
    states = [m.state_dict() for m in models]
    return {
        key: sum(s[key] * (n / total) for s, n in zip(states, sizes, strict=True))
        for key in states[0]
    }


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, object]:
    """One seeded run of every row; returns their accuracies, owner shares and the models."""
    x, y, comp = make_four_gaussians("train")
    x_test, y_test, comp_test = make_four_gaussians("test")
    owners = FOUR_GAUSSIANS_PAPER_OWNERS
    part = component_partition(comp, owners=owners, seed=seed)
    server = torch.as_tensor(four_gaussians_server_data(300, HALF_WIDTH).x)
    train = ArrayDataset(x, y, num_classes=3, flip=False)
    test = ArrayDataset(x_test, y_test, num_classes=3, flip=False)
    k = len(part.clients)
    sizes = [len(idx) for idx in part.clients]
    local = TrainConfig(local_epochs=2, batch_size=64, optimizer="adam", lr=1e-3)

    classifiers, discs = [], []
    for client, idx in enumerate(part.clients):
        torch.manual_seed(derive_seed(seed, "toy-init", client))
        model = build_model("mlp", (2,), 3)
        train_local(
            model,
            train.subset(idx),
            local,
            rng=make_rng(seed, "toy-train", client),
            device=CPU,
            augment=False,
        )
        disc = build_discriminator("mlp", (2,), seed=derive_seed(seed, "toy-disc", client))
        train_discriminator_vs_server(
            disc,
            torch.as_tensor(x[idx]),
            server,
            args.disc_epochs,
            args.disc_lr,
            64,
            make_rng(seed, "toy-disc-train", client),
        )
        classifiers.append(model.eval())
        discs.append(disc.eval())

    liars = byzantine_clients(seed, k, args.byzantine)

    def inputs(points: np.ndarray) -> WeightingInputs:
        pts = torch.as_tensor(points)
        with torch.no_grad():
            logits = torch.stack([m(pts) for m in classifiers])
            z = make_byzantine(torch.stack([d(pts) for d in discs]), liars)
        return WeightingInputs(logits, torch.tensor(sizes, dtype=torch.float64), z)

    rows = dict(WEIGHTINGS)
    if args.clip is not None:
        rows["fedgo_exact_clip"] = ("fedgo", {"disc_mode": "sigmoid", "clip": args.clip})
    on_train, on_test = inputs(x), inputs(x_test)
    owner_of = torch.as_tensor([owners.index(int(j)) for j in comp_test])
    labels = torch.as_tensor(y_test)
    init = average(classifiers, sizes)

    def accuracy(model: nn.Module) -> float:
        pred = predict_logits(model, test, len(test), CPU).argmax(1)
        return float((pred == labels).float().mean())

    fedavg = build_model("mlp", (2,), 3)
    fedavg.load_state_dict(init)
    results: dict[str, dict[str, float]] = {
        "client": {"server": float(np.mean([accuracy(m) for m in classifiers]))},
        "fedavg": {"server": accuracy(fedavg)},
    }
    models: dict[str, nn.Module] = {"fedavg": fedavg}
    for row, (method, params) in rows.items():
        w_test = compute_weights(method, on_test, **params)
        mixed = ensemble_logits(on_test.logits, w_test)
        targets = pseudo_labels(on_train.logits, compute_weights(method, on_train, **params))
        student = build_model("mlp", (2,), 3)
        student.load_state_dict(init)
        distill(
            student,
            train,
            targets[None],
            DistillConfig(epochs=2, batch_size=64, lr=1e-3, lr_decay=False, augment=False),
            server_round=1,
            rng=make_rng(seed, "toy-distill", row),
            device=CPU,
        )
        models[row] = student.eval()
        results[row] = {
            "server": accuracy(student),
            "ensemble": float((mixed.argmax(1) == labels).float().mean()),
            "owner_share": float(w_test[owner_of, torch.arange(len(owner_of))].mean()),
        }
    return {"results": results, "models": models, "byzantine_clients": liars}


def boundaries_png(models: dict[str, nn.Module], labels: dict[str, str], path: Path) -> None:
    """Decision regions of every model (RGB = softmax of red, green, blue classes) with the
    oracle boundary (the axes) in black, one 200-pixel panel per model, titled."""
    from PIL import Image, ImageDraw  # noqa: PLC0415 - only for the picture (torchvision's)

    side, title = 200, 16
    grid = torch.linspace(-HALF_WIDTH, HALF_WIDTH, side)
    yy, xx = torch.meshgrid(grid.flip(0), grid, indexing="ij")
    points = torch.stack([xx.reshape(-1), yy.reshape(-1)], dim=1)
    canvas = Image.new("RGB", (side * len(models), side + title), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (name, model) in enumerate(models.items()):
        with torch.no_grad():
            p = torch.softmax(model(points), dim=1)  # classes: red, blue, green
        rgb = torch.stack([p[:, 0], p[:, 2], p[:, 1]], dim=1).reshape(side, side, 3)
        panel = Image.fromarray((rgb.numpy() * 255).round().astype(np.uint8), "RGB")
        canvas.paste(panel, (i * side, title))
        mid = side // 2
        draw.line([(i * side + mid, title), (i * side + mid, title + side)], fill="black")
        draw.line([(i * side, title + mid), ((i + 1) * side - 1, title + mid)], fill="black")
        draw.text((i * side + 3, 2), labels[name][:34], fill="black")
    canvas.save(path)


def oracle_accuracy() -> float:
    """Accuracy of the paper's oracle rule (the axes) on the test points."""
    x, y, _ = make_four_gaussians("test")
    return float((four_gaussians_oracle_labels(x) == y).mean())


def mean_sd(values: Sequence[float]) -> str:
    a = 100 * np.asarray(values, dtype=float)
    sd = a.std(ddof=1) if len(a) > 1 else 0.0
    return f"{a.mean():.1f} ± {sd:.1f}"


def table(per_seed: list[dict[str, object]], args: argparse.Namespace) -> str:
    rows = list(per_seed[0]["results"])
    out = [
        "# FedGO's toy example (paper 001, Fig. 1, App. E.1): benchmarks/fedgo_toy.py",
        "",
        f"Seeds {' '.join(str(s) for s in args.seeds)}; discriminators {args.disc_epochs} "
        f"epoch(s) of RMSprop at lr {args.disc_lr:g} (paper: 1 at 5e-05); "
        f"Byzantine clients: {args.byzantine}"
        + (
            f" ({', '.join(str(r['byzantine_clients']) for r in per_seed)} per seed)"
            if args.byzantine
            else ""
        )
        + f". Test accuracy % (1,200 fresh points, true labels; the oracle rule, the axes, "
        f"scores {100 * oracle_accuracy():.1f}%), mean ± sd over seeds; owner share: mean "
        "weight on the client holding 90% of the test point's Gaussian (uniform: 0.25).",
        "",
        "| method | server model | weighted ensemble | owner share |",
        "|---|---|---|---|",
    ]
    for row in rows:
        vals = [r["results"][row] for r in per_seed]
        server = mean_sd([v["server"] for v in vals])
        if "ensemble" in vals[0]:
            ens = mean_sd([v["ensemble"] for v in vals])
            share = f"{np.mean([v['owner_share'] for v in vals]):.2f}"
        else:
            ens = share = "–"
        out.append(f"| {LABELS[row].format(clip=args.clip or 0)} | {server} | {ens} | {share} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(10)))
    parser.add_argument("--disc-epochs", type=int, default=1)
    parser.add_argument("--disc-lr", type=float, default=5e-5)
    parser.add_argument("--byzantine", type=int, default=0)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not 0 <= args.byzantine <= 4:
        parser.error("--byzantine: 0 to 4 of the 4 clients")
    if args.clip is not None and not (math.isfinite(args.clip) and args.clip > 0):
        parser.error("--clip must be a finite number > 0")
    start = time.perf_counter()
    per_seed = [run_seed(seed, args) for seed in args.seeds]
    args.out.mkdir(parents=True, exist_ok=True)
    boundaries_png(
        per_seed[0]["models"],
        {k: v.format(clip=args.clip or 0) for k, v in LABELS.items()},
        args.out / "boundaries.png",
    )
    atomic_write_text(args.out / "table.md", table(per_seed, args))
    record = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seconds": time.perf_counter() - start,
        "per_seed": [
            {"seed": s, "byzantine_clients": r["byzantine_clients"], "results": r["results"]}
            for s, r in zip(args.seeds, per_seed, strict=True)
        ],
    }
    record["args"]["out"] = args.out.name
    (args.out / "results.json").write_text(strict_json(record, name="results.json", indent=1))
    print((args.out / "table.md").read_text(), end="")


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny MLPs: threads only add overhead
    main()
