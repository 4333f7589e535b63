"""The figures of finished runs: the report's (``./run.sh --report``) and the sweep's curves.

Every figure says the setting it shows in its title (:func:`setting`: dataset, partition,
clients, clients per round, rounds, model; a part in which the runs differ reads ``mixed`` with
the values), gives accuracies in % (``test accuracy (%)``, never a raw ``metrics.jsonl`` key
or a fraction), and clips its bands to what the quantity can be: [0, 100] for an accuracy,
0 and above for a loss.

- ``accuracy.png`` (:func:`plot_accuracy`, the report): one figure of four panels sharing one
  legend (each group's label and its n: ``fedavg (n=3 seeds)``, or ``n=2 runs, 1 seed`` when
  runs repeat a seed): test accuracy by round (solid: the server model; dashed: the client
  ensemble of distillation methods), test loss by round, test accuracy against the cumulative
  MB sent down and up (round 0's traffic included: what is sent before round 1, such as a
  generator), and test accuracy against wall time (``metrics.jsonl``'s ``elapsed``). Each line
  is the mean over the group's runs at each round; the band is +- one standard deviation over
  them (2 or more runs). A panel whose quantity no run recorded says so.
- ``partition-<run>.png`` (:func:`plot_partitions`): per distinct partition, clients x classes,
  the samples of each class each client holds (numbers in the cells up to 400 cells), titled
  with the run's setting and seed and the groups that share it.
- ``curves.png`` (:func:`plot_curves`, the sweep): per variant the metric's mean per round with
  its 95% t interval (rounds with 2 or more runs), n seeds in the legend.

A run's values are read as untrusted: NaN, infinities, non-numbers and missing keys are left
out of a curve, never drawn; a run with one round is a point. matplotlib is imported when a
figure is drawn (Agg backend: files only).
"""

from __future__ import annotations

import itertools
import math
import statistics
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedgo_flwr.runtime.fileio import atomic_write

__all__ = [
    "metric_label",
    "plot_accuracy",
    "plot_curves",
    "plot_partition",
    "plot_partitions",
    "setting",
]

DPI = 120
ANNOTATE_CELLS = 400
"""A partition heatmap prints each cell's count up to this many cells."""
MIXED_SHOWN = 4
"""A mixed part of the setting lists its values up to this many."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _wrap(*lines: str, width: int) -> str:
    """The non-empty ``lines``, each wrapped at ``width`` characters: a title that fits."""
    return "\n".join(textwrap.fill(line, width) for line in lines if line)


def _save(fig, path: Path, dpi: int = DPI) -> None:
    """Write ``fig`` to ``path`` atomically (a link at ``path`` is replaced) and close it."""
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))
    finally:
        _pyplot().close(fig)


# -- the setting of a set of runs ------------------------------------------------------------


def _get(config: Mapping, dotted: str) -> Any:
    """The scalar at ``dotted`` in a config mapping (``None``: absent or not a scalar)."""
    value: Any = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return value


def _short(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else " ".join(str(value).split())
    return text if len(text) <= 30 else text[:29] + "…"


def _partition(config: Mapping) -> str | None:
    """``Dirichlet α=0.1``, ``Dirichlet prior α=0.1, σ=0.5``, ``2 classes per client``."""
    scheme = _get(config, "data.partition")
    alpha = _get(config, "data.alpha")
    if scheme == "classes":
        per = _get(config, "data.classes_per_client")
        return f"{_short(per)} classes per client" if per is not None else "classes"
    if scheme is None and alpha is None:
        return None
    text = "Dirichlet" if scheme in (None, "dirichlet") else _short(scheme).replace("_", " ")
    if scheme == "dirichlet_prior":
        text = "Dirichlet prior"
    if alpha is not None:
        text += f" α={_short(alpha)}"
    sigma = _get(config, "data.quantity_sigma")
    if scheme == "dirichlet_prior" and _finite(sigma) and sigma:
        text += f", σ={_short(sigma)}"
    return text


def _per_round(config: Mapping) -> int | None:
    """Clients sampled a round, as the config computes it: ``max(min_clients, ⌊fraction·K⌋)``."""
    k, fraction = _get(config, "data.num_clients"), _get(config, "fraction")
    least = _get(config, "min_clients")
    if not (_finite(k) and _finite(fraction)):
        return None
    return max(int(least) if _finite(least) else 1, int(fraction * k + 1e-9))


# (what a mixed part is called, its value in one config, how one value reads)
_PARTS: list[tuple[str, Callable[[Mapping], Any], Callable[[Any], str]]] = [
    ("dataset", lambda c: _get(c, "data.dataset"), _short),
    ("partition", _partition, str),
    ("clients", lambda c: _get(c, "data.num_clients"), lambda v: f"{_short(v)} clients"),
    ("clients per round", _per_round, lambda v: f"{v} per round"),
    ("rounds", lambda c: _get(c, "rounds"), lambda v: f"{_short(v)} rounds"),
    ("model", lambda c: _get(c, "model.name"), _short),
]


def _mixed_parts(configs: Iterable[Mapping]) -> list[str]:
    """The parts of the setting in which these configs differ."""
    configs = [c if isinstance(c, Mapping) else {} for c in configs]
    return [noun for noun, value_of, _ in _PARTS if len({value_of(c) for c in configs}) > 1]


def _order(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=lambda v: (not _finite(v), v if _finite(v) else str(v)))


PARTITION_PARTS = ("dataset", "partition", "clients")
"""What a partition depends on (besides the seed): a heatmap's title says these."""


