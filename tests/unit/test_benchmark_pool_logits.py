"""benchmarks/pool_logits.py times DENSE's distillation pass with the pool's logits cached and
recomputed, on the same pool and engine settings."""

from __future__ import annotations

from benchmark_scripts import load_benchmark

from fedgo_flwr.models.classifiers import build_model


def test_table_has_a_row_per_pool_with_both_passes(tmp_path) -> None:
    bench = load_benchmark("pool_logits")
    out = tmp_path / "table.md"
    assert bench.main(["--pool", "6", "10", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| pool images | client models | pass, recomputed (s)")
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["6", "10"]
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "10"  # the preset's clients
        assert float(cells[2]) > 0 and float(cells[3]) > 0 and float(cells[5]) > 0
        assert cells[4].endswith("x") and float(cells[4][:-1]) > 0


def test_the_engines_differ_only_in_the_cache() -> None:
    bench = load_benchmark("pool_logits")
    cached, plain = bench.engine("cnn5", 2, True), bench.engine("cnn5", 2, False)
    assert cached.pool_logits is not None and plain.pool_logits is None
    assert not cached.boost.diversify and not cached.boost.reweight
    ref = build_model("cnn5", bench.SHAPE, bench.CLASSES)
    assert sum(p.numel() for p in cached.student.parameters()) == sum(
        p.numel() for p in ref.parameters()
    )
