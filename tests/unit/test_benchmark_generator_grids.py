"""benchmarks/generator_grids.py draws the cached generator of each seed and settings."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks import generator_grids
from fedgo_flwr.gan.cache import SETTINGS, store_generator
from strategies import load_experiment
from strategies._prefl import seeded_generator

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "conf/bench/cifar10-cpu-bn.yaml"
SMALL = ["strategy.name=fedgo", "strategy.generator.width=8", "strategy.generator.latent_dim=16"]


def store(cache: Path, seed: int, overrides: list[str], threads: int = 1) -> dict:
    """A cached generator of ``seed`` (its weights: a seeded fresh generator's, scaled)."""
    gp = load_experiment(ROOT / CONFIG, overrides).strategy.params.generator
    state = {k: v * 0.5 for k, v in seeded_generator(seed, gp, (3, 32, 32)).state_dict().items()}
    key = {"seed": seed, "generator": {k: getattr(gp, k) for k in SETTINGS}, "threads": threads}
    store_generator(cache, key, state, {"steps": gp.steps, "wasserstein": 1.25})
    return state


def test_grid_and_row_of_each_seeds_entry_and_other_settings_ignored(tmp_path, monkeypatch):
    cache, out = tmp_path / "cache", tmp_path / "out"
    state = store(cache, 7, SMALL)
    store(cache, 8, SMALL)
    store(cache, 7, [*SMALL, "strategy.generator.steps=400"])  # other settings: not this one
    drawn = []
    real_sample = generator_grids.sample

    def spy(generator, n, **kw):
        drawn.append({k: v.clone() for k, v in generator.state_dict().items()})
        return real_sample(generator, n, **kw)

    monkeypatch.setattr(generator_grids, "sample", spy)
    argv = [CONFIG, "--seeds", "7", "8", "--cache", str(cache), "--out", str(out), *SMALL]
    assert generator_grids.main(argv) == 0
    assert (out / "generator-seed7.png").is_file() and (out / "generator-seed8.png").is_file()
    assert all(torch.equal(drawn[0][k], state[k]) for k in state)  # seed 7's stored weights
    table = (out / "generators.md").read_text()
    assert "| 7 | [generator-seed7.png](generator-seed7.png) | 200 | 1.250 |" in table


def test_a_seed_without_a_single_entry_is_an_error_naming_it(tmp_path, capsys):
    cache = tmp_path / "cache"
    store(cache, 7, SMALL)
    store(cache, 7, SMALL, threads=2)
    argv = [CONFIG, "--seeds", "7", "--cache", str(cache), "--out", str(tmp_path / "o"), *SMALL]
    assert generator_grids.main(argv) == 1
    assert "seed 7: 2 cache entries" in capsys.readouterr().err
    assert generator_grids.main([*argv[:2], "9", *argv[3:]]) == 1
    assert "seed 9: 0 cache entries" in capsys.readouterr().err