def setting(configs: Iterable[Mapping], parts: Sequence[str] | None = None) -> str:
    """The setting of runs with these ``config.yaml`` mappings, in one line: ``digits ·
    Dirichlet α=0.1 · 20 clients · 8 per round · 40 rounds · cnn``. A part in which they
    differ reads ``rounds mixed (3, 40)`` (``rounds mixed`` beyond :data:`MIXED_SHOWN`
    values); a part no config holds is left out; none at all: ``setting not recorded``.
    ``parts`` names the parts to say (all: ``None``)."""
    configs = [c if isinstance(c, Mapping) else {} for c in configs]
    said = []
    for noun, value_of, show in _PARTS:
        if parts is not None and noun not in parts:
            continue
        values = [value_of(c) for c in configs]
        distinct = _order({v for v in values if v is not None})
        if not distinct:
            continue
        if len(distinct) == 1 and None not in values:
            said.append(show(distinct[0]))
            continue
        shown = [_short(v) for v in distinct] + (["?"] if None in values else [])
        listed = f" ({', '.join(shown)})" if len(shown) <= MIXED_SHOWN else ""
        said.append(f"{noun} mixed{listed}")
    return " · ".join(said) if said else "setting not recorded"


# -- names and units -------------------------------------------------------------------------

_NAMES = {
    "test_accuracy": "test accuracy",
    "ensemble_test_accuracy": "client-ensemble test accuracy",
    "test_loss": "test loss",
    "ensemble_test_loss": "client-ensemble test loss",
    "train_loss": "train loss",
    "elapsed": "wall time (s)",
    "round_time": "round time (s)",
}


def _is_accuracy(key: str) -> bool:
    """An accuracy: a fraction in ``metrics.jsonl``, shown in %."""
    return "accuracy" in key


def metric_label(key: str) -> str:
    """What an axis says for ``metrics.jsonl`` key ``key``: ``test accuracy (%)``, ``test
    loss``; another key with spaces for underscores (``(%)`` if it is an accuracy)."""
    name = _NAMES.get(key, key.replace("_", " "))
    return f"{name} (%)" if _is_accuracy(key) else name


def _limits(key: str) -> tuple[float, float]:
    """The range a value of ``key`` (as shown) can take: bands are clipped to it."""
    if _is_accuracy(key):
        return 0.0, 100.0
    if "loss" in key or key in ("elapsed", "round_time"):
        return 0.0, math.inf
    return -math.inf, math.inf


def _shown(key: str, value: float) -> float:
    return 100.0 * value if _is_accuracy(key) else value


