"""The deployment engine end to end: a SuperLink and SuperNodes as separate processes.

One federation on 127.0.0.1 (free ports) for the whole module, started with the scripts of
``deploy/`` (``tests/deployment_helpers.py``): credentials from ``make-credentials.py``, a
SuperLink with TLS and SuperNode authentication (``superlink.sh``), the three known SuperNode
keys registered with ``flwr supernode register``, three SuperNodes (``supernode.sh``), and a
fourth SuperNode with an unregistered key that must be refused. Runs go through ``flwr run``
with a TLS connection in a private ``FLWR_HOME``. Every process started here (and everything
below it) is stopped at the end, and the test checks that none is left.
"""

from __future__ import annotations

import json
import math
import re
import signal
import time

import pytest
from deployment_helpers import (
    HAVE_FLOWER,
    Federation,
    Placement,
    RunResult,
    alive,
    kill_trees,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not HAVE_FLOWER, reason="needs the venv's Flower executables and Linux process tools"
    ),
]

K = 3
KILLED = 2  # the SuperNode that the last test kills
# Its heartbeat interval (s): Flower's shortest accepted, where the others keep Flower's 30.
# The SuperLink reports it unavailable at most 2 x this after its last heartbeat, which ends
# the round it misses (tests/short_heartbeat/sitecustomize.py).
HEARTBEAT = 10.0
# round_timeout of that run: only a backstop, far above the 2 x HEARTBEAT that end its second
# round and above a healthy round (about 16 s alone, 10-25 s beside other tests on 2 cores: a
# ClientApp process is started for every message), so no round races it.
TIMEOUT = 120

TINY = [
    "rounds=2",
    f"data.num_clients={K}",
    "fraction=1.0",
    "data.alpha=1.0",
    "train.local_epochs=1",
    "train.batch_size=32",
]
TINY_FEDGO = [
    "strategy.distill.epochs=1",
    "strategy.generator.steps=5",
    "strategy.generator.width=16",
    "strategy.generator.batch_size=16",
    "strategy.generator.n_critic=1",
    "strategy.discriminator.epochs=1",
]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    t0 = time.perf_counter()
    fed = Federation(
        tmp_path_factory.mktemp("deployment"), K, Placement(heartbeat_s=((KILLED, HEARTBEAT),))
    )
    try:
        fed.start()
        # A fourth client whose key was never registered: the SuperLink must refuse it.
        intruder = fed.spawn(
            "supernode-unregistered",
            fed.supernode_cmd("unregistered", K, K + 1, "127.0.0.1"),
            fed.work / "supernode-unregistered-home",
        )
        intruder.wait(timeout=120)
        fed.timings["federation start"] = time.perf_counter() - t0
        yield fed
    finally:
        fed.stop()
        fed.timings["whole module"] = time.perf_counter() - t0
        print("\n[test_deployment] timings (s): " + json.dumps(fed.timings))
        (fed.work / "timings.json").write_text(json.dumps(fed.timings, indent=1))
        left = alive(fed.stopped)
        assert not left, f"processes left running: {left}"


def check_rounds(result: RunResult, replied: list[int]) -> None:
    rows = result.rows
    assert [r["round"] for r in rows] == list(range(len(replied) + 1))
    for row, n in zip(rows[1:], replied, strict=True):
        assert row["clients_sampled"] == K
        assert row["clients_replied"] == n, row
        assert row["clients_failed"] == K - n, row
    for row in rows:
        assert math.isfinite(row["test_accuracy"]) and 0.0 <= row["test_accuracy"] <= 1.0
    assert result.summary["rounds"] == len(replied)
    assert result.summary["final_accuracy"] == rows[-1]["test_accuracy"]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]
    # The refused fourth SuperNode (partition-id 3) never took part.
    assert "partition-id 3" not in result.log
    assert json.loads((result.out_dir / "partition.json").read_text())["class_histogram"]


