"""Sample grids of the G1 generators that report runs took from the generator cache.

FedGO's scenario G1 (Jang, Park, Lee, ICML 2025, Alg. 2) trains a WGAN-GP generator on the
server's images; with ``strategy.generator.cache`` the runs of one seed share it
(:mod:`fedgo_flwr.gan.cache`). For each seed, this script finds the cache entry whose key has that
seed and the generator settings of the given config (``strategy.generator``: network, width,
latent size, steps, batch, learning rate, critic steps, penalty), draws 64 samples from fixed
latent codes (``make_rng(0, "sample-grid")``, as ``discriminator_variants.py``'s grids) and
writes ``generator-seed<seed>.png`` and ``generators.md`` (each entry's folder, its file's
SHA-256, steps and last Wasserstein estimate) to ``--out``. A seed with no entry, or with
several (e.g. trained with other thread counts), is an error naming them.

    python -m benchmarks.generator_grids CONFIG --seeds 100 101 --cache .cache/generators \
        --out DIR [k=v ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from torchvision.utils import save_image

from fedgo_flwr.gan import sample
from fedgo_flwr.gan.cache import SETTINGS, CachedGenerator, load_cached_generator
from fedgo_flwr.runtime.fileio import atomic_write_text
from fedgo_flwr.runtime.rng import make_rng
from strategies import load_experiment
from strategies._prefl import seeded_generator

SHAPE = (3, 32, 32)  # the CIFAR-10 images of the configs this is for


class NoEntry(LookupError):
    """No single cache entry for a seed."""


def entry_of(cache: Path, settings: dict, seed: int) -> tuple[dict, CachedGenerator]:
    """The cache entry (its ``meta.json`` and generator) of ``seed`` and ``settings``."""
    metas = [json.loads(f.read_text()) for f in sorted(cache.glob("*/meta.json"))]
    metas = [m for m in metas if m["key"].get("seed") == seed]
    metas = [m for m in metas if m["key"].get("generator") == settings]
    keys = [m["key"] for m in metas]
    if len(keys) != 1:
        found = ", ".join(sorted(str(k.get("threads", k.get("gpu"))) for k in keys)) or "none"
        raise NoEntry(f"seed {seed}: {len(keys)} cache entries in {cache} for {settings} ({found})")
    hit, why = load_cached_generator(cache, keys[0])
    if hit is None:
        raise NoEntry(f"seed {seed}: {why}")
    return metas[0], hit


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--cache", type=Path, default=Path(".cache/generators"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="k=v config overrides")
    args = parser.parse_intermixed_args(argv)
    cfg = load_experiment(args.config, args.overrides)
    gp = cfg.strategy.params.generator
    settings = {k: getattr(gp, k) for k in SETTINGS}
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# The report runs' G1 generators (generator_grids.py)",
        "",
        f"`{args.config}` {' '.join(args.overrides)}; 64 samples each, fixed latent codes.",
        "",
        "| seed | grid | steps | last Wasserstein estimate | cache entry | generator.pt SHA-256 |",
        "|---:|---|---:|---:|---|---|",
    ]
    for seed in args.seeds:
        try:
            meta, hit = entry_of(args.cache, settings, seed)
        except NoEntry as exc:
            print(f"generator_grids: {exc}", file=sys.stderr)
            return 1
        generator = seeded_generator(seed, gp, SHAPE)
        generator.load_state_dict(hit.state)
        grid = args.out / f"generator-seed{seed}.png"
        x = sample(generator, 64, rng=make_rng(0, "sample-grid"))
        save_image(x * 0.5 + 0.5, grid, nrow=8, padding=1)
        lines.append(
            f"| {seed} | [{grid.name}]({grid.name}) | {hit.stats.get('steps')} | "
            f"{hit.stats.get('wasserstein', float('nan')):.3f} | {hit.entry.name} | "
            f"{meta['sha256'][:16]} |"
        )
    atomic_write_text(args.out / "generators.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
