"""Write ``docs/configuration.md`` from the configuration dataclasses.

Run from the repository root::

    .venv/bin/python -m docs.gen_configuration --write   # or: ... > docs/configuration.md

Every key, its type, default and integer limit come from the dataclasses: the core sections of
:mod:`fedgo_flwr.config.experiment` and, for each strategy of :func:`strategies.available`, its
``Config`` with every base class and nested section (``strategy.aggregation``, ``strategy.distill``
...). What each section's ``check`` method refuses is read from its source (``c.require``,
``c.choice``, ``c.fail``), and which strategies read a section from the classes. A section's
prose is its class docstring; a key's description is its attribute docstring (a string right
below the field, in the class that declares it or, for a field a subclass redeclares, the
nearest base's; a parameter declared by :class:`fedgo_flwr.protocol.scalars.Param` has its
``doc`` and its bound instead), else the class docstring, which then must name the key: a key is
described in one place. ``{strategies}``, ``{datasets}`` ... in a description stand for lists
the page takes from the code (:data:`PLACEHOLDERS`: the strategies, the entries of
:data:`fedgo_flwr.config.names.DATASETS`). The page's other prose is
:mod:`docs.configuration_text`. ``tests/unit/test_docs.py`` keeps the committed file equal to
this output and every key described.

This is a development tool: nothing of the library or the apps imports it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import strategies
from docs.configuration_text import INTRO, RULES
from fedgo_flwr.config.experiment import ExperimentConfig, StrategyConfig
from fedgo_flwr.config.names import DATASETS
from fedgo_flwr.config.schema import MAX_INT
from fedgo_flwr.weighting import WEIGHTING_METHODS

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "configuration.md"
COMMAND = ".venv/bin/python -m docs.gen_configuration --write"

STRATEGY_ORDER = (
    "fedavg",
    "fedprox",
    "scaffold",
    "feddisco",
    "feduv",
    "fedtgp",
    "fedgkd",
    "fedgkd_plus",
    "feddf",
    "fedgo",
    "dafkd",
    "central",
    "cpfl",
    "oneshot",
    "coboosting",
    "dense",
    "fadi",
    "coboosting_fedgo",
)
"""The order of the strategy sections (related ones together); others follow by name."""

HIDDEN = {"StrategyConfig.params", "StrategyConfig.sources"}
"""Fields that are no YAML keys (the strategy's parameters sit beside ``strategy.name``)."""

# ------------------------------------------------------------------------------------------
# Finding the sections
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Section:
    """One configuration dataclass: where it sits in YAML and who reads it."""

    cls: type
    prefix: str
    readers: list[str]

    @property
    def anchor(self) -> str:
        return self.cls.__qualname__.lower()

    @property
    def own_fields(self) -> list[dataclasses.Field]:
        own = self.cls.__dict__.get("__annotations__", {})
        return [
            f
            for f in dataclasses.fields(self.cls)
            if f.name in own and f"{self.cls.__qualname__}.{f.name}" not in HIDDEN
        ]


def _section_type(tp: Any) -> type | None:
    """The dataclass of a section field (``X`` or ``list[X]``), else ``None``."""
    if typing.get_origin(tp) is list:
        (tp,) = typing.get_args(tp)
    return tp if dataclasses.is_dataclass(tp) else None


def strategy_names() -> list[str]:
    available = strategies.available()
    return [n for n in STRATEGY_ORDER if n in available] + sorted(
        n for n in available if n not in STRATEGY_ORDER
    )


def find_sections() -> tuple[dict[type, Section], dict[type, Section]]:
    """The core sections and the strategy sections, each in the order they are documented."""
    core: dict[type, Section] = {}
    strat: dict[type, Section] = {}

    def walk(cls: type, prefix: str, reader: str, into: dict[type, Section]) -> None:
        for klass in reversed(cls.__mro__):
            if dataclasses.is_dataclass(klass):
                section = into.setdefault(klass, Section(klass, prefix, []))
                if reader not in section.readers:
                    section.readers.append(reader)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = _section_type(hints[f.name])
            if sub is not None and sub is not StrategyConfig:
                list_marker = "[]" if typing.get_origin(hints[f.name]) is list else ""
                walk(sub, f"{prefix}{f.name}{list_marker}.", reader, into)

    walk(ExperimentConfig, "", "every experiment", core)
    core[StrategyConfig] = Section(StrategyConfig, "strategy.", ["every experiment"])
    for name in strategy_names():
        walk(strategies.strategy_class(name).Config, "strategy.", name, strat)
    return core, strat


# ------------------------------------------------------------------------------------------
# What the code says about a key
# ------------------------------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of ``cls``: a string literal right below a field."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def class_doc(cls: type) -> str:
    """The class docstring, or ``""`` where it is only the generated signature."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc)


_UNRESOLVED = "\x00"


class _Checks:
    """The checks in a section's ``check`` method, by dotted key."""

    def __init__(self, section: Section) -> None:
        self.section = section
        self.globals = vars(sys.modules[section.cls.__module__])
        self.locals: dict[str, ast.expr] = {}

    def messages(self) -> Iterator[tuple[str, str]]:
        fn = self.section.cls.__dict__.get("check")
        if fn is None:
            return
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.locals[target.id] = node.value
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("require", "choice", "fail") or not node.args:
                continue
            prefix = self._checker_prefix(node.func.value)
            field = node.args[0]
            if prefix is None or not isinstance(field, ast.Constant):
                continue
            key = re.sub(r"\[[^\]]*\]", "[]", f"{prefix}{field.value}")
            if node.func.attr == "choice" and len(node.args) > 1:
                allowed = self._value(node.args[1])
                if isinstance(allowed, Mapping):
                    allowed = list(allowed)
                if isinstance(allowed, (list, tuple)):
                    yield key, "one of " + ", ".join(f"`{a}`" for a in allowed)
            else:
                index = 2 if node.func.attr == "require" else 1
                if len(node.args) > index:
                    text = self._message(node.args[index])
                    if text:
                        yield key, text

    def _checker_prefix(self, node: ast.expr) -> str | None:
        """The dotted prefix of the checker a call is made on (``c`` or ``c.at(...)``)."""
        if isinstance(node, ast.Name) and node.id == "c":
            return self.section.prefix
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "at"
            and node.args
        ):
            text = self._text(node.args[0])
            return None if _UNRESOLVED in text else text
        return None

    def _value(self, node: ast.expr) -> Any:
        """The value of an expression of module constants (no ``self``), else ``None``."""
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self._value(self.locals[node.id])
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if not names <= set(self.globals) | {"str", "len", "sorted", "list", "tuple"}:
            return None
        try:
            return eval(compile(ast.Expression(node), "<check>", "eval"), dict(self.globals))
        except Exception:  # an expression that needs the value checked
            return None

    def _text(self, node: ast.expr) -> str:
        """A message expression as text; what cannot be known statically is ``_UNRESOLVED``."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(self._text(v) for v in node.values)
        if isinstance(node, ast.FormattedValue):
            return self._text(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._text(node.left) + self._text(node.right)
        if isinstance(node, ast.Attribute) and ast.unparse(node) == "c.prefix":
            return self.section.prefix
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self._text(self.locals[node.id])
        value = self._value(node)
        if isinstance(value, (list, tuple)):
            return ", ".join(map(str, value))
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return str(value)
        return _UNRESOLVED

    def _message(self, node: ast.expr) -> str:
        """A problem text, less the parts that depend on the value checked."""
        text = self._text(node)
        text = re.sub(r" \([^()]*\x00[^()]*\)", "", text)
        parts = [p for p in text.split("; ") if _UNRESOLVED not in p]
        return "; ".join(parts)


# ------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------


def rst_to_markdown(text: str) -> str:
    """Docstring markup as Markdown: literals, roles, bullets."""
    text = re.sub(r":[a-z]+:`~?([^`<]+?)(?:\s*<[^>]+>)?`", r"`\1`", text)
    text = text.replace("``", "`")
    text = re.sub(r"^(\s*)\* ", r"\1- ", text, flags=re.M)
    return text


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return f"list of {type_name(arg)}"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def section_changes(value: Any, sub: type) -> str:
    """The defaults a field's own ``default_factory`` changes in section ``sub``, as YAML."""
    if not isinstance(value, sub):
        return ""
    plain = sub()
    changed = [
        f"`{f.name}: {yaml_value(getattr(value, f.name))}`"
        for f in dataclasses.fields(sub)
        if getattr(value, f.name) != getattr(plain, f.name)
    ]
    return ", ".join(changed)