def _clip(values: Iterable[float], key: str) -> list[float]:
    lo, hi = _limits(key)
    return [min(max(v, lo), hi) for v in values]


def _legend(label: str, runs: Sequence[Any]) -> str:
    """``fedavg (n=3 seeds)``; ``default (fedavg, n=1 seed)`` when the label does not name the
    strategy; ``seed0 (mixed: fedavg, feddf; n=2 runs, 1 seed)`` when the group mixes
    strategies, so that a curve pooling methods says so."""
    names = sorted({str(r.strategy) for r in runs})
    n = _n_label(runs)
    if len(names) > 1:
        return f"{label} (mixed: {', '.join(names)}; {n})"
    if names and names[0] != label:
        return f"{label} ({names[0]}, {n})"
    return f"{label} ({n})"


def _n_label(runs: Sequence[Any]) -> str:
    """``n=3 seeds``; ``n=1 seed``; ``n=2 runs, 1 seed`` when runs repeat a seed (or do not
    record theirs): the band is over runs, and the reader must know they are not all seeds."""
    seeds = {r.seed for r in runs if r.seed is not None}
    if len(seeds) == len(runs):
        return f"n={len(runs)} seed{'s' if len(runs) != 1 else ''}"
    known = f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}" if seeds else "seed unknown"
    return f"n={len(runs)} run{'s' if len(runs) != 1 else ''}, {known}"


# -- the report's curves ---------------------------------------------------------------------


def _points(run: Any, key: str) -> dict[int, float]:
    """``{round: value}`` of the run's rows with a finite ``key`` (shown units)."""
    out = {}
    for row in run.rows:
        if _finite(row.get(key)) and isinstance(row.get("round"), int):
            out[row["round"]] = _shown(key, float(row[key]))
    return out


def _cumulative_mb(run: Any) -> dict[int, float]:
    """``{round: MB sent down and up up to and including it}``; ``{}`` if the run recorded no
    traffic (a row without a count adds nothing)."""
    if not any(_finite(r.get("bytes_down")) or _finite(r.get("bytes_up")) for r in run.rows):
        return {}
    total, out = 0.0, {}
    for row in sorted(run.rows, key=lambda r: r["round"]):
        total += sum(float(row[k]) for k in ("bytes_down", "bytes_up") if _finite(row.get(k)))
        out[row["round"]] = total / 1e6
    return out


def _elapsed(run: Any) -> dict[int, float]:
    return {r: v for r, v in _points(run, "elapsed").items() if v >= 0}


def _group_curve(
    runs: Sequence[Any], key: str, x_of: Callable[[Any], dict[int, float]] | None = None
) -> tuple[list[float], list[float], list[float] | None]:
    """Per round: the mean x (the round itself, or ``x_of``'s value) and the mean ``key`` over
    the runs that have both, and the sd of ``key`` (``None``: fewer than 2 runs anywhere)."""
    by_round: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        ys = _points(run, key)
        xs = {r: float(r) for r in ys} if x_of is None else x_of(run)
        for r, y in ys.items():
            if r in xs:
                by_round.setdefault(r, []).append((xs[r], y))
    rounds = sorted(by_round)
    xs = [statistics.fmean(x for x, _ in by_round[r]) for r in rounds]
    means = [statistics.fmean(y for _, y in by_round[r]) for r in rounds]
    if not any(len(by_round[r]) > 1 for r in rounds):
        return xs, means, None
    sds = [
        statistics.stdev(y for _, y in by_round[r]) if len(by_round[r]) > 1 else 0.0 for r in rounds
    ]
    return xs, means, sds


def _draw(ax, xs, means, sds, key, color, style="-") -> bool:
    """One group's mean line (markers when few points) and its band clipped to ``key``'s
    range; ``False`` if there is nothing to draw."""
    if not xs:
        return False
    marker = "." if len(xs) < 30 else None
    ax.plot(xs, means, style, color=color, marker=marker, markersize=4 if len(xs) > 1 else 7)
    if sds is not None and style == "-":
        lo = _clip((m - s for m, s in zip(means, sds, strict=True)), key)
        hi = _clip((m + s for m, s in zip(means, sds, strict=True)), key)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
    return True


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no run recorded {what}", transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks([])
    ax.set_yticks([])


