"""Which kept runs of a benchmark may be pooled: never runs of unlike configs.

A driver's table pools a method's runs over seeds (mean ± sd, paired differences); that is only
sound when the runs differ in their seed alone. :func:`split_unlike` compares the runs'
kept ``config.yaml`` and splits a method whose runs differ beyond the seed into groups of like
runs, with a note for the table naming the keys and values that differ. Used by
``benchmarks/fedgo_table3.py``'s ``table``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path

import yaml

import strategies
from benchmarks.sweep import Kept, Run
from fedgo_flwr.config.experiment import ExperimentConfig


def split_unlike(
    runs: dict[str, list[Run]], results: Path
) -> tuple[dict[str, list[Run]], list[str]]:
    """``runs`` (by method, :func:`load_runs`) pooled only where their kept ``config.yaml``
    agree beyond the seed, and the table's note on every method that was split (none: ``[]``).

    Two configs agree when every dotted key has one value, ``seed`` left out and the run's own
    seed in a text value (``outputs/.../fedgo-seed1/generator.pt``) read as any seed's; a key
    that one lacks takes its current default (a key added to the project after that run), as
    :func:`fedgo_flwr.records.checkpoint.config_differences` reads a checkpoint's. A method
    whose runs disagree keeps its name for its largest group of like runs (the first on a tie);
    each other group follows it as ``<method> [seed0, ...]``, and the note names its keys.
    """
    kept, out, notes = Kept(results), {}, []
    for method, method_runs in runs.items():
        groups: list[tuple[dict, list[Run]]] = []
        for run in method_runs:
            config = _flat_config(kept.get(run.name, "config.yaml"), run.name, run.seed)
            like = next((g for c, g in groups if not _unlike(c, config)), None)
            if like is None:
                groups.append((config, [run]))
            else:
                like.append(run)
        main_config, main = max(groups, key=lambda g: len(g[1]))
        out[method] = main
        for config, group in (g for g in groups if g[1] is not main):
            label = f"{method} [{', '.join(r.seed for r in group)}]"
            out[label] = group
            keys = "; ".join(f"{k}: {a} vs {b}" for k, a, b in _unlike(config, main_config))
            notes.append(f"- {label} vs {method} ({', '.join(r.seed for r in main)}): {keys}")
    if not notes:
        return out, []
    head = "Runs of one method whose config.yaml differ beyond the seed, not pooled:"
    return out, ["", head, "", *notes]


def _flatten(value: object, prefix: str = "") -> dict:
    """A nested mapping as ``{"dotted.key": value}`` (lists are values)."""
    if not isinstance(value, dict):
        return {prefix[:-1]: value}
    return {
        k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()
    }


def _flat_config(text: bytes | None, name: str, seed: str) -> dict:
    """Run ``name``'s kept ``config.yaml`` (``None``: not kept, no keys) as dotted keys, less
    ``seed``, the run's own ``seed`` (``"seed1"``) in its text values written ``seed<N>``; one
    ``ValueError`` naming the file if it is not a YAML mapping."""
    try:
        raw = yaml.safe_load(text or b"") or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{name}/config.yaml: not readable YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{name}/config.yaml: not a mapping of keys")
    flat = _flatten({k: v for k, v in raw.items() if k != "seed"})
    own = re.compile(rf"\b{seed}(?!\d)")
    return {k: own.sub("seed<N>", v) if isinstance(v, str) else v for k, v in flat.items()}


@functools.cache
def _config_defaults(strategy: str | None) -> dict:
    """Every dotted key's current default: the core sections' and ``strategy``'s parameters'
    (the core sections' only for a strategy that is not named or no longer exists)."""
    raw = ExperimentConfig().to_dict(strategy_params=False)
    raw["strategy"] = {}
    if strategy is not None:
        try:
            raw["strategy"] = dataclasses.asdict(strategies.strategy_class(strategy).Config())
        except ValueError:
            pass
    return _flatten(raw)


_ABSENT = object()


def _value(config: dict, key: str) -> object:
    """``key``'s value in a flat config; a key it lacks: its current default, else absent."""
    if key in config:
        return config[key]
    name = config.get("strategy.name")
    return _config_defaults(name if isinstance(name, str) else None).get(key, _ABSENT)


def _unlike(a: dict, b: dict) -> list[tuple[str, str, str]]:
    """The keys in which flat configs ``a`` and ``b`` differ, with their values as JSON
    (``absent``: a key that one lacks and that has no default)."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = _value(a, key), _value(b, key)
        if va != vb:
            out.append((key, _text(va), _text(vb)))
    return out


def _text(value: object) -> str:
    return "absent" if value is _ABSENT else json.dumps(value, default=str)