def description_of(cls: type, name: str) -> str | None:
    """Field ``name``'s attribute docstring in ``cls`` or, failing that, its nearest base's,
    with the placeholders filled in (see the module docstring)."""
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        doc = attribute_docs(klass).get(name)
        own = {f.name: f for f in dataclasses.fields(klass)}.get(name)
        if doc is None and own is not None and name in klass.__dict__.get("__annotations__", {}):
            doc = own.metadata.get("doc")  # a declared scalar parameter's (protocol/scalars.py)
        if doc is not None:
            for name, fill in PLACEHOLDERS.items():
                if "{" + name + "}" in doc:
                    doc = doc.replace("{" + name + "}", fill())
            return doc
    return None


def dataset_folders() -> str:
    """Each built-in dataset's folder under ``data.path``, and its default root (else it needs
    ``data.path``)."""
    return "; ".join(
        f"``{name}``: ``{e.folder}/``"
        + (f" (default root ``{e.default_path}``)" if e.default_path else " (required)")
        for name, e in DATASETS.items()
        if e.folder is not None
    )


PLACEHOLDERS: dict[str, Callable[[], str]] = {
    "strategies": lambda: ", ".join(f"`{n}`" for n in strategy_names()),
    "datasets": lambda: ", ".join(f"``{n}`` ({e.about})" for n, e in DATASETS.items()),
    "dataset_folders": dataset_folders,
    "downloadable": lambda: ", ".join(f"``{n}``" for n, e in DATASETS.items() if e.download),
}
"""What ``{name}`` in an attribute docstring stands for: lists the page takes from the code."""


