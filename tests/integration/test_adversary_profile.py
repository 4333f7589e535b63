"""CI's sample of the adaptive-adversary profile (:mod:`benchmarks.adversary`).

A fixed sample of (strategy, attack kind, mode) cases on seed 0, each a tiny in-process run
(10 clients, 5 a round, 4 rounds) in which one client edits its replies to sit just under the
bounds in force, judged against the clean run of the same config: the run does not freeze and
its final accuracy is at most ``MARGIN`` below the clean one's. A case listed in
``KNOWN_FAILURES`` (a measured finding) is expected to fail (``xfail(strict=True)``: once it
passes, the entry must go). ``python -m benchmarks.adversary_profile`` runs every case.
"""

from __future__ import annotations

import pytest

from benchmarks import adversary as adv

SAMPLE = [
    ("fedavg", "rolled_last_layer", "every"),
    ("fedavg", "replay", "every"),
    ("fedavg", "sign_flip", "once"),
    ("scaffold", "upload_scaled", "every"),
    ("fedtgp", "upload_scaled", "every"),
    ("cpfl", "loss_report", "once"),
    ("cpfl", "scaled", "once"),
    ("feduv", "scaled", "every"),  # trusted in every round before the radial clip
    ("fedgo", "discriminator_bias", "once"),
]


def _param(case_id: str, kind: str, mode: str):
    known = adv.KNOWN_FAILURES.get((case_id, kind, mode))
    marks = [pytest.mark.xfail(reason=known, strict=True)] if known else []
    return pytest.param(case_id, kind, mode, marks=marks, id=f"{case_id}-{kind}-{mode}")


@pytest.mark.parametrize(("case_id", "kind", "mode"), [_param(*c) for c in SAMPLE])
def test_an_adaptive_attacker_neither_freezes_nor_sinks_the_run(case_id, kind, mode):
    case = adv.run_case(case_id, kind, mode)
    assert case.skipped is None, case.skipped
    assert case.applied, "the attack was never applied"
    assert case.failure is None, case.failure


def test_a_replayed_reply_is_refused_for_its_token_and_the_rounds_go_on():
    base = adv.clean("fedavg")
    attack = adv.Attack("replay", "every", ["train"], adv.bounds_of("fedavg"), base.node)
    run = adv.run_once("fedavg", attack, base.node)
    assert run.applied == ["train@2", "train@3"]
    pid = base.node - 2
    refused = [w for w in run.warnings if f"client {pid}" in w and "reply token" in w]
    assert len(refused) == 2, run.warnings
    replied = {r["round"]: r["clients_replied"] for r in run.rows if "clients_replied" in r}
    clean = {r["round"]: r["clients_replied"] for r in base.rows if "clients_replied" in r}
    attacked = {2, 3}
    assert replied == {r: n - (r in attacked) for r, n in clean.items()}


def test_the_clean_run_learns_and_names_the_attacker():
    base = adv.clean("fedavg")
    assert base.accuracy is not None and base.accuracy > 0.5  # well above chance (0.1)
    assert base.node is not None and base.seen["train"].replies >= 2
