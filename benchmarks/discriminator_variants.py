"""Which client discriminators make FedGO's weights informative? Every variant on the same
client models.

FedGO's weight (Jang, Park, Lee, ICML 2025, Eq. 9) is w_k(x) = n_k p_k(x) / sum_i n_i p_i(x),
estimated with discriminator odds Phi_k = p_k / p_ref. The paper's reference p_ref is its
generator; any reference that covers the clients' data cancels in w_k. This script trains the
K clients of one seed once (one round of local training from the seeded initial model, as in
round 1 of a run), keeps their logits on the server set and on the test split, and then, for
each discriminator variant (the reference -- generator, server images, a mixture -- and the
regularisers of ``strategy.discriminator``), trains all K discriminators through the project's
own client code (``clients/fedgo.py``) and measures, for each weighting:

- ``pl``: pseudo-label accuracy of the weighted ensemble on the server set (what distillation
  learns from), and the share of the uniform -> label-oracle gap it closes;
- ``test``: test accuracy of the weighted ensemble (images no discriminator has seen);
- ``owner``: the weight on clients that hold the image's class (test split), in %;
- the discriminators' own-vs-unseen-class AUC (``discriminator_separation.py``) on the test
  split and the server set, their mean sigmoid, and the cost: discriminator training time
  (sum over the clients), the reference bytes sent to each client, logits time.

With ``reference_size`` below the server share (variants ``server-half`` and
``server-sn-30-half``, the latter ``fedgo_server``'s discriminators: spectral norm, the paper's
30 epochs), the pseudo-label accuracy is also split into the reference images (every
discriminator saw them as negatives) and the rest, and each discriminator's ROC AUC of its
logits on the other server images against the reference images is reported
(``memo_auc``: 0.5 when it cannot tell the negatives it trained on from fresh images of the
same distribution; above 0.5 when it scores its own negatives lower, i.e. memorises them).
Those negatives are the images the server later pseudo-labels.

    .venv/bin/python -m benchmarks.discriminator_variants --seeds 0 \
        [--variants paper server ...] [--out benchmarks/results/discriminator-variants]

A variant may also set the generator's budget (``generator_steps``: FedGO as published trains
its discriminators against a generator trained far longer than the config's 200 steps): every
budget's generator comes from one training to the largest (the generator after step ``k`` is that
of a ``k``-step run), with a grid of 64 samples of each in ``--out`` (``generator-<k>.png``). The
weightings ``fedgo_odds`` and ``fedgo_single_odds`` are FedGO's without Eq. (9)'s ``n_k``
(``weighting_params.fedgo.sizes: false``): whether ``n_k`` is what holds FedGO back at this scale.

Client logits, the generators and each variant's discriminator logits are cached under
``--work`` (``outputs/bench/discriminator-variants``), the reports in ``--out``: a rerun skips
what is done (delete a report to recompute it from the cached logits, e.g. after adding a
weighting). ``--table-only`` rebuilds ``table.md`` from the saved reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from sklearn.metrics import roc_auc_score
from torchvision.utils import save_image

from benchmarks.discriminator_separation import own_vs_unseen_aucs, weight_on_knowing
from clients.base import ClientJob
from clients.fedgo import FedGOClient
from fedgo_flwr.gan import discriminator_logits, sample
from fedgo_flwr.gan.settings import GanConfig
from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
from fedgo_flwr.learning.training import get_device, predict_logits, train_local
from fedgo_flwr.protocol.fedgo import GENERATOR_KEY, REFERENCE_KEY
from fedgo_flwr.runtime.fileio import atomic_write_text, strict_json
from fedgo_flwr.runtime.messages import ARRAYS, to_record
from fedgo_flwr.runtime.rng import make_rng
from fedgo_flwr.weighting import (
    WeightingInputs,
    byzantine_clients,
    cap_weights,
    compute_weights,
    ensemble_logits,
    make_byzantine,
)
from strategies import load_experiment
from strategies._prefl import reference_indices, seeded_generator, train_generator

ROOT = Path(__file__).resolve().parent.parent

VARIANTS: dict[str, dict[str, object]] = {
    "paper": {},  # generator reference, BCE on sigmoid(z) (this project's default)
    "paper-double": {"loss": "double_sigmoid"},  # the paper's literal two-sigmoid output
    "server": {"reference": "server"},
    "server-half": {"reference": "server", "reference_size": 2500},
    "mixture": {"reference": "mixture"},
    "server-sn": {"reference": "server", "spectral_norm": True},
    "server-ls": {"reference": "server", "label_smoothing": 0.1},
    "server-es": {"reference": "server", "epochs": 30, "patience": 3},
    "server-30": {"reference": "server", "epochs": 30},  # the paper's 30 epochs
    "server-sn-30": {"reference": "server", "spectral_norm": True, "epochs": 30},
    "server-sn-30-half": {
        "reference": "server",
        "spectral_norm": True,
        "epochs": 30,
        "reference_size": 2500,
    },
    # FedGO as published (paper 001, App. E.2): 30 epochs, trained and read through the double
    # sigmoid, against generators trained longer than the config's 200 steps
    "paper-double-30": {"loss": "double_sigmoid", "epochs": 30},
    "paper-double-30-g1000": {"loss": "double_sigmoid", "epochs": 30, "generator_steps": 1000},
    "paper-double-30-g2000": {"loss": "double_sigmoid", "epochs": 30, "generator_steps": 2000},
}
"""Overrides of ``strategy.discriminator`` (the config's own section otherwise); the key
``generator_steps`` sets the generator's steps instead (``strategy.generator.steps``)."""

WEIGHTINGS: dict[str, tuple[str, dict[str, object]]] = {
    "uniform": ("uniform", {}),
    "n_k": ("data_size", {}),
    "fedgo": ("fedgo", {}),
    "fedgo_single": ("fedgo", {"disc_mode": "sigmoid"}),
    "fedgo_single_t0.5": ("fedgo", {"disc_mode": "sigmoid", "temperature": 0.5}),
    "fedgo_single_t2": ("fedgo", {"disc_mode": "sigmoid", "temperature": 2.0}),
    "fedgo_single_clip1": ("fedgo", {"disc_mode": "sigmoid", "clip": 1.0}),
    "fedgo_single_clip2": ("fedgo", {"disc_mode": "sigmoid", "clip": 2.0}),
    "fedgo_odds": ("fedgo", {"sizes": False}),  # Eq. (9) without n_k (issue 51's ablation)
    "fedgo_single_odds": ("fedgo", {"disc_mode": "sigmoid", "sizes": False}),
    "domain": ("domain", {}),
    "oracle": ("oracle", {}),
}
"""Columns: ``name -> (weighting method, parameters)``."""

BYZANTINE = (5, 10)
"""Byzantine clients (FedGO App. F.8) simulated on the same discriminators: 25% and 50% of 20."""

CAPPED = {"fedgo_single_cap0.1": ("fedgo_single", 0.1)}
"""``name -> (weighting, weight_cap)``: the cap defence (``strategy.weight_cap``)."""

BYZANTINE_WEIGHTINGS = (
    "n_k",
    "fedgo",
    "fedgo_single",
    "fedgo_single_clip1",
    "fedgo_single_clip2",
    "fedgo_single_cap0.1",
)

DISC_WEIGHTINGS = [k for k, (m, _) in WEIGHTINGS.items() if m in ("fedgo", "domain")]


def setup(config: Path, seed: int, overrides: list[str]):
    cfg = load_experiment(config, [f"seed={seed}", *overrides])
    bundle = load_bundle(cfg.data)
    partition = make_partition(cfg)
    return cfg, bundle, partition


def client_logits(cfg, bundle, partition, work: Path) -> dict[str, torch.Tensor]:
    """Each client trained once from the seeded initial model; its logits on the server set
    and the test split (cached)."""
    path = work / "clients.pt"
    if path.is_file():
        return torch.load(path)
    device = get_device(cfg.device)
    server = bundle.train.subset(partition.server)
    out: dict[str, list[torch.Tensor]] = {"server": [], "test": []}
    t0 = time.perf_counter()
    for k, idx in enumerate(partition.clients):
        model = new_model(cfg, bundle)
        train_local(
            model,
            bundle.train.subset(idx),
            cfg.train,
            rng=make_rng(cfg.seed, "variants-client", k),
            device=device,
            augment=cfg.data.augment,
        )
        out["server"].append(predict_logits(model, server, cfg.eval.batch_size, device))
        out["test"].append(predict_logits(model, bundle.test, cfg.eval.batch_size, device))
        print(f"client {k}: {time.perf_counter() - t0:.0f} s", flush=True)
    result = {k: torch.stack(v) for k, v in out.items()}
    result["seconds"] = torch.tensor(time.perf_counter() - t0)
    torch.save(result, path)
    return result


def _generator_file(cfg, steps: int) -> str:
    default = cfg.strategy.params.generator.steps
    return "generator.pt" if steps == default else f"generator-{steps}.pt"


def generators_for(
    cfg, bundle, partition, work: Path, steps: list[int], grids: Path | None = None
) -> dict[int, tuple[torch.nn.Module, float]]:
    """The config's G1 generator (WGAN-GP on the server share) after each of ``steps``
    generator steps, cached: one training to the largest, keeping each smaller budget's
    generator on the way (bit for bit the generator of a run with that budget,
    :func:`fedgo_flwr.gan.train_wgan_gp`'s ``on_step``) and the seconds it took to get there.
    With ``grids``, a grid of 64 samples of each (fixed latent codes) as
    ``grids/generator-<steps>.png``."""
    gp = cfg.strategy.params.generator
    shape = bundle.train.input_shape
    out: dict[int, tuple[torch.nn.Module, float]] = {}
    missing = sorted(k for k in set(steps) if not (work / _generator_file(cfg, k)).is_file())
    if missing:
        generator = seeded_generator(cfg.seed, gp, shape)
        t0 = time.perf_counter()

        def keep(done: int) -> None:
            if done in missing:
                state = {k: v.detach().cpu().clone() for k, v in generator.state_dict().items()}
                seconds = time.perf_counter() - t0
                torch.save({"state": state, "seconds": seconds}, work / _generator_file(cfg, done))

        if 0 in missing:
            keep(0)
        if missing[-1] > 0:
            server = bundle.train.subset(partition.server)
            device = get_device(cfg.device)
            train_generator(generator, cfg, server, device, shape, steps=missing[-1], on_step=keep)
    for k in sorted(set(steps)):
        generator = seeded_generator(cfg.seed, gp, shape)
        saved = torch.load(work / _generator_file(cfg, k))
        generator.load_state_dict(saved["state"])
        out[k] = (generator, float(saved["seconds"]))
        if grids is not None:
            grid = grids / f"generator-{k}.png"
            if not grid.is_file():
                x = sample(generator, 64, rng=make_rng(0, "sample-grid"))
                save_image(x * 0.5 + 0.5, grid, nrow=8, padding=1)
    return out


def discriminators(cfg, bundle, partition, generator):
    """All K discriminators of one variant (``cfg``), trained by the FedGO client's own code
    from what the server would send (``strategies/_prefl.py``)."""
    params = cfg.strategy.params
    dp = params.discriminator
    gan = GanConfig(generator=params.generator, discriminator=dp)
    content = RecordDict()
    if dp.uses_generator:
        content[GENERATOR_KEY] = ArrayRecord(generator.state_dict())
    sent = 0
    if dp.uses_server_images:
        server = bundle.train.subset(partition.server)
        images = np.asarray(server.x[reference_indices(len(server), dp.reference_size, cfg.seed)])
        content[REFERENCE_KEY] = to_record({REFERENCE_KEY: images})
        sent = int(images.nbytes)
    device = get_device(cfg.device)
    discs, seconds = {}, 0.0
    for k, idx in enumerate(partition.clients):
        job = ClientJob(
            cfg=cfg,
            params=gan,
            partition_id=k,
            server_round=0,
            data=bundle.train.subset(idx),
            device=device,
            rng=make_rng(cfg.seed, "unused", k),
            content=content,
            state=RecordDict(),
        )
        records, metrics = FedGOClient().train_discriminator(job)
        disc = dp.build(bundle.train.input_shape)
        disc.load_state_dict(records[ARRAYS].to_torch_state_dict())
        discs[k] = disc
        seconds += metrics["disc_seconds"]
    return discs, seconds, sent


def variant_logits(cfg, bundle, partition, discs) -> dict[str, torch.Tensor]:
    """The K discriminators' raw logits ``(K, N)`` on the server set and the test split."""
    server = bundle.train.subset(partition.server)
    device = get_device(cfg.device)
    t0 = time.perf_counter()
    z = {
        "server": discriminator_logits(discs, server, device=device)[:, 0],
        "test": discriminator_logits(discs, bundle.test, device=device)[:, 0],
    }
    z["seconds"] = torch.tensor(time.perf_counter() - t0)
    return z


def evaluate_variant(cfg, bundle, partition, logits, z) -> dict:
    """The report of one variant from its discriminators' logits ``z``."""
    server = bundle.train.subset(partition.server)
    counts = torch.as_tensor(
        np.asarray(partition.histogram(bundle.train.y, bundle.train.num_classes)),
        dtype=torch.float64,
    )
    sizes = counts.sum(1)
    labels = {"server": torch.as_tensor(server.y), "test": torch.as_tensor(bundle.test.y)}
    dp = cfg.strategy.params.discriminator
    seen = np.zeros(len(server), dtype=bool)
    seen[reference_indices(len(server), dp.reference_size, cfg.seed)] = True
    report: dict[str, object] = {"logits_seconds": float(z["seconds"])}
    for split in ("server", "test"):
        y = labels[split]
        aucs = own_vs_unseen_aucs(z[split], y, counts)
        report[f"auc_{split}"] = statistics.mean(aucs)
        report[f"mean_sigmoid_{split}"] = torch.sigmoid(z[split]).mean().item()
        inputs = WeightingInputs(
            logits=logits[split],
            num_examples=sizes,
            disc_logits=z[split],
            labels=y,
            class_counts=counts,
        )
        for name, (method, params) in WEIGHTINGS.items():
            w = compute_weights(method, inputs, **params)
            correct = ensemble_logits(logits[split], w).argmax(1) == y
            key = "pl" if split == "server" else "test"
            report[f"{key}_{name}"] = 100 * correct.double().mean().item()
            report[f"owner_{split}_{name}"] = weight_on_knowing(w, y, counts)
            if split == "server" and dp.uses_server_images and not seen.all():
                mask = torch.from_numpy(seen)
                report[f"pl_seen_{name}"] = 100 * correct[mask].double().mean().item()
                report[f"pl_unseen_{name}"] = 100 * correct[~mask].double().mean().item()
        if split == "server":
            report.update(byzantine_report(cfg.seed, logits[split], inputs, y))
            if dp.uses_server_images and not seen.all():
                memo = memorisation_aucs(z[split], torch.from_numpy(seen))
                report["memo_auc"] = memo
    return report


def memorisation_aucs(z: torch.Tensor, sent: torch.Tensor) -> list[float]:
    """Per discriminator (rows of ``z``, logits ``(K, N)`` on the server images), the ROC AUC
    of its logits on the images not sent (label 1) against the images sent as its negatives
    (label 0). A discriminator that memorised its negatives scores them lower: AUC > 0.5."""
    unsent = (~sent).numpy().astype(int)
    return [float(roc_auc_score(unsent, row.numpy())) for row in z]


def byzantine_report(
    seed: int, logits: torch.Tensor, inputs: WeightingInputs, y: torch.Tensor
) -> dict[str, float]:
    """Pseudo-label accuracy with :data:`BYZANTINE` seeded clients' discriminators at their
    maximum (``strategy.byzantine``), for each of :data:`BYZANTINE_WEIGHTINGS`."""
    out: dict[str, float] = {}
    k = len(logits)
    for m in (m for m in BYZANTINE if m <= k):
        liars = byzantine_clients(seed, k, m)
        lying = dataclasses.replace(inputs, disc_logits=make_byzantine(inputs.disc_logits, liars))
        for name in BYZANTINE_WEIGHTINGS:
            base, cap = CAPPED.get(name, (name, None))
            method, params = WEIGHTINGS[base]
            w = compute_weights(method, lying, **params)
            if cap is not None:
                w = cap_weights(w, cap)
            right = ensemble_logits(logits, w).argmax(1) == y
            out[f"byz{m}_pl_{name}"] = 100 * right.double().mean().item()
    return out


def run_seed(args: argparse.Namespace, seed: int) -> None:
    overrides = [f"data.test_subset={args.test_subset}", *args.override]
    cfg, bundle, partition = setup(args.config, seed, overrides)
    work = args.work / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    out = args.out / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    logits = client_logits(cfg, bundle, partition, work)
    default_steps = cfg.strategy.params.generator.steps
    budgets = [_generator_steps(VARIANTS[n], default_steps) for n in args.variants]
    generators = generators_for(cfg, bundle, partition, work, [default_steps, *budgets], out)
    gen_seconds = generators[default_steps][1]
    (out / "clients.json").write_text(
        strict_json(
            {
                "client_train_seconds": float(logits["seconds"]),
                "generator_seconds": gen_seconds,
                "clients": len(partition.clients),
                "server_images": len(partition.server),
                "test_images": len(bundle.test),
            },
            name="clients.json",
            indent=2,
        )
    )
    for name in args.variants:
        path = out / f"{name}.json"
        if path.is_file():
            continue
        variant = VARIANTS[name]
        steps = _generator_steps(variant, default_steps)
        generator = generators[steps][0]
        disc = {k: v for k, v in variant.items() if k != "generator_steps"}
        vcfg, _, _ = setup(
            args.config,
            seed,
            [
                *overrides,
                f"strategy.generator.steps={steps}",
                *(f"strategy.discriminator.{k}={v}" for k, v in disc.items()),
            ],
        )
        t0 = time.perf_counter()
        cached = work / f"{name}-logits.pt"
        if cached.is_file():  # the discriminators' logits of an earlier run of this script
            z = torch.load(cached)
        else:
            discs, disc_seconds, sent = discriminators(vcfg, bundle, partition, generator)
            z = variant_logits(vcfg, bundle, partition, discs)
            z["disc_train_seconds"] = torch.tensor(disc_seconds)
            z["reference_bytes_per_client"] = torch.tensor(sent)
            torch.save(z, cached)
        report = {
            "variant": name,
            "overrides": variant,
            "generator_steps": steps,
            "generator_seconds": generators[steps][1],
            "disc_train_seconds": float(z["disc_train_seconds"]),
            "reference_bytes_per_client": int(z["reference_bytes_per_client"]),
            **evaluate_variant(vcfg, bundle, partition, logits, z),
        }
        report["wall_seconds"] = time.perf_counter() - t0
        path.write_text(strict_json(report, name=path.name, indent=2) + "\n")
        print(f"seed {seed} {name}: {time.perf_counter() - t0:.0f} s", flush=True)


def _generator_steps(variant: dict[str, object], default: int) -> int:
    steps = variant.get("generator_steps", default)
    assert isinstance(steps, int)
    return steps


def _generator_cell(reports: list[dict]) -> str:
    """The generator's steps and the seconds its training took (reports before 2026-12-04 do
    not record them: ``-``)."""
    steps = sorted(set(_values(reports, "generator_steps")))
    if not steps:
        return "-"
    return f"{', '.join(map(str, steps))} ({_mean(_values(reports, 'generator_seconds'), 0)})"


def _values(reports: list[dict], key: str) -> list:
    """``key``'s value in each report that has it (a weighting or figure added after a report
    was written is left out of that report's cells, not an error)."""
    return [r[key] for r in reports if key in r]


def _mean(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(out: Path) -> str:
    runs: dict[str, list[dict]] = {}
    for path in sorted(out.glob("seed*/*.json")):
        if path.name != "clients.json":
            report = json.loads(path.read_text())
            report["_seed"] = path.parent.name.removeprefix("seed")
            runs.setdefault(report["variant"], []).append(report)
    seeds = sorted({p.parent.name for p in out.glob("seed*/*.json")})

    def label(name: str) -> str:
        """The variant, and its seeds when it lacks some of the table's: a row's mean is over
        the seeds it names, never read as the table's."""
        have = sorted(r["_seed"] for r in runs[name])
        return name if len(have) == len(seeds) else f"{name} (seed {', '.join(have)} only)"

    lines = [
        "# Discriminator variants on the same client models",
        "",
        f"Seeds: {', '.join(s.removeprefix('seed') for s in seeds)} (mean ± sd where more "
        "than one). Written by `benchmarks/discriminator_variants.py --table-only`.",
        "",
        "## Pseudo-label accuracy on the server set (%), per weighting",
        "",
        "| variant | " + " | ".join(WEIGHTINGS) + " | gap closed by fedgo / best |",
        "|---|" + "---|" * (len(WEIGHTINGS) + 1),
    ]
    for name in VARIANTS:
        if name not in runs:
            continue
        rs = runs[name]
        cells = [_mean(_values(rs, f"pl_{w}")) for w in WEIGHTINGS]
        gaps, best = [], []
        for r in rs:
            gap = r["pl_oracle"] - r["pl_uniform"]
            gaps.append(100 * (r["pl_fedgo"] - r["pl_uniform"]) / gap)
            top = max(v for w in DISC_WEIGHTINGS for v in _values([r], f"pl_{w}"))
            best.append(100 * (top - r["pl_uniform"]) / gap)
        lines.append(
            f"| {label(name)} | " + " | ".join(cells) + f" | {_mean(gaps)} / {_mean(best)} % |"
        )
    lines += [
        "",
        "## Test accuracy of the weighted ensemble (%), per weighting",
        "",
        "| variant | " + " | ".join(WEIGHTINGS) + " |",
        "|---|" + "---|" * len(WEIGHTINGS),
    ]
    for name in VARIANTS:
        if name in runs:
            cells = [_mean(_values(runs[name], f"test_{w}")) for w in WEIGHTINGS]
            lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Discriminators: separation, weight on the clients that hold the class, cost",
        "",
        "| variant | AUC test | AUC server | owner % test: n_k / fedgo / single / single T 0.5 | "
        "mean sigmoid test | disc train s | reference MB per client | logits s | "
        "generator steps (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in VARIANTS:
        if name not in runs:
            continue
        rs = runs[name]
        owner = " / ".join(
            _mean([r[f"owner_test_{w}"] for r in rs])
            for w in ("n_k", "fedgo", "fedgo_single", "fedgo_single_t0.5")
        )
        auc_t = _mean([r["auc_test"] for r in rs], 3)
        auc_s = _mean([r["auc_server"] for r in rs], 3)
        lines.append(
            f"| {label(name)} | {auc_t} | {auc_s} | {owner} | "
            f"{_mean([r['mean_sigmoid_test'] for r in rs], 2)} | "
            f"{_mean([r['disc_train_seconds'] for r in rs])} | "
            f"{statistics.mean(r['reference_bytes_per_client'] for r in rs) / 1e6:.1f} | "
            f"{_mean([r['logits_seconds'] for r in rs])} | {_generator_cell(rs)} |"
        )
    byz = [n for n in VARIANTS if n in runs and f"byz{BYZANTINE[0]}_pl_fedgo" in runs[n][0]]
    if byz:
        heads = [f"{w}, {m} Byzantine" for m in BYZANTINE for w in BYZANTINE_WEIGHTINGS]
        lines += [
            "",
            "## Byzantine discriminators (App. F.8): pseudo-label accuracy on the server set (%)",
            "",
            "The same discriminators, with the seeded Byzantine clients' logits set to their "
            "maximum everywhere (`strategy.byzantine`); `clip1`, `clip2`: "
            "`weighting_params.fedgo.clip` 1, 2; `cap0.1`: `strategy.weight_cap` 0.1.",
            "",
            "| variant | " + " | ".join(heads) + " |",
            "|---|" + "---|" * len(heads),
        ]
        for name in byz:
            cells = [
                _mean([r[f"byz{m}_pl_{w}"] for r in runs[name]])
                for m in BYZANTINE
                for w in BYZANTINE_WEIGHTINGS
            ]
            lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    split = [n for n in VARIANTS if n in runs and "pl_seen_uniform" in runs[n][0]]
    if split:
        lines += [
            "",
            "## Memorised negatives: pseudo-label accuracy on reference vs other server images",
            "",
            "| variant | weighting | reference images | other images |",
            "|---|---|---|---|",
        ]
        for name in split:
            for w in ("uniform", "fedgo", "fedgo_single", "fedgo_single_t0.5"):
                rs = runs[name]
                seen = _mean([r[f"pl_seen_{w}"] for r in rs])
                unseen = _mean([r[f"pl_unseen_{w}"] for r in rs])
                lines.append(f"| {label(name)} | {w} | {seen} | {unseen} |")
        memo = [n for n in split if "memo_auc" in runs[n][0]]
        if memo:
            lines += [
                "",
                "Memorisation AUC (other server images against the reference images, per",
                "discriminator; 0.5: the negatives it trained on look like fresh images):",
                "",
                "| variant | mean over clients (seeds) | lowest client | highest client |",
                "|---|---|---|---|",
            ]
            for name in memo:
                rs = runs[name]
                means = [statistics.mean(r["memo_auc"]) for r in rs]
                low = min(min(r["memo_auc"]) for r in rs)
                high = max(max(r["memo_auc"]) for r in rs)
                lines.append(f"| {label(name)} | {_mean(means, 3)} | {low:.3f} | {high:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "conf/bench/cifar10-cpu-bn.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--test-subset", type=int, default=2000)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs/bench/discriminator-variants")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/discriminator-variants"
    )
    parser.add_argument("--override", nargs="*", default=[], help="more config overrides")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.table_only:
        for seed in args.seeds:
            run_seed(args, seed)
    text = table(args.out)
    atomic_write_text(args.out / "table.md", text)
    print(text)


if __name__ == "__main__":
    main()