def test_only_registered_supernodes_join(federation):
    intruder = federation.procs["supernode-unregistered"]
    log = (federation.logs / "supernode-unregistered.log").read_text()
    # Flower logs its own exit code (305: SUPERNODE_CONNECTION_ERROR); the process exits with 1.
    assert intruder.returncode == 1, log[-2000:]
    assert "Exit Code: 305" in log and "Failed to activate SuperNode" in log
    nodes = federation.wait_online()
    assert sorted(int(n["node-id"]) for n in nodes) == sorted(federation.node_ids)
    assert all(n["status"] == "online" for n in nodes), nodes
    superlink_log = (federation.logs / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log
    activated = {int(n) for n in re.findall(r"Activated node_id=(\d+)", superlink_log)}
    assert activated == set(federation.node_ids)
    assert all(p.poll() is None for name, p in federation.procs.items() if "-unreg" not in name)


def test_fedgo_over_tls(federation):
    """FedGO end to end, one round: client 0 sends NaN weights, which are rejected, and the
    distillation weights cover the two clients that replied. The partitions are given by the
    node map of ``make-credentials.py`` (partition k: the node the SuperLink authenticated
    with key k), not by the nodes' claims."""
    node_map = federation.creds / "node-map.json"
    result = federation.run(
        "fedgo",
        "conf/fedgo.yaml",
        [*TINY, *TINY_FEDGO, "rounds=1", "faults=[{partition: 0, round: 1, kind: nan}]"],
        run_config={"node-map": str(node_map)},
    )
    assert f"node map ({node_map}): partitions 0..{K - 1} found" in result.log
    check_rounds(result, [K - 1])
    assert re.search(r"Dropping reply of client 0 \(node \d+\): .*non-finite", result.log)
    assert result.summary["strategy"] == "fedgo"
    prefl = json.loads((result.out_dir / "prefl.json").read_text())
    assert sorted(prefl["discriminators"]) == [str(k) for k in range(K)]
    assert prefl["missing_discriminators"] == []
    assert result.rows[-1]["distill_steps"] > 0
    assert (result.out_dir / "discriminators.pt").exists()


def test_cpfl_over_tls(federation):
    """CPFL's cohorts over the deployment engine: 3 one-client cohorts (one-shot FedKD), one
    of which crashes every round and is left out of distillation (one round: the cap stops
    the cohorts, then the stage-two distillation runs)."""
    result = federation.run(
        "cpfl",
        "conf/cpfl.yaml",
        [
            *TINY,
            "rounds=1",
            f"strategy.cohorts={K}",
            "strategy.patience=5",
            "strategy.distill.epochs=1",
            "faults=[{partition: 1, round: 0, kind: crash}]",
        ],
    )
    s = result.summary
    assert s["strategy"] == "cpfl" and s["cohort_sizes"] == [1] * K
    assert len(s["cohorts_left_out"]) == 1 and len(s["cohorts_distilled"]) == K - 1
    assert "never got a usable reply" in result.log
    assert [r["clients_replied"] for r in result.rows[1:]] == [K - 1]
    assert (
        math.isfinite(s["final_accuracy"])
        and s["final_accuracy"] == result.rows[-1]["test_accuracy"]
    )


def test_coboosting_fedgo_over_tls(federation):
    """One-shot over the deployment engine: the generator goes out with the one training
    message, each client uploads its model and its discriminator in one reply; a client that
    crashes its round is left out and named; the server's epochs need no client."""
    result = federation.run(
        "coboosting_fedgo",
        "conf/coboosting.yaml",
        [
            *TINY,
            "rounds=1",
            "strategy.name=coboosting_fedgo",
            "strategy.epochs=2",
            "strategy.nz=16",
            "strategy.ngf=8",
            "strategy.synthesis.batch_size=16",
            "strategy.synthesis.steps=2",
            "strategy.boost.batch_size=16",
            "strategy.discriminator.epochs=1",
            "model.client_models=[cnn, lenet5]",
            "faults=[{partition: 2, round: 1, kind: crash}]",
        ],
    )
    s = result.summary
    assert s["strategy"] == "coboosting_fedgo" and s["clients_used"] == [0, 1]
    assert s["clients_left_out"] == [2] and "clients [2] are left out" in result.log
    assert [r["round"] for r in result.rows] == [0, 1, 2, 3]
    assert result.rows[-1]["pool_size"] == 32
    assert 0 <= s["ensemble_accuracy_fedgo"] <= 1 and math.isfinite(s["final_accuracy"])


def test_fedavg_over_tls_survives_a_crash_and_a_killed_supernode(federation):
    """Round 1: client 1's ClientApp raises (``faults``). Round 2: SuperNode 2 is SIGKILLed.

    SuperNode 2 is killed (with its SuperExec and ClientApps) as soon as round 1 is evaluated,
    so it never answers round 2: the SuperLink reports it unavailable once its heartbeats
    stop (2 x ``HEARTBEAT``), and the round goes on with the rest, long before
    ``round_timeout``. (A client that stays connected but never replies, which only
    ``round_timeout`` ends, is tests/e2e/test_simulation.py's hanging client: the same
    ServerApp code.) Runs last: the federation has two SuperNodes afterwards.
    """
    victim = federation.procs[f"supernode-{KILLED}"]
    killed: set[int] = set()

    def kill() -> None:
        killed.update(kill_trees([victim.pid], signal.SIGKILL))

    result = federation.run(
        "fedavg",
        "conf/fedavg.yaml",
        [*TINY, "faults=[{partition: 1, round: 1, kind: crash}]", f"round_timeout={TIMEOUT}"],
        on_line=("[fedavg] round 1/2", kill),
    )
    assert killed and not alive(killed) and victim.poll() is not None
    check_rounds(result, [K - 1, K - 1])
    assert result.summary["strategy"] == "fedavg"
    log = result.log
    assert re.search(
        r"Dropping reply of client 1 \(node \d+\): client error: .*injected fault", log
    )
    round2 = log[log.index("[ROUND 2/2]") :]
    assert "client 1" not in round2
    # SuperNode 2 is reported unavailable by the SuperLink, and round 2 ends then.
    assert re.search(
        rf"Dropping reply of client {KILLED} \(node \d+\): client error: .*Node Unavailable",
        round2,
    ), round2[-3000:]
    assert result.rows[2]["round_time"] < TIMEOUT / 2, result.rows[2]
