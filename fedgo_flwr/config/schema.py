"""Typed configuration sections built from plain mappings (a leaf module: stdlib only).

Every configuration section of fedgo-flwr, core or an algorithm's own, is a dataclass whose name
ends in ``Config``. :func:`build_section` turns a mapping (from YAML, JSON or overrides) into
such a dataclass: unknown keys, wrong types and nested sections are checked field by field, and
then the section's ``check(c)`` methods check its values with a :class:`Checker` that knows the
section's dotted prefix, so every error names the exact key::

    @dataclass
    class FedProxConfig:
        mu: float = 0.01

        def check(self, c: Checker) -> None:
            c.require("mu", self.mu >= 0, "must be >= 0")

A failed check raises :class:`ConfigError` with the dotted key (``strategy.mu``), the value,
the problem, and where the key came from (file or override) when the caller passed the
``sources`` of the merged configuration.

A section that extends others runs every ``check`` of its class chain, each once, bases first
(in reverse method resolution order: ``class C(A, B)`` runs ``B``'s, ``A``'s, then ``C``'s), so a
subclass's ``check`` neither hides its parents' nor calls them: it checks only what it adds, and
a class that defines none still gets every base's (:func:`run_checks`).

Numbers are checked here once for every section, before its ``check``, so a section need not
think of them: a ``float`` key must be finite (``.inf`` and ``.nan`` are refused: a comparison
with NaN is always false, so a check such as ``x < 0`` would let it through), and an ``int`` key
must lie within ``±MAX_INT`` (one million: no count of an experiment -- clients, rounds,
epochs, steps, batch sizes, widths -- needs more, while ``1e10`` clients or ``1e21`` rounds
would only exhaust the machine). A field declares an exception in its metadata:
``field(default=0, metadata={"max": 2**32 - 1})`` (a larger bound, e.g. a seed) or
``metadata={"nonfinite": True}`` (inf/NaN allowed; no field needs it today).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MAX_INT", "Checker", "ConfigError", "build_section", "run_checks", "section_fields"]

_UNSET: Any = object()

MAX_INT = 1_000_000
"""The largest magnitude of an ``int`` key, unless its field's metadata ``max`` says otherwise."""

_MAX_REPR = 120


def _short_repr(value: Any) -> str:
    """``repr(value)``, shortened: an error message must stay one readable line."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    return _shorten(text)


def _shorten(text: str) -> str:
    if len(text) > _MAX_REPR:
        return f"{text[: _MAX_REPR - 20]}...<{len(text)} characters>"
    return text


class ConfigError(ValueError):
    """A configuration value is missing, unknown, mistyped or out of range."""

    def __init__(self, key: str, value: Any, problem: str, source: str | None = None) -> None:
        self.key, self.value, self.problem, self.source = key, value, problem, source
        where = f"{_shorten(source)}: " if source else ""
        super().__init__(f"{where}{key} = {_short_repr(value)}: {problem}")


class Checker:
    """Raises :class:`ConfigError` for a key of one section, naming the key's source.

    ``prefix`` is the section's dotted path (``"strategy.distill."``) and ``obj`` the section
    being checked: ``require("lr", ok, problem)`` reports ``<prefix>lr`` with ``obj.lr``.
    """

    def __init__(
        self, sources: Mapping[str, str] | None = None, prefix: str = "", obj: Any = None
    ) -> None:
        self.sources: Mapping[str, str] = sources or {}
        self.prefix = prefix
        self.obj = obj

    def at(self, prefix: str, obj: Any = None) -> Checker:
        """A checker for the section ``obj`` at dotted path ``prefix`` (ending in ``.``)."""
        return Checker(self.sources, prefix, obj)

    def source_of(self, key: str) -> str | None:
        """The file or override that set ``key`` (or its closest parent), if known."""
        key = re.sub(r"\[\d+\]", "", key)
        while key:
            if key in self.sources:
                return self.sources[key]
            key = key.rpartition(".")[0]
        return self.sources.get("")

    def fail(self, name: str, problem: str, value: Any = _UNSET) -> typing.NoReturn:
        """Raise for field ``name`` of this section (its value is read unless given)."""
        if value is _UNSET:
            obj = self.obj
            value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        key = f"{self.prefix}{name}"
        raise ConfigError(key, value, problem, self.source_of(key))

    def require(self, name: str, ok: bool, problem: str) -> None:
        """Fail for field ``name`` unless ``ok``, and whenever the field is NaN.

        Every comparison with NaN is false, so ``ok`` written as ``not x < 0`` would pass it.
        """
        value = getattr(self.obj, name, None)
        if not ok or (isinstance(value, float) and math.isnan(value)):
            self.fail(name, problem)

    def choice(self, name: str, allowed: Iterable[str]) -> None:
        """Fail unless field ``name`` is one of ``allowed`` (naming the closest, if one is)."""
        allowed = tuple(allowed)
        value = getattr(self.obj, name, None)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            self.fail(name, f"unknown; choose one of {', '.join(allowed)}{hint}")


def section_fields(cls: type) -> list[str]:
    """The field names of a section dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(cls)]


