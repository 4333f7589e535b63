"""The adaptive adversary's edits (:mod:`benchmarks.adversary`), checked by hand: each sits
just under the bound it is sized to, and keeps every dtype and shape."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from benchmarks import adversary as adv

BOUNDS = adv.Bounds(
    update_bound=50.0, upload_bound=10.0, clip_factor=10.0, discriminator_bound=25.0
)


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "features.weight": rng.normal(size=(4, 3)).astype(np.float32),
        "features.bias": rng.normal(size=4).astype(np.float32),
        "classifier.weight": rng.normal(size=(3, 4)).astype(np.float32),
        "classifier.bias": rng.normal(size=3).astype(np.float32),
        "steps": np.array(7, np.int64),
    }


def test_the_last_layer_is_the_last_matrix_and_the_vector_after_it():
    assert adv.last_layer(model()) == ("classifier.weight", "classifier.bias")
    no_bias = {k: v for k, v in model().items() if k != "classifier.bias"}
    assert adv.last_layer(no_bias) == ("classifier.weight", None)


@pytest.mark.parametrize("edit", [adv.sign_flip, adv.scaled, adv.one_class_bias])
def test_an_update_attack_sits_just_under_update_bound(edit):
    x, honest = model(0), model(1)
    y = edit(honest, x, BOUNDS)
    ratio = adv.norm(y, x) / adv.norm(x)
    expected = 49.0 if edit is adv.scaled else 0.99 * 50.0
    assert ratio == pytest.approx(expected, rel=1e-5) and ratio < 50.0
    assert {k: (v.dtype, v.shape) for k, v in y.items()} == {
        k: (v.dtype, v.shape) for k, v in honest.items()
    }
    assert y["steps"] == honest["steps"]  # integer buffers are left alone


def test_sign_flip_points_against_the_honest_update():
    x, honest = model(0), model(1)
    y = adv.sign_flip(honest, x, BOUNDS)
    k = "features.weight"
    cos = np.sum((y[k] - x[k]) * (honest[k] - x[k])) / (
        np.linalg.norm(y[k] - x[k]) * np.linalg.norm(honest[k] - x[k])
    )
    assert cos == pytest.approx(-1.0, abs=1e-5)


def test_one_class_bias_moves_class_0s_bias_alone():
    x = model(0)
    y = adv.one_class_bias(model(1), x, BOUNDS)
    moved = {k for k in x if not np.array_equal(x[k], y[k])}
    assert moved == {"classifier.bias"}
    assert np.flatnonzero(y["classifier.bias"] != x["classifier.bias"]).tolist() == [0]


def test_a_rolled_last_layer_scores_class_c_as_class_c_plus_1_and_keeps_every_norm():
    honest = model(1)
    y = adv.rolled_last_layer(honest)
    assert np.array_equal(y["classifier.weight"][1], honest["classifier.weight"][0])
    assert y["classifier.bias"][0] == honest["classifier.bias"][-1]
    assert adv.norm(y) == pytest.approx(adv.norm(honest))


def test_an_extra_upload_is_scaled_to_its_absolute_bound_or_by_upload_bound():
    ref = {"c": np.zeros(4, np.float32), "counts": np.ones(2, np.float32)}
    up = {"c": np.array([3.0, 4.0, 0.0, 0.0], np.float32), "counts": np.ones(2, np.float32)}
    absolute = adv.upload_scaled(up, ref, BOUNDS, absolute=100.0)
    assert adv.norm({"c": absolute["c"]}) == pytest.approx(99.0)
    relative = adv.upload_scaled(up, None, BOUNDS, absolute=None)
    assert adv.norm({"c": relative["c"]}) == pytest.approx(5.0 * 9.9)
    assert relative["counts"] is up["counts"]


def test_a_discriminator_without_a_bias_has_its_last_layer_scaled():
    disc = {"net.0.weight": np.ones((2, 3), np.float32)}
    disc["net.8.weight"] = np.ones((1, 2), np.float32)
    y = adv.discriminator_bias(disc, BOUNDS)
    # just under discriminator_bound (25), not upload_bound (10)
    assert np.allclose(y["net.8.weight"], 24.75) and y["net.0.weight"] is disc["net.0.weight"]
    with_bias = {**disc, "net.8.bias": np.zeros(1, np.float32)}
    y = adv.discriminator_bias(with_bias, BOUNDS)
    assert y["net.8.bias"][0] == 50.0 and y["net.8.weight"] is with_bias["net.8.weight"]


def test_a_run_freezes_only_if_no_round_recovers():
    row = lambda r, n, back=0: {"round": r, "clients_replied": n, "rolled_back": back}  # noqa: E731
    assert adv.froze([row(1, 5), row(2, 5), row(3, 4)], 1) is None
    assert adv.froze([row(1, 5), row(2, 0), row(3, 4)], 1) is None  # recovered
    assert "the last" in adv.froze([row(1, 5), row(2, 4), row(3, 0)], 1)
    assert adv.froze([row(1, 5), row(2, 4), row(3, 0, back=1)], 1) is None  # ends rolled back
    assert "nothing was rolled back" in adv.froze([row(1, 5), row(2, 0), row(3, 0), row(4, 5)], 1)
    assert adv.froze([row(1, 5), row(2, 0), row(3, 0, back=1), row(4, 5)], 1) is None


def test_the_profile_summary_counts_cases_freezes_and_failures_against_both_yardsticks(
    tmp_path, capsys
):
    from benchmarks import adversary_profile as prof

    def case(kind, mode, acc, **kw):
        return adv.Case("s", kind, mode, clean_accuracy=0.8, accuracy=acc, **kw)

    cases = [
        case(adv.WITHHOLD, "every", 0.6),
        case("sign_flip", "once", 0.65, failure="below"),  # 0.15 below clean, not withheld
        case("scaled", "every", 0.1, failure="below", froze="rounds [4]"),
        case("replay", "once", 0.79),
        adv.Case("s", "loss_report", "once", skipped="no reported validation loss"),
    ]
    (s,) = prof.summarise(cases)
    assert (s.cases, s.freezes) == (3, 1)
    assert s.withheld == pytest.approx(0.2) and s.worst == pytest.approx(0.7)
    assert s.worst_case == "scaled/every"
    assert s.failures == ["sign_flip/once (NEW)", "scaled/every (NEW)"]
    assert s.beyond == ["scaled/every (NEW)"]
    assert s.skipped == {"loss_report": "no reported validation loss"}
    table = prof.markdown([s])
    assert table.splitlines()[2].startswith("| s | 0.800 | +0.200 | 3 | 1 | +0.700 (scaled/every)")
    saved = tmp_path / "cases.json"
    saved.write_text(json.dumps([dataclasses.asdict(c) for c in cases]))
    assert prof.main(["--merge", str(saved), "--markdown", str(tmp_path / "t.md")]) == 0
    assert "| s | 0.800 |" in (tmp_path / "t.md").read_text()
    assert "s: 3 cases, 1 freezes" in capsys.readouterr().out


def test_the_profile_runs_the_seed_and_overrides_it_is_given(monkeypatch, tmp_path):
    """``--seed`` reaches every case (the per-seed tables are this CLI run per seed) and
    ``--set`` every run, clean and attacked; an unknown strategy is one usage error."""
    from benchmarks import adversary_profile as prof

    calls = []
    monkeypatch.setattr(prof, "profile", lambda *a: calls.append(a) or [])
    monkeypatch.setattr(adv, "EXTRA", [])
    argv = ["--strategies", "fedavg", "--kinds", "sign_flip", "--modes", "every"]
    assert prof.main([*argv, "--seed", "2", "--set", "strategy.aggregation.rule=median"]) == 0
    assert calls == [(["fedavg"], ["sign_flip"], ["every"], 2)]
    assert adv.EXTRA == ["strategy.aggregation.rule=median"]
    assert prof.main(argv) == 0 and calls[-1][3] == 0  # seed 0 unless told
    with pytest.raises(SystemExit):
        prof.main(["--strategies", "nosuch"])