# (panel title, y key, x values of a run or None for the round, x label, what is missing)
_PANELS = [
    ("test accuracy by round", "test_accuracy", None, "round", "a test accuracy"),
    ("test loss by round", "test_loss", None, "round", "a test loss"),
    (
        "test accuracy vs traffic",
        "test_accuracy",
        _cumulative_mb,
        "MB sent, down + up (cumulative)",
        "its traffic",
    ),
    (
        "test accuracy vs wall time",
        "test_accuracy",
        _elapsed,
        "wall time (s)",
        "its wall time",
    ),
]


def plot_accuracy(groups: Mapping[str, Sequence[Any]], path: Path, dpi: int = DPI) -> None:
    """``accuracy.png``: the four panels of the module's description for ``groups`` (label ->
    its runs, :class:`fedgo_flwr.records.report.Run`), titled with their setting; ``dpi``
    sets its size in pixels."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.6), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    palette = dict(zip(groups, itertools.cycle(colors)))
    handles, ensemble = [], False
    for ax, (title, key, x_of, xlabel, missing) in zip(axes.flat, _PANELS, strict=True):
        drawn = False
        for label, runs in groups.items():
            drawn |= _draw(ax, *_group_curve(runs, key, x_of), key, palette[label])
            if x_of is None and key == "test_accuracy":
                xs, means, _ = _group_curve(runs, "ensemble_test_accuracy")
                if _draw(ax, xs, means, None, key, palette[label], "--"):
                    ensemble = drawn = True
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric_label(key))
        if not drawn:
            _empty(ax, missing)
            continue
        if x_of is None:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if _is_accuracy(key):
            lo, hi = ax.get_ylim()
            ax.set_ylim(max(lo, -2.0), min(hi, 102.0))
        ax.grid(alpha=0.3)
    runs = [r for rs in groups.values() for r in rs]
    mixed = _mixed_parts(r.config for r in runs)
    for label, runs_of in groups.items():
        name = _legend(label, runs_of)
        if mixed:  # which group has which value of the parts the title calls mixed
            name += ": " + setting((r.config for r in runs_of), mixed)
        handles.append(Line2D([], [], color=palette[label], label=name))
    if ensemble:
        handles.append(Line2D([], [], color="0.3", linestyle="--", label="dashed: client ensemble"))
    band = "band: ± 1 sd over runs" if any(len(r) > 1 for r in groups.values()) else ""
    mean = "mean over each group's runs" if any(len(r) > 1 for r in groups.values()) else ""
    note = "; ".join(x for x in (mean, band) if x)
    fig.suptitle(_wrap(setting(r.config for r in runs), note, width=130), fontsize=11)
    if handles:
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncol=min(len(handles), 3),
            fontsize=8,
            frameon=False,
        )
    _save(fig, path, dpi)


# -- partitions ------------------------------------------------------------------------------


def plot_partition(run: Any, path: Path, labels: Sequence[str] = ()) -> bool:
    """Heatmap of the run's partition (clients x classes), titled with its setting, seed and
    the group ``labels`` that share it; ``False`` if it has none."""
    hist = (run.partition or {}).get("class_histogram")
    if not hist:
        return False
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    k, c = len(hist), len(hist[0])
    fig, ax = plt.subplots(
        figsize=(min(3 + 0.5 * c, 14), min(2.2 + 0.3 * k, 16)), layout="constrained"
    )
    image = ax.imshow(hist, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_xticks(range(c) if c <= 40 else range(0, c, max(1, c // 20)))
    ax.set_yticks(range(k) if k <= 40 else range(0, k, max(1, k // 20)))
    if k * c <= ANNOTATE_CELLS:
        top = max(max(row) for row in hist) or 1
        for (i, j), value in _cells(hist):
            if value:  # an empty cell stays blank: the classes a client holds stand out
                ink = "black" if value > 0.6 * top else "white"
                ax.text(j, i, f"{value:g}", ha="center", va="center", fontsize=7, color=ink)
    seed = f", seed {run.seed}" if run.seed is not None else ""
    shared = f"\nthe partition of {', '.join(labels)}" if labels else ""
    where = setting([run.config], PARTITION_PARTS)
    ax.set_title(f"samples per client and class\n{where}{seed}{shared}", fontsize=9)
    bar = fig.colorbar(image, ax=ax, label="samples")
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _save(fig, path)
    return True


def _cells(hist: Sequence[Sequence[float]]):
    for i, row in enumerate(hist):
        for j, value in enumerate(row):
            yield (i, j), value


def plot_partitions(
    groups: Mapping[str, Sequence[Any]],
    out: Path,
    name: Callable[[Path, Sequence[Path]], str] | None = None,
) -> list[Path]:
    """``partition-<name>.png`` in ``out`` for each distinct partition among the groups' first
    runs, named after the first run that has it: ``name(run folder, files written so far)``,
    by default the folder's name; returns the files written."""
    first: dict[str, tuple[Any, list[str]]] = {}
    for label, runs in groups.items():
        if not runs:
            continue
        key = repr((runs[0].partition or {}).get("class_histogram"))
        first.setdefault(key, (runs[0], []))[1].append(label)
    written = []
    for run, labels in first.values():
        stem = name(run.path, written) if name is not None else run.path.name
        target = out / f"partition-{stem}.png"
        if plot_partition(run, target, labels):
            written.append(target)
    return written


