"""Which runs a report averages together, and what it says about them.

A report's row is the runs of one experiment: :func:`arrange` sorts runs into groups by their
name (the label :func:`fedgo_flwr.records.report.load_run` gives them: the folder's name,
a sweep's variant, or with ``--label strategy`` the strategy), their strategy and the
:func:`~fedgo_flwr.records.provenance.config_fingerprint` of their ``config.yaml`` as
:func:`comparable` reads it: a core key that an older run's config lacks (added to the project
since) counts as its default, as when a run resumes
(:func:`fedgo_flwr.records.checkpoint.config_differences`), and the run's own seed in a text
value (``teachers_from: outputs/bench/x/oneshot-seed1`` in the run of seed 1: the input made by
the run of the same seed) is written ``seed<N>`` for every seed. Runs whose configs differ
otherwise are never averaged: a name that holds runs of several configs becomes
one row per config, labelled with the keys they differ in (``default (rounds=3)``,
``default (strategy=feddf)``), and :class:`Arrangement` ``notes`` say so. Two runs of one
config with the same seed are one seed run twice, not two seeds: the group keeps one, a
finished run before an unfinished one and then the one started last (``env.json``'s
``started``, else the time ``metrics.jsonl`` was last written, which also tells apart two
started in one second), and the other is ``left_out`` with the reason. Runs without a seed
are all kept.

:func:`commits` and :func:`versions` read a run's ``env.json``
(:mod:`fedgo_flwr.records.provenance`) for the report's provenance section; a run without
one is ``unknown``, and a field that is not what a run writes is ``unknown`` too. Every text
taken from a run's files passes :func:`cell` before it goes into a Markdown table.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fedgo_flwr.records.provenance import config_differences, config_fingerprint

Run = Any
"""A :class:`fedgo_flwr.records.report.Run` (that module imports this one, not the reverse)."""

__all__ = ["Arrangement", "arrange", "cell", "commits", "comparable", "versions"]

SHOWN_KEYS = 3
"""At most this many differing keys in a row's label; all of them are in ``notes``."""
VALUE_CHARS = 32
"""At most this many characters of a value in a row's label (``table.md`` names the keys)."""
NOTED_KEYS = 12
"""At most this many differing keys named in one note."""
UNKNOWN = "unknown"
_HEX = re.compile(r"[0-9a-f]{7,64}")
_VERSIONED = ("torch", "flwr", "ray", "numpy")


