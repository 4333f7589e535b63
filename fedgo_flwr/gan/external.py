"""Generators from a factory the user wrote: FedGO's scenario G2 with any ``nn.Module``.

FedGO (Jang, Park & Lee, ICML 2025, Sec. 3.2) lets the server (G2) "load an off-the-shelf
generator pretrained on a sufficiently rich dataset" (the paper used StyleGAN-XL). Besides this
project's own generators (``strategy.generator.name``, :func:`~fedgo_flwr.gan.generators.
build_generator`), ``strategy.generator.module`` names a factory::

    strategy.generator.module: "my_package.my_module:make_generator"
    strategy.generator.module: "path/to/file.py:make_generator"   # a file, no package needed

The callable is called with keyword arguments only, ``factory(latent_dim=..., shape=(C, H, W))``
(``shape``: the classifier's input shape, a tuple of ints), under a seeded RNG (forked: the global
RNG is left alone), and must return an ``nn.Module`` that maps ``(n, latent_dim)`` standard-normal
codes to ``(n, *shape)`` samples; images in ``[-1, 1]`` like the normalised data (App. E.2
"Details for Dataset"). ``strategy.generator.path``, if given, holds a state dict loaded into it;
otherwise the factory's own weights are used (e.g. a factory that loads a pretrained model).

:func:`generator_from_config` is the one function that builds FedGO's generator from a
``strategy.generator`` section, for the server and for every client alike (the clients build the
same module and load the server's weights into it), so **the module must be importable on every
client as well as on the server** (installed in each node's environment, or the same file at the
same path; a relative ``.py`` path is relative to each process's working directory), and a client
imports it only if its node operator allows it: node config ``allow-code`` (``true``, or the
module's package), ``FEDGO_ALLOW_CODE=1`` for simulated nodes (:mod:`fedgo_flwr.runtime.trust`). The
server's config chooses the module; what a client node runs is its own operator's choice.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from fedgo_flwr.gan.common import _seeded
from fedgo_flwr.gan.generators import build_generator
from fedgo_flwr.runtime.trust import check_import

__all__ = [
    "build_module_generator",
    "generator_from_config",
    "generator_output_problem",
    "load_generator_factory",
]

_SPEC_FORM = "'package.module:callable' or 'path/to/file.py:callable'"
_MAX_TEXT = 300


def _short(text: str) -> str:
    """One line of at most ``_MAX_TEXT`` characters (an error message stays readable)."""
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _split(spec: str) -> tuple[str, str]:
    target, sep, attr = str(spec).strip().rpartition(":")
    if not sep or not target.strip() or not attr.strip():
        raise ValueError(f"must have the form {_SPEC_FORM}")
    return target.strip(), attr.strip()


def _import_file(target: str) -> ModuleType:
    """The module of a ``.py`` file, imported once per process (cached by its absolute path)."""
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"cannot import {target!r}: no such file")
    name = "_fedgo_generator_" + hashlib.sha1(str(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {target!r}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ValueError(f"cannot import {target!r}: {type(exc).__name__}: {_short(exc)}") from exc
    return module


def load_generator_factory(
    spec: str, key: str = "strategy.generator.module"
) -> Callable[..., nn.Module]:
    """The callable named by ``spec`` (``"package.module:callable"`` or ``"file.py:callable"``;
    a dotted attribute such as ``"module:Class.create"`` works too), the value of the
    configuration key ``key``.

    In a client's handler the module is imported only if the node's own config allows it
    (:func:`fedgo_flwr.runtime.trust.check_import`, node config ``allow-code``).

    Raises:
        ValueError: a malformed ``spec``, a module that does not import (the message carries
            the import error), a missing attribute, or an attribute that is not callable.
        fedgo_flwr.runtime.trust.CodeNotAllowed: on a client node that does not allow the module.
    """
    target, attr = _split(spec)
    check_import(target, key)
    if target.endswith(".py"):
        module = _import_file(target)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise ValueError(
                f"cannot import {target!r}: {type(exc).__name__}: {_short(exc)}"
            ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {target!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(
            f"{target}:{attr} is not callable (a {type(obj).__name__}); name a function or "
            "class that returns the generator"
        )
    return obj


def build_module_generator(
    spec: str, latent_dim: int, shape: Sequence[int], *, seed: int | None = None
) -> nn.Module:
    """``factory(latent_dim=latent_dim, shape=shape)`` of ``spec``, its RNG seeded by ``seed``.

    The module gets the attributes ``latent_dim`` and ``output_shape`` (as this project's own
    generators have) unless it defines them itself.

    Raises:
        ValueError: the factory cannot be loaded (see :func:`load_generator_factory`), raises,
            or returns something other than an ``nn.Module``.
    """
    factory = load_generator_factory(spec)
    shape = tuple(int(s) for s in shape)
    try:
        with _seeded(seed):
            model = factory(latent_dim=int(latent_dim), shape=shape)
    except Exception as exc:
        raise ValueError(
            f"{spec} failed when called with latent_dim={int(latent_dim)}, shape={shape}: "
            f"{type(exc).__name__}: {_short(exc)}"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ValueError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
    if not hasattr(model, "latent_dim"):
        model.latent_dim = int(latent_dim)
    if not hasattr(model, "output_shape"):
        model.output_shape = shape
    return model


def generator_from_config(gp: Any, shape: Sequence[int], *, seed: int | None = None) -> nn.Module:
    """FedGO's generator of a ``strategy.generator`` section (``gp``, a
    :class:`~fedgo_flwr.gan.settings.GeneratorConfig`) for samples of ``shape``.

    ``gp.module`` set: the user's factory (:func:`build_module_generator`); otherwise this
    project's ``gp.name`` (:func:`~fedgo_flwr.gan.generators.build_generator` with
    ``gp.model_kwargs()``). Initial weights seeded by ``seed`` either way. The server and the
    clients build the generator here, so both get the same architecture.
    """
    if gp.module:
        return build_module_generator(gp.module, gp.latent_dim, shape, seed=seed)
    return build_generator(gp.name, gp.latent_dim, shape, seed=seed, **gp.model_kwargs())


def generator_output_problem(
    generator: nn.Module, latent_dim: int, shape: Sequence[int]
) -> str | None:
    """What is wrong with ``generator``'s output on 2 seeded codes, or ``None``.

    It must be a tensor of shape ``(2, *shape)`` with finite values. Run in eval mode without
    gradients (the module's train/eval mode is restored); the global RNG is left alone.
    """
    shape = tuple(int(s) for s in shape)
    z = torch.randn(2, int(latent_dim), generator=torch.Generator().manual_seed(0))
    mode = generator.training
    try:
        generator.eval()
        with torch.no_grad(), _seeded(0):
            out = generator(z)
    except Exception as exc:
        return (
            f"the generator fails on 2 codes of shape {tuple(z.shape)}: "
            f"{type(exc).__name__}: {_short(exc)}"
        )
    finally:
        generator.train(mode)
    if not isinstance(out, torch.Tensor):
        return f"the generator returns a {type(out).__name__} for 2 codes, not a tensor"
    need = (2, *shape)
    if tuple(out.shape) != need:
        return (
            f"the generator's output for 2 codes has shape {tuple(out.shape)}; the "
            f"classifier's input needs {need} (latent_dim {int(latent_dim)}, input shape {shape})"
        )
    if not torch.isfinite(out).all():
        return "the generator's output for 2 codes is not finite (NaN or inf)"
    return None
