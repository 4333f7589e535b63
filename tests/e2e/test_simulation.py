"""End-to-end Flower simulations (Ray backend) on tiny digits runs, one per Ray path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.simulation import run_simulation

from fedgo_app.client_app import app as client_app
from fedgo_app.inprocess import run_inprocess
from fedgo_app.server_app import server_app_for
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

TINY = [
    "rounds=2",
    "data.num_clients=4",
    "fraction=0.5",
    "data.alpha=1.0",
    "train.local_epochs=2",
]


def simulate(
    tmp_path: Path, *overrides: str, supernodes: int | None = None
) -> tuple[list[dict], dict]:
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path}", *overrides])
    run_simulation(
        server_app=server_app_for(cfg),
        client_app=client_app,
        num_supernodes=supernodes or cfg.data.num_clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return rows, json.loads((tmp_path / "summary.json").read_text())


TINY_GAN = [
    "strategy.generator.steps=5",
    "strategy.generator.width=16",
    "strategy.generator.batch_size=16",
    "strategy.generator.n_critic=1",
    "strategy.discriminator.epochs=1",
]
STRATEGY_ARGS = {
    "scaffold": [],
    "fedgo": ["strategy.distill.epochs=2", *TINY_GAN],
}
"""A Ray start-up costs about 15 s of this tier, so each Ray run covers a path of its own: a
stateful client on shared nodes (SCAFFOLD), the server's GAN and discriminators (FedGO), and
below faults (FedDF), cohorts (CPFL) and the one-shot round (Co-Boosting). FedAvg under Ray:
``tests/e2e/test_ray_cluster.py``; SCAFFOLD again through ``run.sh``, killed and resumed:
``tests/e2e/test_run_sh.py``; every strategy in process: ``tests/integration``."""


SUPERNODES = {"scaffold": 2, "fedgo": 3}
"""Strategies simulated on fewer nodes than clients (a node serves several, in turn)."""


@pytest.mark.parametrize("strategy", list(STRATEGY_ARGS))
def test_strategy_runs_end_to_end(tmp_path, strategy):
    rows, summary = simulate(
        tmp_path,
        f"strategy.name={strategy}",
        *STRATEGY_ARGS[strategy],
        supernodes=SUPERNODES.get(strategy),
    )
    assert [r["round"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert row["clients_sampled"] == 2 and row["clients_replied"] == 2
        assert row["clients_failed"] == 0
        assert 0.0 <= row["test_accuracy"] <= 1.0 and row["round_time"] > 0
    # Two rounds of training on digits must beat the untrained model.
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.1
    assert summary["final_accuracy"] == rows[-1]["test_accuracy"]
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "model.pt").exists()
    partition = json.loads((tmp_path / "partition.json").read_text())
    assert len(partition["class_histogram"]) == 4
    if strategy == "fedgo":
        assert rows[-1]["distill_steps"] > 0 and "ensemble_test_accuracy" in rows[-1]
    # Stateful, on shared nodes (fewer nodes than clients): the same run without Ray, one node
    # per client, must agree (so the Ray run is a function of its seed).
    cfg = load_experiment(
        ROOT / "conf/default.yaml",
        [
            *TINY,
            f"output_dir={tmp_path / 'inprocess'}",
            f"strategy.name={strategy}",
            *STRATEGY_ARGS[strategy],
        ],
    )
    run_inprocess(cfg)
    lines = (tmp_path / "inprocess" / "metrics.jsonl").read_text().splitlines()
    keys = ("test_accuracy", "test_loss", "train_loss")
    local = [[json.loads(x).get(k) for k in keys] for x in lines]
    assert local == [[r.get(k) for k in keys] for r in rows]
    if strategy == "fedgo":
        prefl = json.loads((tmp_path / "prefl.json").read_text())
        assert prefl["missing_discriminators"] == [] and len(prefl["discriminators"]) == 4


def test_faulty_clients_are_survived_under_ray(tmp_path, monkeypatch):
    """Under the Ray runtime: round 1 a client crashes and another replies NaN weights; round 2
    a client hangs past ``round_timeout``. Each round completes with the rest; FedDF's weights
    cover only the clients that replied. The simulated nodes opt in to the faults through their
    environment (they have no node config of their own), which Ray's workers inherit."""
    from fedgo_flwr.learning.task import sample_clients

    monkeypatch.setenv("FEDGO_ALLOW_FAULTS", "1")

    r1, r2 = sample_clients(0, 1, 4, 2), sample_clients(0, 2, 4, 2)
    faults = (
        f"faults=[{{partition: {r1[0]}, round: 1, kind: crash}}, "
        f"{{partition: {r1[1]}, round: 1, kind: nan}}, "
        f"{{partition: {r2[0]}, round: 2, kind: hang, seconds: 30}}]"
    )
    rows, _ = simulate(
        tmp_path,
        "strategy.name=feddf",
        "strategy.distill.epochs=1",
        # Round 2 waits all of it for the hanging client. Round 1 must end within it: the
        # workers imported the app for node discovery, and load the digits in their first call
        # (round 1 took 3.3 s on an idle machine): 20 s leaves room for a test beside it.
        "round_timeout=20",
        faults,
    )
    assert rows[1]["clients_replied"] == 0 and rows[1]["clients_failed"] == 2
    assert rows[1]["test_accuracy"] == rows[0]["test_accuracy"]  # nothing usable: model kept
    assert rows[2]["clients_replied"] == 1 and rows[2]["clients_failed"] == 1
    assert rows[2]["distill_steps"] > 0
    assert rows[2]["test_accuracy"] != rows[1]["test_accuracy"]