@dataclass
class Arrangement:
    """Runs grouped for a report: ``groups`` (label -> runs, each sorted by seed, in the order
    the labels first appear), the runs ``left_out`` with why, ``splits`` (a name that holds
    runs of several configs: the name, its rows' labels, the keys they differ in) and
    ``notes`` (one line each, for stderr)."""

    groups: dict[str, list[Run]] = field(default_factory=dict)
    left_out: list[tuple[Run, str]] = field(default_factory=list)
    splits: list[tuple[str, list[str], list[str]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _core_defaults() -> dict[str, Any]:
    from fedgo_flwr.config.experiment import ExperimentConfig

    return ExperimentConfig().to_dict(strategy_params=False)


def _with_defaults(config: Any, defaults: Any) -> Any:
    if not isinstance(config, dict) or not isinstance(defaults, dict):
        return config
    out = dict(config)
    for key, default in defaults.items():
        out[key] = _with_defaults(config[key], default) if key in config else default
    return out


def _own_seed(value: Any, token: re.Pattern) -> Any:
    if isinstance(value, str):
        return token.sub("seed<N>", value)
    if isinstance(value, dict):
        return {k: _own_seed(v, token) for k, v in value.items()}
    if isinstance(value, list):
        return [_own_seed(v, token) for v in value]
    return value


def comparable(run: Run, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """``run.config`` as runs are compared (see the module): the core keys it lacks filled with
    their defaults (``defaults``: :class:`~fedgo_flwr.config.experiment.ExperimentConfig`'s,
    strategy section aside), ``seed<S>`` of its own seed ``S`` in a text value as ``seed<N>``."""
    config = _with_defaults(run.config, _core_defaults() if defaults is None else defaults)
    if _integer(run.seed):
        config = _own_seed(config, re.compile(rf"(?<![A-Za-z0-9])seed{run.seed}(?![0-9])"))
    return config


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cell(text: Any) -> str:
    """``text`` as one Markdown table cell: no line breaks, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(config: dict[str, Any], dotted: str) -> str:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "unset"
        node = node[part]
    return "null" if node is None else str(node)


def _key_order(key: str) -> tuple:
    """Top-level keys (``rounds``) before nested ones (``strategy.distill.lr``)."""
    return (key.count("."), key)


def _short(text: str) -> str:
    """A value as a label shows it: at most :data:`VALUE_CHARS` characters, a long one's end
    (a path's file name) kept."""
    return text if len(text) <= VALUE_CHARS else "…" + text[-(VALUE_CHARS - 1) :]


def _describe(config: dict[str, Any], keys: Sequence[str]) -> list[str]:
    shown = [f"{k}={_short(_value(config, k))}" for k in keys[:SHOWN_KEYS]]
    if len(keys) > SHOWN_KEYS:
        shown.append(f"+{len(keys) - SHOWN_KEYS} more keys")
    return shown


def _split_labels(
    name: str, firsts: list[Run], views: list[dict[str, Any] | None]
) -> tuple[list[str], list[str]]:
    """Labels for the groups of one name that hold runs of different configs (``firsts``: a
    run of each, ``views``: its :func:`comparable` config, ``None`` without ``config.yaml``),
    and every key they differ in."""
    strategies = {r.strategy for r in firsts}
    labels = []
    for run, view in zip(firsts, views, strict=True):
        parts = [f"strategy={run.strategy}"] if len(strategies) > 1 else []
        if view is None:
            parts.append("no config.yaml")
        keys: set[str] = set()
        for peer, other in zip(firsts, views, strict=True):
            if view is not None and other is not None and peer.strategy == run.strategy:
                keys.update(config_differences(view, other))
        keys.discard("strategy.name")
        if keys:
            parts += _describe(view, sorted(keys, key=_key_order))
        labels.append(f"{name} ({', '.join(parts)})" if parts else name)
    every: set[str] = set()
    for view in views:
        for other in views:
            if view is not None and other is not None:
                every.update(config_differences(view, other))
    return labels, sorted(every, key=_key_order)


def _started(run: Run) -> tuple[float, float]:
    """When the run (last) started, ``env.json``'s ``started`` (to the second), else when its
    ``metrics.jsonl`` was last written; then, to tell apart two started in one second, when its
    ``metrics.jsonl`` was last written."""
    try:
        written = (run.path / "metrics.jsonl").stat().st_mtime
    except OSError:
        written = 0.0
    stamp = (run.env or {}).get("started")
    if isinstance(stamp, str):
        try:
            moment = datetime.datetime.fromisoformat(stamp)
        except ValueError:
            moment = None
        if moment is not None:
            if moment.tzinfo is None:
                moment = moment.astimezone()
            return moment.timestamp(), written
    return written, written


def _one_per_seed(label: str, runs: list[Run], out: Arrangement) -> list[Run]:
    by_seed: dict[int, list[Run]] = {}
    kept = []
    for run in runs:
        if run.seed is None:
            kept.append(run)
        else:
            by_seed.setdefault(run.seed, []).append(run)
    for seed, same in by_seed.items():
        same.sort(key=lambda r: (bool(r.summary), _started(r)), reverse=True)
        kept.append(same[0])
        for other in same[1:]:
            why = f"seed {seed} again in '{label}'; kept {same[0].path}"
            out.left_out.append((other, why))
            out.notes.append(f"{other.path}: left out: {why} (finished first, then newest)")
    return kept


def arrange(runs: Sequence[Run]) -> Arrangement:
    """Group ``runs`` for a report (see the module)."""
    out = Arrangement()
    defaults = _core_defaults()
    names: dict[str, dict[tuple, list[Run]]] = {}
    views: dict[tuple, dict[str, Any] | None] = {}
    for run in runs:
        view = comparable(run, defaults) if run.config else None
        key = (run.strategy, None if view is None else config_fingerprint(view))
        names.setdefault(run.label, {}).setdefault(key, []).append(run)
        views.setdefault(key, view)
    taken = set(names)
    for name, configs in names.items():
        members = list(configs.values())
        labels = [name]
        if len(members) > 1:
            firsts = [m[0] for m in members]
            labels, keys = _split_labels(name, firsts, [views[k] for k in configs])
            labels = _unique(labels, [k[1] for k in configs], name, taken)
            out.splits.append((name, labels, keys))
            listed = ", ".join(keys[:NOTED_KEYS]) + (
                f" and {len(keys) - NOTED_KEYS} more" if len(keys) > NOTED_KEYS else ""
            )
            rows = "; ".join(
                f"'{lb}' ({len(m)} runs)" for lb, m in zip(labels, members, strict=True)
            )
            out.notes.append(
                f"'{name}' holds runs of {len(members)} configurations, not averaged together "
                f"(they differ in {listed or 'strategy or config.yaml'}): {rows}"
            )
        for label, group in zip(labels, members, strict=True):
            group = [dataclasses.replace(r, label=label) for r in group]
            group = _one_per_seed(label, group, out)
            group.sort(key=lambda r: (r.seed is None, r.seed or 0))
            out.groups[label] = group
    for label, group in out.groups.items():
        used = _commit_runs(group)
        if len(used) > 1:
            listed = "; ".join(f"{c} ({_seeds(rs)})" for c, rs in used.items())
            out.notes.append(f"'{label}': its runs used {len(used)} commits: {listed}")
    return out


def _unique(labels: list[str], prints: list[str | None], name: str, taken: set[str]) -> list[str]:
    """``labels`` with the compared config's fingerprint added where two coincide (or one is
    another name's)."""
    out = []
    for label, fingerprint in zip(labels, prints, strict=True):
        if labels.count(label) > 1 or (label in taken and label != name):
            label = f"{label} [{fingerprint or 'no config'}]"
        out.append(label)
    return out


def _seeds(runs: Sequence[Run]) -> str:
    seeds = [str(r.seed) for r in runs if r.seed is not None]
    unnamed = len(runs) - len(seeds)
    text = "seed " + ", ".join(seeds) if seeds else ""
    if unnamed:
        text += f"{', ' if text else ''}{unnamed} without a seed"
    return text


def _starts(run: Run) -> list[dict[str, Any]]:
    """The run's starts, oldest first: ``env.json`` and the earlier starts of a resumed run."""
    env = run.env
    if not isinstance(env, dict):
        return []
    earlier = env.get("earlier")
    earlier = [e for e in earlier if isinstance(e, dict)] if isinstance(earlier, list) else []
    return [*earlier, env]


def commits(run: Run) -> list[str]:
    """The commits a run's starts used (short, ``+dirty`` with uncommitted changes), oldest
    first: ``["unknown"]`` without ``env.json``, ``"no git"`` for a start outside a git
    checkout."""
    found: list[str] = []
    for start in _starts(run) or [{}]:
        git = start.get("git")
        commit = git.get("commit") if isinstance(git, dict) else None
        if not isinstance(git, dict):
            text = UNKNOWN
        elif commit is None:
            text = "no git"
        elif isinstance(commit, str) and _HEX.fullmatch(commit):
            text = commit[:10] + ("+dirty" if git.get("dirty") is True else "")
        else:
            text = UNKNOWN
        if text not in found:
            found.append(text)
    return found


def _commit_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    used: dict[str, list[Run]] = {}
    for run in runs:
        for commit in commits(run):
            used.setdefault(commit, []).append(run)
    return used


def group_commits(runs: Sequence[Run]) -> str:
    """The group's commits: one, or ``N commits: a (seed 0, 1); b (seed 2)``."""
    used = _commit_runs(runs)
    if len(used) == 1:
        return next(iter(used))
    return f"{len(used)} commits: " + "; ".join(f"{c} ({_seeds(rs)})" for c, rs in used.items())


def _version(text: Any) -> str:
    return text if isinstance(text, str) and text and len(text) <= 40 else UNKNOWN


def versions(run: Run) -> list[str]:
    """``python 3.11.7, torch 2.14.1, flwr 1.42.0, ray 2.55.1, numpy 2.4.6`` of each start
    (distinct, oldest first); ``["unknown"]`` without ``env.json``."""
    found: list[str] = []
    for start in _starts(run) or [None]:
        if start is None:
            text = UNKNOWN
        else:
            packages = start.get("packages")
            packages = packages if isinstance(packages, dict) else {}
            parts = [f"python {_version(start.get('python'))}"]
            parts += [f"{name} {_version(packages.get(name))}" for name in _VERSIONED]
            text = ", ".join(parts)
        if text not in found:
            found.append(text)
    return found


def group_versions(runs: Sequence[Run]) -> str:
    """The group's versions: one line, or ``N sets: ...; ...``."""
    found: list[str] = []
    for run in runs:
        found.extend(v for v in versions(run) if v not in found)
    return found[0] if len(found) == 1 else f"{len(found)} sets: " + "; ".join(found)
