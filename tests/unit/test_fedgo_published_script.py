"""benchmarks/fedgo_published_seeds.sh: which sweeps it starts, in which order (a pair of seeds'
generator-training runs first, then the runs that reuse their cached generators), that its
variants are valid configurations saying what their names say, and where the table goes (the
sweep replaced by a stand-in that records its arguments)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from test_headline_script import _variants, run_with_stand_in

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fedgo_published_seeds.sh"


def _run(tmp_path: Path, *seeds: str) -> tuple[subprocess.CompletedProcess, list, Path, Path]:
    kept, out = tmp_path / "kept", tmp_path / "out"
    env = {"FEDGO_PUBLISHED_KEPT": str(kept), "GEN_STEPS": "1234"}
    args = [".cache/cifar10-jpg", str(out), *seeds]
    done, calls = run_with_stand_in(tmp_path, SCRIPT, env, args, table_exit=1)
    return done, calls, kept, out


def test_pairs_of_seeds_train_their_generators_first(tmp_path: Path) -> None:
    done, calls, kept, out = _run(tmp_path, "100", "101", "102")
    assert done.returncode == 0, done.stderr
    assert len(calls) == 6  # per pair: the generators' runs, the others, the table
    for pair, first in (("100,101", 0), ("102", 3)):
        gen, rest, table = calls[first : first + 3]
        assert _variants(gen) == ["fedgo_published"]
        assert _variants(rest) == ["feddf", "fedgo_odds"]
        assert _variants(table) == ["feddf", "fedgo_published", "fedgo_odds"]
        assert gen[gen.index("--seeds") + 1] == rest[rest.index("--seeds") + 1] == pair
        assert table[table.index("--seeds") + 1] == "report" and "--table-only" in table
        assert table[table.index("--baseline") + 1] == "feddf"
        for call in (gen, rest, table):
            assert call[call.index("--out") + 1] == str(out)
            assert call[call.index("--archive") + 1] == str(kept / "runs.tar.xz")
            assert "data.path=.cache/cifar10-jpg" in call and "resources.server_cpus=1" in call
    assert (kept / "table.md").read_text() == f"table of {out}\n"


def test_the_variants_are_what_their_names_say(tmp_path: Path) -> None:
    from strategies import load_experiment

    _, calls, _, _ = _run(tmp_path, "100")
    table = calls[2]
    words = {a.split("=", 1)[0]: shlex.split(a) for a in table if "=conf/" in a}
    cfgs = {}
    for name, (head, *overrides) in words.items():
        path = ROOT / head.split("=", 1)[1]
        cfgs[name] = load_experiment(path, [*overrides, "data.path=.cache/cifar10-jpg"])
    feddf, published, odds = cfgs["feddf"], cfgs["fedgo_published"], cfgs["fedgo_odds"]
    assert feddf.strategy.name == "feddf" and feddf.strategy.params.weighting == "uniform"
    for cfg in (published, odds):
        p = cfg.strategy.params
        assert cfg.strategy.name == "fedgo" and p.weighting == "fedgo"
        # the paper's odds exp(sigmoid(z)), the weighting's default when it is not set
        assert p.weighting_params.get("fedgo", {}).get("disc_mode", "double_sigmoid") == (
            "double_sigmoid"
        )
        assert p.generator.steps == 1234 and p.generator.cache
        assert (p.discriminator.epochs, p.discriminator.loss) == (30, "double_sigmoid")
        assert (p.discriminator.lr, p.discriminator.batch_size) == (2e-4, 64)
    assert published.strategy.params.weighting_params.get("fedgo", {}).get("sizes", True) is True
    assert odds.strategy.params.weighting_params["fedgo"]["sizes"] is False
    # the pairs differ from FedDF only in the strategy's own section
    assert feddf.data == published.data and feddf.train == published.train
    assert feddf.rounds == published.rounds == odds.rounds
