"""The adaptive adversary's edits: pure functions of a reply's arrays, the model the server
sent and the bounds in force (:class:`Bounds`), each sized to sit just under the bound that
would drop it (:data:`UNDER` of it). :mod:`benchmarks.adversary` applies them to one client's
replies in a run; ``tests/unit/test_adversary_attacks.py`` checks them by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNDER = 0.99
"""How close to a bound an attack sits: this fraction of it."""


# -- the bounds in force ------------------------------------------------------------------------
@dataclass(frozen=True)
class Bounds:
    """The bounds of a run's config that an attacker sizes its reply to (``None``: off)."""

    update_bound: float | None
    upload_bound: float | None
    clip_factor: float | None
    loss_bound: float | None = None
    control_delta: float | None = None  # SCAFFOLD's max_control_delta_norm
    discriminator_bound: float | None = None

    @classmethod
    def of(cls, cfg) -> Bounds:
        params = cfg.strategy.params
        agg = getattr(params, "aggregation", None)
        return cls(
            update_bound=getattr(agg, "update_bound", None),
            upload_bound=getattr(agg, "upload_bound", None),
            clip_factor=getattr(agg, "clip_factor", None),
            loss_bound=getattr(params, "loss_bound", None),
            control_delta=getattr(params, "max_control_delta_norm", None),
            discriminator_bound=getattr(agg, "discriminator_bound", None),
        )

    @property
    def update_budget(self) -> float:
        """The update norm an attacker may send, as a multiple of ``||x||``: just under
        ``update_bound``; without one, 50 (what the default would allow)."""
        return UNDER * (self.update_bound if self.update_bound is not None else 50.0)

    @property
    def upload_factor(self) -> float:
        return UNDER * (self.upload_bound if self.upload_bound is not None else 10.0)

    @property
    def discriminator_factor(self) -> float:
        """A discriminator's logit scale an attacker may send, as a multiple of the round's
        median: just under ``discriminator_bound``; without one, 25 (the default)."""
        return UNDER * (self.discriminator_bound if self.discriminator_bound is not None else 25.0)


# -- the attacks --------------------------------------------------------------------------------
Arrays = dict[str, np.ndarray]


def norm(arrays: Arrays, reference: Arrays | None = None) -> float:
    """``||arrays - reference||_2`` over the floating arrays (as the server measures)."""
    total = 0.0
    for k, v in arrays.items():
        if np.asarray(v).dtype.kind != "f":
            continue
        d = np.asarray(v, np.float64)
        if reference is not None:
            d = d - np.asarray(reference[k], np.float64)
        total += float(np.square(d).sum())
    return float(np.sqrt(total))


def _floats(arrays: Arrays) -> list[str]:
    return [k for k, v in arrays.items() if np.asarray(v).dtype.kind == "f"]


def last_layer(arrays: Arrays) -> tuple[str, str | None]:
    """The keys of the last layer: its weight and its bias (``None``: none), found as the last
    floating array with more than one dimension and the 1-D one after it."""
    floats = _floats(arrays)
    weights = [k for k in floats if np.ndim(arrays[k]) > 1]
    if not weights:
        raise ValueError("no weight matrix among the arrays")
    w = weights[-1]
    after = floats[floats.index(w) + 1 :]
    bias = after[0] if after and np.ndim(arrays[after[0]]) == 1 else None
    return w, bias


def _cast(new: Arrays, like: Arrays) -> Arrays:
    return {k: np.asarray(new[k]).astype(np.asarray(like[k]).dtype) for k in like}


def sign_flip(honest: Arrays, sent: Arrays, bounds: Bounds) -> Arrays:
    """``x - k (y - x)`` with ``||k (y - x)|| = budget * ||x||``."""
    step = norm(honest, sent)
    k = bounds.update_budget * norm(sent) / step if step > 0 else 0.0
    out = {
        key: (sent[key] - k * (np.float64(honest[key]) - sent[key]))
        if key in _floats(honest)
        else honest[key]
        for key in honest
    }
    return _cast(out, honest)


def scaled(honest: Arrays, sent: Arrays, bounds: Bounds) -> Arrays:
    """``x - (update_bound - 1) x``: an update ``update_bound - 1`` times the model."""
    c = (bounds.update_bound if bounds.update_bound is not None else 50.0) - 1
    out = {
        k: sent[k] - c * np.float64(sent[k]) if k in _floats(honest) else honest[k] for k in honest
    }
    return _cast(out, honest)


def one_class_bias(honest: Arrays, sent: Arrays, bounds: Bounds, cls: int = 0) -> Arrays:
    """``x`` with class ``cls``'s bias of the last layer raised by the whole budget (the
    weight's row where the layer has no bias)."""
    w, b = last_layer(sent)
    out = {k: np.array(sent[k], np.float64) if k in _floats(honest) else honest[k] for k in honest}
    budget = bounds.update_budget * norm(sent)
    if b is not None:
        out[b][cls] += budget
    else:
        row = out[w][cls]
        row += budget / np.sqrt(row.size)
    return _cast(out, honest)


def rolled_last_layer(honest: Arrays, sent: Arrays | None = None, bounds: Bounds | None = None):
    """The honest model with its last layer's rows rolled by one class: class ``c``'s
    output is scored as class ``c + 1``'s was."""
    w, b = last_layer(honest)
    out = dict(honest)
    out[w] = np.roll(honest[w], 1, axis=0)
    if b is not None:
        out[b] = np.roll(honest[b], 1, axis=0)
    return out


def discriminator_bias(honest: Arrays, bounds: Bounds, shift: float = 50.0) -> Arrays:
    """+``shift`` on the last bias; without one, the last layer scaled by the discriminator
    factor (its logits scaled by it: just under ``discriminator_bound``)."""
    w, b = last_layer(honest)
    out = dict(honest)
    if b is not None:
        out[b] = (np.float64(honest[b]) + shift).astype(honest[b].dtype)
    else:
        out[w] = (np.float64(honest[w]) * bounds.discriminator_factor).astype(honest[w].dtype)
    return out


def upload_scaled(
    honest: Arrays, reference: Arrays | None, bounds: Bounds, absolute: float | None
) -> Arrays:
    """``r + s (y - r)`` (``r``: ``reference``, else 0) with ``||s (y - r)||`` ``UNDER``
    times ``absolute``, or, without one, ``s = UNDER * upload_bound``. Arrays named
    ``counts`` (FedTGP's per-class counts) are left as they are."""
    keys = [k for k in _floats(honest) if k != "counts"]
    ref = {
        k: np.float64(reference[k]) if reference is not None and k in reference else 0.0
        for k in keys
    }
    size = float(np.sqrt(sum(np.square(np.float64(honest[k]) - ref[k]).sum() for k in keys)))
    if absolute is not None and size > 0:
        s = UNDER * absolute / size
    else:
        s = bounds.upload_factor
    out = dict(honest)
    for k in keys:
        out[k] = (ref[k] + s * (np.float64(honest[k]) - ref[k])).astype(honest[k].dtype)
    return out
