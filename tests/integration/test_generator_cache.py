"""``strategy.generator.cache``: a G1 generator trained once, reused bit for bit by a later run
with the same server data, settings and seed, and never by one that differs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from helpers import (
    SMALL_GAN,
    held_one_thread,
    log_messages,
    rows_of,
    tiny_config,
    without_timing,
)

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.gan import cache as gen_cache
from strategies import _prefl

FEDGO = [
    "rounds=2",
    "strategy.name=fedgo",
    "strategy.distill.epochs=1",
    "strategy.generator.steps=4",
    "strategy.discriminator.epochs=1",
    "data.alpha=1.0",
    *SMALL_GAN,
]


def run(out: Path, cache: Path, *overrides: str) -> tuple[list[dict], dict]:
    run_inprocess(tiny_config(out, *FEDGO, f"strategy.generator.cache={cache}", *overrides))
    return rows_of(out), json.loads((out / "prefl.json").read_text())


def state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A run that fills an empty cache, and the cache."""
    root = tmp_path_factory.mktemp("gencache")
    cache = root / "cache"
    with held_one_thread():
        rows, prefl = run(root / "first", cache)
    return root, cache, rows, prefl


def test_a_miss_trains_and_stores_the_generator(first) -> None:
    root, cache, _, prefl = first
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1
    assert prefl["generator"]["source"] == "trained on server data (G1)"
    assert prefl["generator"]["cache"] == str(entries[0])
    stored = state(entries[0] / "generator.pt")
    saved = state(root / "first" / "generator.pt")
    assert stored.keys() == saved.keys()
    assert all(torch.equal(stored[k], saved[k]) for k in saved)


def test_a_hit_loads_it_and_the_run_is_the_same_bit_for_bit(first, flwr_log) -> None:
    root, cache, rows, prefl = first
    flwr_log.set_level(logging.INFO, logger="flwr")
    again, prefl2 = run(root / "second", cache)
    assert prefl2["generator"]["source"] == "trained on server data (G1), from the cache"
    assert prefl2["generator"]["steps"] == prefl["generator"]["steps"] == 4
    assert any("generator from the cache" in m for m in log_messages(flwr_log))
    assert without_timing(again) == without_timing(rows)
    model, model2 = state(root / "first" / "model.pt"), state(root / "second" / "model.pt")
    assert all(torch.equal(model[k], model2[k]) for k in model)


def test_a_stopped_training_goes_on_in_the_next_run_and_ends_the_same(
    first, tmp_path, monkeypatch
) -> None:
    """A run stopped while its generator trains (here: at step 2 of 4, a snapshot after every
    step) leaves the snapshot in the cache entry's folder; the next run with the same key goes
    on from it and computes what the uninterrupted run did."""
    _, _, rows, prefl = first
    cache = tmp_path / "cache"
    real = _prefl.train_wgan_gp

    def stopped(*args, **kwargs):
        def stop(done: int) -> None:
            if done == 2:
                raise KeyboardInterrupt  # what a Ctrl-C or a session's end does mid-training

        return real(*args, **{**kwargs, "save_every": 0, "on_step": stop})

    monkeypatch.setattr(_prefl, "train_wgan_gp", stopped)
    with held_one_thread(), pytest.raises(KeyboardInterrupt):
        run(tmp_path / "stopped", cache)
    (snapshot,) = cache.glob("*/training.pt")
    assert not (snapshot.parent / "generator.pt").exists()
    monkeypatch.setattr(_prefl, "train_wgan_gp", real)
    with held_one_thread():
        again, prefl2 = run(tmp_path / "resumed", cache)
    assert prefl2["generator"]["resumed_at"] == 2 and "resumed_at" not in prefl["generator"]
    assert without_timing(again) == without_timing(rows)
    assert not snapshot.exists() and (snapshot.parent / "generator.pt").is_file()


def test_other_settings_or_seed_miss(first) -> None:
    root, cache, _, _ = first
    _, prefl = run(root / "lambda", cache, "strategy.generator.gp_lambda=5")
    assert "from the cache" not in prefl["generator"]["source"]
    _, prefl = run(root / "seed", cache, "seed=1")
    assert "from the cache" not in prefl["generator"]["source"]
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 3


def test_a_tampered_entry_is_refused_and_retrained(tmp_path) -> None:
    cache = tmp_path / "cache"
    key = {"version": gen_cache.GENERATOR_CACHE_VERSION, "x": 1}
    entry = gen_cache.store_generator(cache, key, {"w": torch.ones(2)}, {"steps": 4})
    hit, why = gen_cache.load_cached_generator(cache, key)
    assert hit is not None and torch.equal(hit.state["w"], torch.ones(2)) and why == "hit"
    torch.save({"w": torch.zeros(2)}, entry / "generator.pt")
    hit, why = gen_cache.load_cached_generator(cache, key)
    assert hit is None and "SHA-256" in why
    meta = json.loads((entry / "meta.json").read_text())
    meta["key"]["x"] = 2  # an entry whose recorded key is not the one it is filed under
    (entry / "meta.json").write_text(json.dumps(meta))
    assert gen_cache.load_cached_generator(cache, key)[0] is None
    assert gen_cache.load_cached_generator(cache, {**key, "x": 3}) == (
        None,
        f"no entry {cache / gen_cache.key_hash({**key, 'x': 3})}",
    )


def test_the_key_changes_with_each_thing_the_generator_depends_on() -> None:
    from fedgo_flwr.gan.settings import GeneratorConfig

    images = torch.zeros(4, 1, 8, 8, dtype=torch.uint8).numpy()
    base = dict(seed=0, data=images, flip=True, augment=True, device=torch.device("cpu"))
    key = gen_cache.generator_key(GeneratorConfig(), **base)
    other_images = images.copy()
    other_images[0, 0, 0, 0] = 1
    variants = [
        gen_cache.generator_key(GeneratorConfig(width=32), **base),
        gen_cache.generator_key(GeneratorConfig(steps=2), **base),
        gen_cache.generator_key(GeneratorConfig(), **{**base, "seed": 1}),
        gen_cache.generator_key(GeneratorConfig(), **{**base, "data": other_images}),
        gen_cache.generator_key(GeneratorConfig(), **{**base, "augment": False}),
    ]
    hashes = {gen_cache.key_hash(k) for k in [key, *variants]}
    assert len(hashes) == 6
    # What does not shape WGAN-GP's training is not in the key.
    same = gen_cache.generator_key(GeneratorConfig(path=None, local_epochs=7), **base)
    assert gen_cache.key_hash(same) == gen_cache.key_hash(key)