def wrap(text: str, first: str, width: int = 100) -> list[str]:
    return textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )


class Renderer:
    def __init__(self) -> None:
        self.core, self.strat = find_sections()
        self.anchors = {s.cls: s.anchor for s in [*self.core.values(), *self.strat.values()]}
        self.undocumented: list[str] = []
        self.checks: dict[tuple[type, str], list[str]] = {}
        for section in [*self.core.values(), *self.strat.values()]:
            for key, text in _Checks(section).messages():
                found = self.checks.setdefault((section.cls, key), [])
                if text not in found:
                    found.append(text)

    def checks_of(self, cls: type, key: str) -> list[str]:
        """What the checks of ``cls`` and its bases (and, for core keys, of every core
        section: ``ExperimentConfig`` checks keys across sections) say about ``key``."""
        owners = [k for k in cls.__mro__ if dataclasses.is_dataclass(k)]
        if not key.startswith("strategy."):
            owners += list(self.core)
        found: list[str] = []
        for owner in owners:
            for text in self.checks.get((owner, key), []):
                if text not in found:
                    found.append(text)
        return [t for t in found if not any(o != t and o.startswith(t) for o in found)]

    def field_line(self, section: Section, f: dataclasses.Field) -> list[str]:
        cls = section.cls
        key = f"{section.prefix}{f.name}"
        tp = typing.get_type_hints(cls)[f.name]
        sub = _section_type(tp)
        if sub is None:
            facts = [type_name(tp)]
        else:
            link = f"[{sub.__qualname__}](#{self.anchors[sub]})"
            facts = [f"list of {link}" if typing.get_origin(tp) is list else f"section {link}"]
            changed = section_changes(default_of(f), sub)
            if changed:
                facts.append(f"here {changed}")
        default = default_of(f)
        if sub is None and default is not dataclasses.MISSING:
            facts.append(f"default `{yaml_value(default)}`")
        limit = f.metadata.get("max")
        if limit is not None and limit != MAX_INT:
            facts.append(f"at most {limit}")
        facts += self.checks_of(cls, key)
        rule = f.metadata.get("rule")  # a declared scalar parameter's bound
        if rule and rule not in facts:
            facts.append(rule)
        description = description_of(cls, f.name)
        inherited = [
            k
            for k in cls.__mro__[1:]
            if dataclasses.is_dataclass(k) and f.name in k.__dict__.get("__annotations__", {})
        ]
        if sub is not None:
            pass
        elif inherited:
            base = inherited[0]
            link = f"[{base.__qualname__}](#{self.anchors.get(base, base.__qualname__.lower())})"
            description = f"{description or ''} This strategy's default; see {link}."
        elif description is None and f"``{f.name}``" not in (cls.__doc__ or ""):
            self.undocumented.append(f"{cls.__qualname__}.{f.name} ({key})")
        text = f"`{key}` ({'; '.join(facts)})"
        if description:
            text += ": " + rst_to_markdown(description.strip())
        return wrap(text, "- ")

    def section(self, section: Section) -> list[str]:
        cls = section.cls
        fields = section.own_fields
        if not fields:
            return []
        where = Path(inspect.getsourcefile(cls)).resolve().relative_to(ROOT).as_posix()
        keys = f"`{section.prefix}*`" if section.prefix else "top-level keys"
        lines = [f'<a id="{section.anchor}"></a>', ""]
        lines += [f"### {cls.__qualname__} ({keys})", ""]
        lines += [f"Declared in `{where}`; read by {', '.join(section.readers)}.", ""]
        doc = class_doc(cls)
        if doc:
            lines += [rst_to_markdown(doc), ""]
        for f in fields:
            lines += self.field_line(section, f)
        own = {f"{section.prefix}{f.name}" for f in fields}
        also = [
            (key, text)
            for (owner, key), texts in self.checks.items()
            if owner is cls and key.startswith(section.prefix) and key not in own
            for text in texts
            if key.startswith("strategy.")
        ]
        if also:
            lines += ["", "It also checks keys of its bases:", ""]
            for key, text in also:
                lines += wrap(f"`{key}`: {text}", "- ")
        return [*lines, ""]

    def overview(self) -> list[str]:
        lines = [
            "| `strategy.name` | client algorithm | `Config` | its parameter sections |",
            "|---|---|---|---|",
        ]
        for name in strategy_names():
            cls = strategies.strategy_class(name)
            parts = [
                f"[{k.__qualname__}](#{self.anchors[k]})"
                for k, s in self.strat.items()
                if name in s.readers and s.own_fields
            ]
            config = cls.Config.__qualname__
            row = f"| `{name}` | `{cls.client_algorithm}` | `{config}` | {', '.join(parts)} |"
            lines.append(row)
        return lines

    def weightings(self) -> list[str]:
        lines = [
            "`strategy.weighting` picks one of these (`fedgo_flwr/weighting/methods.py`); "
            "`strategy.weighting_params.<method>` sets its parameters, and what is not given "
            "takes the default below. Every method's pseudo-label accuracy is recorded each "
            "round (`pl_acc_<method>`), the variants' too (`pl_acc_<method>_<variant>`).",
            "",
            "| method | needs | parameters (defaults) | diagnostic variants | after |",
            "|---|---|---|---|---|",
        ]
        for m in WEIGHTING_METHODS.values():
            needs = ", ".join(f"`{r}`" for r in m.requires) or "-"
            params = ", ".join(f"`{k}: {yaml_value(v)}`" for k, v in m.defaults.items()) or "-"
            variants = ", ".join(f"`{v}`" for v in m.variants) or "-"
            lines.append(f"| `{m.name}` | {needs} | {params} | {variants} | {m.reference} |")
        return lines

    def render(self) -> str:
        lines = [
            "# Configuration",
            "",
            f"<!-- Generated by `{COMMAND}` from the configuration dataclasses"
            " (docs/gen_configuration.py); edit those, not this file. -->",
            "",
            INTRO,
            "## Core keys",
            "",
            "What every experiment has, whatever the strategy (`fedgo_flwr/config/experiment.py`).",
            "",
        ]
        for section in self.core.values():
            lines += self.section(section)
        lines += [
            "## Strategy parameters",
            "",
            "Each strategy reads the fields of its `Config` class, its base classes and their "
            "nested sections, all under `strategy.`. A section below is documented once, with "
            "the strategies that read it.",
            "",
            *self.overview(),
            "",
        ]
        for section in self.strat.values():
            lines += self.section(section)
        lines += ["## Weighting methods", "", *self.weightings(), ""]
        lines += [RULES.format(max_int=f"{MAX_INT:,}")]
        return "\n".join(lines).rstrip() + "\n"


def generate() -> tuple[str, list[str]]:
    """The Markdown text and the keys that have no description."""
    renderer = Renderer()
    return renderer.render(), renderer.undocumented


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {TARGET.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text, undocumented = generate()
    if undocumented:
        print("keys without a description: " + ", ".join(undocumented), file=sys.stderr)
    if args.write:
        TARGET.write_text(text)
    else:
        sys.stdout.write(text)
    return 1 if undocumented else 0


if __name__ == "__main__":
    raise SystemExit(main())