def test_cpfl_cohorts_train_side_by_side_under_ray(tmp_path):
    """CPFL's rounds send each running cohort's own model; under Ray the run equals the
    in-process one (cohorts, stopping, distillation)."""
    cpfl = [
        "rounds=4",
        "data.num_clients=4",
        "strategy.cohorts=2",
        "strategy.window=2",
        "strategy.patience=2",
        "strategy.distill.epochs=2",
        "strategy.cohort_eval_every=2",
    ]
    cfg = load_experiment(ROOT / "conf/cpfl.yaml", [*cpfl, f"output_dir={tmp_path / 'ray'}"])
    run_simulation(
        server_app=server_app_for(cfg),
        client_app=client_app,
        num_supernodes=cfg.data.num_clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    run_inprocess(
        load_experiment(ROOT / "conf/cpfl.yaml", [*cpfl, f"output_dir={tmp_path / 'local'}"])
    )

    def rows(name: str) -> list[dict]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [
            {k: r.get(k) for k in ("round", "test_accuracy", "cohorts")}
            for r in map(json.loads, lines)
        ]

    ray, local = rows("ray"), rows("local")
    assert ray == local
    assert [c["clients_sampled"] for c in ray[1]["cohorts"]] == [2, 2]
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["strategy"] == "cpfl" and summary["final_accuracy"] == ray[-1]["test_accuracy"]


def test_coboosting_one_round_under_ray(tmp_path):
    """The one-shot round under Ray (clients of two architectures, discriminators uploaded with
    the models) equals the in-process run, server epochs included."""
    tiny = [
        "data.num_clients=4",
        "train.local_epochs=1",
        "strategy.epochs=2",
        "strategy.nz=16",
        "strategy.ngf=8",
        "strategy.synthesis.batch_size=16",
        "strategy.synthesis.steps=2",
        "strategy.boost.batch_size=16",
        "strategy.discriminator.epochs=1",
        "strategy.name=coboosting_fedgo",
        "model.client_models=[cnn, lenet5]",
        "eval.every=1",
    ]
    conf = ROOT / "conf/coboosting.yaml"
    cfg = load_experiment(conf, [*tiny, f"output_dir={tmp_path / 'ray'}"])
    run_simulation(
        server_app=server_app_for(cfg),
        client_app=client_app,
        num_supernodes=cfg.data.num_clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    run_inprocess(load_experiment(conf, [*tiny, f"output_dir={tmp_path / 'local'}"]))

    def rows(name: str) -> list[dict]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        keep = ("round", "test_accuracy", "ensemble_weights", "ensemble_accuracy_fedgo")
        return [{k: r.get(k) for k in keep} for r in map(json.loads, lines)]

    assert rows("ray") == rows("local")
    assert len(rows("ray")) == 4
