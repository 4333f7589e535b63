"""The words of a sweep's command line: variants (a YAML file, a name, overrides) and overrides.

A **variant** is one shell word (quote it when it holds spaces)::

    PATH.yaml                        named after the file: conf/feddf.yaml is "feddf"
    NAME=PATH.yaml                   named NAME
    "NAME=PATH.yaml k=v [k=v ...]"   named NAME, with overrides of its own

so that several variants of one base YAML differ by a few keys::

    "fedavg=conf/default.yaml" "feddf=conf/default.yaml strategy.name=feddf"

A word that is ``k=v`` with a value not ending in ``.yaml``/``.yml`` is an override for every
variant; a variant's own overrides come after those, so they win. NAME is a folder name
(letters, digits, ``_.+-``). The sweep sets ``seed``, ``output_dir`` and ``resume`` itself, so
no override may name them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+-]*")
YAML = (".yaml", ".yml")
RESERVED = ("seed", "output_dir", "resume", "overwrite")
"""Keys the sweep sets for each run; an override of one is refused."""


class SweepArgumentError(ValueError):
    """A word of the command line that is neither a variant nor an override."""


@dataclass(frozen=True)
class Variant:
    """One configuration of a sweep: ``config`` (a YAML path as given) with ``overrides``."""

    name: str
    config: str
    overrides: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"name": self.name, "config": self.config, "overrides": list(self.overrides)}


def _is_variant_head(token: str) -> bool:
    head = token.split("=", 1)[1] if "=" in token else token
    return head.endswith(YAML)


def _check_override(word: str, where: str) -> str:
    key, sep, _ = word.partition("=")
    if not sep or not key or " " in key:
        raise SweepArgumentError(f"{where}: {word!r} is not a dotted.key=value override")
    if key.strip() in RESERVED:
        raise SweepArgumentError(
            f"{where}: {word!r}: the sweep sets {', '.join(RESERVED)} itself "
            "(the seeds come from --seeds, the folders from --out)"
        )
    return word


def parse_variant(word: str) -> Variant:
    """The :class:`Variant` a command-line word names (see the module)."""
    tokens = shlex.split(word)
    if not tokens or not _is_variant_head(tokens[0]):
        raise SweepArgumentError(f"{word!r} is not a variant: [NAME=]PATH.yaml [k=v ...]")
    head, *overrides = tokens
    if "=" in head:
        name, config = head.split("=", 1)
        if not NAME.fullmatch(name):
            raise SweepArgumentError(
                f"{word!r}: the variant name {name!r} must be a folder name (letters, digits, _.+-)"
            )
    else:
        name, config = Path(head).stem, head
    for item in overrides:
        _check_override(item, f"variant {name}")
    return Variant(name, config, tuple(overrides))


def parse_words(words: list[str]) -> tuple[list[Variant], list[str]]:
    """The variants and the common overrides among ``words``, in order; raises
    :class:`SweepArgumentError` for a bad word, duplicate names or no variant."""
    variants: list[Variant] = []
    common: list[str] = []
    for word in words:
        first = word.strip().split(None, 1)[0] if word.strip() else ""
        if _is_variant_head(first):
            variants.append(parse_variant(word))
        else:
            common.append(_check_override(word, "override"))
    if not variants:
        raise SweepArgumentError("no variant: give at least one [NAME=]PATH.yaml")
    names = [v.name for v in variants]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SweepArgumentError(
            f"two variants are named {', '.join(twice)}: name them, NAME=PATH.yaml"
        )
    return variants, common
