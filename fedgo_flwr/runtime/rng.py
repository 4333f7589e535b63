"""Seeded random-number generators (``rng``): one stable seed per purpose, round and client.

Everything random in a run (sampling, batch order, flips, latent codes, initialisation) draws
from an ``rng`` made here from the experiment seed and a tuple of keys naming its use, e.g.
``make_rng(seed, "train", round, client)``, so a run repeats exactly on CPU. The word
*generator* is kept for GAN generators.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(*keys: int | str) -> int:
    """A stable 63-bit seed from any tuple of keys, e.g. ``(seed, "train", round, client)``."""
    digest = hashlib.sha256(repr(tuple(keys)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_rng(*keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by :func:`derive_seed` of ``keys``."""
    rng = torch.Generator()
    rng.manual_seed(derive_seed(*keys))
    return rng
