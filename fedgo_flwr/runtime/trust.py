"""Which code a client node may import because the server's config names it.

The server's configuration is trusted by the operator who runs the server; a client node
trusts only its own operator. Some configuration keys name Python code to import
(``strategy.generator.module``: a generator factory, FedGO's scenario G2), and a client
imports what the server's message names. A node therefore imports such code only if its own
config allows it:

- node config ``allow-code``: ``true`` allows any module; a comma-separated list allows the
  modules named and those below them (``allow-code="my_generators,lab.models"`` allows
  ``my_generators:make`` and ``lab.models.gan:make``, not ``lab.other``); an entry with a
  ``/`` is a folder (or a ``.py`` file) whose files may be imported by path. ``false`` (the
  default) allows none.
- if the node config lacks the key, ``$FEDGO_ALLOW_CODE`` of the node's process, read the same
  way: simulated nodes have no node config of their own and run their user's own config
  (``run.sh`` sets it, as it sets ``FEDGO_ALLOW_FAULTS``;
  :func:`fedgo_app.inprocess.run_inprocess` sets ``allow-code``).

Refused code is never imported: :func:`check_import` raises :class:`CodeNotAllowed` naming the
module and the node config key to set (the client's reply is an error). Only a client
handler restricts (:func:`node_code_policy`, set around every ClientApp handler); the server,
the command-line tools and the tests import what the config names, as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ALLOW_CODE",
    "ALLOW_CODE_ENV",
    "CodeNotAllowed",
    "CodePolicy",
    "check_import",
    "code_policy",
    "node_code_policy",
]

ALLOW_CODE = "allow-code"
ALLOW_CODE_ENV = "FEDGO_ALLOW_CODE"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class CodeNotAllowed(PermissionError):
    """The node's own config does not allow the code that the server's config names."""


@dataclass(frozen=True)
class CodePolicy:
    """What a node may import: ``anything``, else the module prefixes and folders listed."""

    anything: bool = False
    modules: tuple[str, ...] = ()
    paths: tuple[Path, ...] = ()
    source: str = f"node config {ALLOW_CODE}"

    @classmethod
    def parse(cls, value: Any, source: str) -> CodePolicy:
        """The policy of an ``allow-code`` value (bool, 0/1 or text); ``ValueError`` names a
        list entry that is neither a dotted module name nor a path."""
        if isinstance(value, bool):
            return cls(anything=value, source=source)
        if isinstance(value, int) and value in (0, 1):
            return cls(anything=bool(value), source=source)
        text = str(value).strip()
        if text.lower() in _TRUE:
            return cls(anything=True, source=source)
        if text.lower() in _FALSE:
            return cls(source=source)
        modules: list[str] = []
        paths: list[Path] = []
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            if "/" in entry or entry.endswith(".py"):
                paths.append(Path(entry).expanduser().resolve())
            elif all(part.isidentifier() for part in entry.split(".")):
                modules.append(entry)
            else:
                raise ValueError(
                    f"{source} = {text[:120]!r}: {entry[:60]!r} is neither a dotted module name "
                    "nor a path (use true, false, or a comma-separated list of modules and "
                    "folders)"
                )
        return cls(modules=tuple(modules), paths=tuple(paths), source=source)

    def permits(self, target: str) -> bool:
        """Whether ``target`` (a dotted module name, or a ``.py`` file path) may be imported."""
        if self.anything:
            return True
        if target.endswith(".py"):
            path = Path(target).expanduser().resolve()
            return any(path == p or path.is_relative_to(p) for p in self.paths)
        return any(target == m or target.startswith(m + ".") for m in self.modules)

    def describe(self) -> str:
        if self.anything:
            return f"{self.source} = true"
        allowed = [*self.modules, *(str(p) for p in self.paths)]
        return f"{self.source} = {','.join(allowed) if allowed else 'false'}"


def policy_of_node(node_config: Mapping[str, Any]) -> CodePolicy:
    """The policy of a node: node config ``allow-code``, else ``$FEDGO_ALLOW_CODE``, else none."""
    if ALLOW_CODE in node_config and node_config[ALLOW_CODE] is not None:
        return CodePolicy.parse(node_config[ALLOW_CODE], f"node config {ALLOW_CODE}")
    return CodePolicy.parse(os.environ.get(ALLOW_CODE_ENV, ""), f"${ALLOW_CODE_ENV}")


_active: ContextVar[CodePolicy | None] = ContextVar("fedgo_code_policy", default=None)


@contextmanager
def code_policy(policy: CodePolicy | None) -> Iterator[CodePolicy | None]:
    """Restrict imports of configured code to ``policy`` in this block (``None``: no limit)."""
    token = _active.set(policy)
    try:
        yield policy
    finally:
        _active.reset(token)


def node_code_policy(
    node_config: Mapping[str, Any],
) -> AbstractContextManager[CodePolicy | None]:
    """:func:`code_policy` with the policy of a client node (:func:`policy_of_node`)."""
    return code_policy(policy_of_node(node_config))


def check_import(target: str, key: str) -> None:
    """Raise :class:`CodeNotAllowed` unless the active policy lets ``target`` be imported.

    ``target`` is the module (``package.module``) or ``.py`` file that the configuration key
    ``key`` names.
    """
    policy = _active.get()
    if policy is None or policy.permits(target):
        return
    if target.endswith(".py"):
        scope = str(Path(target).expanduser().resolve().parent)
    else:
        scope = target.split(".")[0]
    raise CodeNotAllowed(
        f"{key}: this node does not import {target[:200]!r}, named by the server's config: a "
        f"client imports only code its own operator allowed ({policy.describe()}). To allow "
        f'it, start the node with node config {ALLOW_CODE}=true or {ALLOW_CODE}="{scope}" '
        f"(deploy/supernode.sh --allow-code ...; simulated nodes: {ALLOW_CODE_ENV}=1)"
    )