def build_section(
    cls: type,
    raw: Mapping[str, Any] | None,
    prefix: str = "",
    *,
    owner: str | None = None,
    checker: Checker | None = None,
    sources: Mapping[str, str] | None = None,
    base: Any = None,
) -> Any:
    """Build section dataclass ``cls`` from ``raw`` and check it, recursively.

    A key that ``raw`` leaves out keeps ``base``'s value when ``base`` (an instance of ``cls``)
    is given, else the class default. A nested section starts from its field's own default:
    ``generator: GeneratorConfig = field(default_factory=lambda: GeneratorConfig(steps=0))``
    given ``{generator: {width: 8}}`` keeps ``steps`` 0, not the class's 1000.

    Keys of ``raw`` must be fields of ``cls`` (the error suggests the closest one; with
    ``owner`` it says whose parameters they are, e.g. a strategy's). Values are type-checked
    against the annotations (``int`` is accepted for ``float``), nested dataclasses and lists of
    dataclasses are built from mappings, lists of plain values are checked entry by entry (an
    error names ``key[i]``), and every built section's checks run (:func:`run_checks`),
    innermost section first.
    """
    checker = checker or Checker(sources)
    raw = {} if raw is None else raw
    at = checker.at(prefix)
    if not isinstance(raw, Mapping):
        at.fail(prefix.rstrip(".") or cls.__name__, "must be a mapping of keys", raw)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(fields)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            known = ", ".join(names) or "none"
            if owner is not None:
                at.fail(key, f"not a parameter of {owner}{hint} (its parameters: {known})", value)
            at.fail(key, f"unknown key{hint}; known keys: {known}", value)
        inner = getattr(base, key) if base is not None else _field_default(fields[key])
        kwargs[key] = _convert(hints[key], value, f"{prefix}{key}", checker, inner)
        _check_number(kwargs[key], fields[key].metadata, f"{prefix}{key}", checker)
    section = dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    run_checks(section, checker.at(prefix, section))
    return section


def _field_default(f: dataclasses.Field) -> Any:
    """The default value of field ``f`` when it is a section (a dataclass instance), else
    ``None``: what a partial mapping for that section starts from."""
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    elif f.default is not dataclasses.MISSING:
        value = f.default
    else:
        return None
    return value if dataclasses.is_dataclass(value) and not isinstance(value, type) else None


def run_checks(section: Any, c: Checker) -> None:
    """Run every ``check`` that a class of ``section``'s chain defines, each once, bases first.

    Each class's own ``check`` (from its ``__dict__``, not inherited) runs in reverse method
    resolution order, so with ``class C(A, B)`` a ``check`` of ``B``, of ``A`` and of ``C``
    all run, in that order; a function that two classes share (e.g. the built ``check`` of
    :func:`fedgo_flwr.protocol.scalars.parameters`) runs once.
    """
    seen: set[Any] = set()
    for klass in reversed(type(section).__mro__):
        check = vars(klass).get("check")
        if check is None or check in seen:
            continue
        seen.add(check)
        check.__get__(section, type(section))(c)


def _convert(tp: Any, value: Any, key: str, checker: Checker, base: Any = None) -> Any:
    """``value`` checked against annotation ``tp``; sections are built recursively, from
    ``base`` (the field's default section) where given."""
    item = _list_item_section(tp)
    if item is not None:
        if value is None:
            value = []
        if not isinstance(value, list):
            _fail(checker, key, value, "must be a list of mappings")
        out = []
        for i, entry in enumerate(value):
            if not isinstance(entry, Mapping):
                _fail(checker, f"{key}[{i}]", entry, "must be a mapping of keys")
            out.append(build_section(item, entry, f"{key}[{i}].", checker=checker))
        return out
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            _fail(checker, key, value, "must be a mapping of keys")
        start = base if isinstance(base, tp) else None
        return build_section(tp, value, f"{key}.", checker=checker, base=start)
    if typing.get_origin(tp) is list:  # a list of plain values, each checked and named key[i]
        (arg,) = typing.get_args(tp)
        if value is None:
            value = []
        if not isinstance(value, list):
            _fail(checker, key, value, f"must be a list of {_type_name(arg)}")
        out = []
        for i, entry in enumerate(value):
            out.append(_convert(arg, entry, f"{key}[{i}]", checker))
            _check_number(out[-1], {}, f"{key}[{i}]", checker)
        return out
    ok, cast = _type_ok(value, tp)
    if not ok:
        problem = f"must be {_type_name(tp)}, got {type(value).__name__}"
        if isinstance(value, str) and "float" in _type_name(tp) and _parses_as_float(value):
            problem += (
                f" (YAML reads {value} as text: write a dot and a signed exponent,"
                " e.g. 1.0e-3 or 1.0e+12)"
            )
        _fail(checker, key, value, problem)
    return cast


def _parses_as_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_number(value: Any, meta: Mapping[str, Any], key: str, checker: Checker) -> None:
    """Refuse a non-finite float and an int beyond ``±max`` (``MAX_INT`` unless ``meta``)."""
    if isinstance(value, float) and not math.isfinite(value) and not meta.get("nonfinite"):
        _fail(checker, key, value, "must be a finite number (not inf or NaN)")
    if isinstance(value, int) and not isinstance(value, bool):
        limit = meta.get("max", MAX_INT)
        if value > limit:
            _fail(checker, key, value, f"must be <= {limit}")
        if value < -limit:
            _fail(checker, key, value, f"must be >= -{limit}")


def _fail(checker: Checker, key: str, value: Any, problem: str) -> typing.NoReturn:
    raise ConfigError(key, value, problem, checker.source_of(key))


def _type_ok(value: Any, tp: Any) -> tuple[bool, Any]:
    """Check ``value`` against a simple annotation; ints are accepted (and cast) for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, cast = _type_ok(value, arg)
            if ok:
                return True, cast
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return True, float(value)
            except OverflowError:  # an int beyond the float range
                return True, math.inf
        return False, value
    if tp is str:
        return isinstance(value, str), value
    if origin is dict or tp is dict:
        return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else value
    return True, value


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is dict or tp is dict:
        return "a mapping"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _list_item_section(tp: Any) -> type | None:
    """``X`` if ``tp`` is ``list[X]`` with ``X`` a dataclass, else ``None``."""
    if typing.get_origin(tp) is list:
        (arg,) = typing.get_args(tp)
        if dataclasses.is_dataclass(arg):
            return arg
    return None
