"""Reading an experiment's YAML files: ``base:`` chains, merging, and what is refused.

Part of the configuration layer (standard library and YAML only; used by
:mod:`fedgo_flwr.config.experiment`). The reader refuses what a configuration never means but
YAML would silently accept: an empty file (it would run the defaults), a key given twice in one
mapping (the last would win), a file that is not UTF-8 text, an integer of more than
:data:`MAX_DIGITS` digits, nesting deeper than :data:`MAX_DEPTH` levels and more than
:data:`MAX_NODES` values once aliases are expanded (these would crash or exhaust the reader
instead). Every problem is one :class:`~fedgo_flwr.config.schema.ConfigError`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fedgo_flwr.config.schema import ConfigError

__all__ = ["MAX_DEPTH", "MAX_DIGITS", "MAX_NODES", "Refused", "load_yaml", "merge", "read_yaml"]


def merge(
    dst: dict[str, Any],
    src: Mapping[str, Any],
    sources: dict[str, str],
    source: str,
    prefix: str = "",
) -> None:
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
            merge(dst[key], value, sources, source, f"{dotted}.")
        else:
            dst[key] = copy.deepcopy(value)
            sources[dotted] = source
            if isinstance(value, Mapping):
                for sub in _flat_keys(value, f"{dotted}."):
                    sources[sub] = source


def _flat_keys(mapping: Mapping[str, Any], prefix: str) -> Iterable[str]:
    for key, value in mapping.items():
        yield f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flat_keys(value, f"{prefix}{key}.")


MAX_DIGITS = 100
"""Longest integer literal read (Python refuses to convert more than 4300 digits)."""
MAX_DEPTH = 50
"""Deepest nesting of mappings and lists read (far below Python's recursion limit)."""
MAX_NODES = 100_000
"""Most values read, aliases expanded (a few nested aliases can stand for billions)."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"


class Refused(Exception):
    """A YAML text that parses but is refused: ``key`` (dotted, or ``None``: the whole text)."""

    def __init__(self, key: str | None, value: Any, problem: str) -> None:
        super().__init__(problem)
        self.key, self.value, self.problem = key, value, problem


def load_yaml(text: str, prefix: str = "") -> Any:
    """``text`` parsed by PyYAML's safe loader, after checking the node tree (see the module
    docstring); ``prefix`` is the dotted key the text is the value of (an override's).

    Raises :class:`yaml.YAMLError` for text that is not YAML and :class:`Refused` otherwise.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node(node, prefix.rstrip("."), 0, [0])
        return loader.construct_document(node)
    except RecursionError:
        raise Refused(None, None, f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def _check_node(node: yaml.Node, key: str, depth: int, count: list[int]) -> None:
    """Refuse duplicate keys, overlong integers, deep nesting and alias bombs below ``node``."""
    count[0] += 1
    if count[0] > MAX_NODES:
        raise Refused(None, None, f"too large: more than {MAX_NODES} values, aliases expanded")
    if depth > MAX_DEPTH:
        raise Refused(None, None, f"nested too deeply (at most {MAX_DEPTH} levels)")
    if isinstance(node, yaml.ScalarNode):
        if node.tag == _INT_TAG and len(node.value) > MAX_DIGITS:
            problem = f"too many digits ({len(node.value)}; at most {MAX_DIGITS})"
            raise Refused(key or None, node.value, problem)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_node(item, f"{key}[{i}]", depth + 1, count)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            _check_node(key_node, key, depth + 1, count)
            dotted = key
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                dotted = f"{key}.{key_node.value}" if key else key_node.value
                line = key_node.start_mark.line + 1
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    shown = value_node.value if isinstance(value_node, yaml.ScalarNode) else "..."
                    problem = f"duplicate key (line {seen[ident]}, again on line {line})"
                    raise Refused(dotted, shown, problem)
                seen[ident] = line
            _check_node(value_node, dotted, depth + 1, count)


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """One line for a YAML syntax error: where (line, column, the line), what, and what the
    parser was reading (e.g. a string left open on an earlier line)."""
    mark = getattr(exc, "problem_mark", None)
    what = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None:
        what += f" ({context} {_where(context_mark, text)})"
    return f"not valid YAML {_where(mark, text)}: {what}" if mark else f"not valid YAML: {what}"


def _where(mark: Any, text: str) -> str:
    """``at line L, column C ('the line')`` of a YAML mark (the line's text when it has one)."""
    lines = text.splitlines()
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    at = f"at line {mark.line + 1}, column {mark.column + 1}"
    return f"{at} ({shown[:60]!r})" if shown else at


def read_yaml(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    """The merged mapping of ``path`` and its ``base:`` chain, and where each dotted key was
    set (the file's path); ``chain``: the files that named this one."""
    if not path.is_file():
        problem = "a folder, not a YAML file" if path.is_dir() else "file not found"
        if chain:  # named by the 'base:' key of the file before it
            raise ConfigError("base", str(path), problem, str(chain[-1]))
        raise ConfigError("config", str(path), problem)
    if path in chain:
        raise ConfigError("base", str(path), "circular 'base:' chain", str(chain[-1]))
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not a UTF-8 text file (byte {exc.start} is not UTF-8)"
        raise ConfigError("config", str(path), problem) from None
    except OSError as exc:
        raise ConfigError("config", str(path), f"cannot be read: {exc.strerror}") from None
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", str(path), _yaml_problem(exc, text)) from None
    except Refused as exc:
        if exc.key is None:
            raise ConfigError("config", str(path), exc.problem) from None
        raise ConfigError(exc.key, exc.value, exc.problem, str(path)) from None
    if raw is None:
        problem = "the file is empty: an experiment needs at least one key (e.g. base: base.yaml)"
        raise ConfigError("config", str(path), problem)
    if not isinstance(raw, dict):
        raise ConfigError("config", str(path), "the file must hold a mapping of keys")
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError("base", base, "must be a file name", str(path))
        merged, sources = read_yaml((path.parent / base).resolve(), (*chain, path))
    merge(merged, raw, sources, str(path))
    return merged, sources