# -- the sweep's curves ----------------------------------------------------------------------


def _sweep_configs(table: Mapping, runs_dir: Path | None) -> list[Mapping]:
    """The ``config.yaml`` of each run in the table (``<runs_dir>/<variant>/seed<N>/``); one
    that cannot be read is left out of the title (the table does not rest on it)."""
    if runs_dir is None:
        return []
    configs = []
    for entry in table.get("variants", []):
        for seed in entry.get("seeds_finished", []):
            path = runs_dir / str(entry.get("name")) / f"seed{seed}" / "config.yaml"
            try:
                config = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError, ValueError, RecursionError):
                continue
            if isinstance(config, Mapping):
                configs.append(config)
    return configs


def plot_curves(table: Mapping, path: Path, runs_dir: Path | None = None) -> Path:
    """``curves.png`` of a sweep's ``table`` (:func:`fedgo_app.sweep.table.build_table`):
    per variant the metric's mean per round and its 95% band (rounds with 2 or more runs),
    in % for an accuracy, the band clipped to the metric's range; titled with the setting of
    the runs in ``runs_dir`` (the sweep's ``--out``) when given."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    key = str(table["metric"])
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for name, band in table["curves"].items():
        kept = [
            (r, _shown(key, m), n, lo, hi)
            for r, m, n, lo, hi in zip(
                band["round"],
                band["mean"],
                band["n"],
                band["ci_low"],
                band["ci_high"],
                strict=True,
            )
            if _finite(m)
        ]
        if not kept:
            continue
        counts = sorted({n for *_, n, _, _ in kept})
        n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        marker = "." if len(kept) < 30 else None
        rounds = [r for r, *_ in kept]
        (line,) = ax.plot(
            rounds, [m for _, m, *_ in kept], marker=marker, label=f"{name} (n={n} seeds)"
        )
        pts = [(r, lo, hi) for r, _, _, lo, hi in kept if _finite(lo) and _finite(hi)]
        if pts:
            r, lo, hi = zip(*pts, strict=True)
            lo = _clip((_shown(key, v) for v in lo), key)
            hi = _clip((_shown(key, v) for v in hi), key)
            ax.fill_between(r, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    seeds = table["seed_set"]
    level = int(round(100 * table["level"]))
    title = setting(_sweep_configs(table, runs_dir)) if runs_dir is not None else ""
    what = f"{metric_label(key)}: mean and {level}% CI over seeds"
    ax.set_title(_wrap(title, what, seeds["note"], width=100), fontsize=9)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(metric_label(key))
    if _is_accuracy(key) and ax.lines:
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(lo, -2.0), min(hi, 102.0))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, path)
    return path
