"""Property-based fuzzing of the server's reply intake: one client's replies mutated in flight.

For every strategy found by name (:func:`strategies.available`; a new algorithm is fuzzed
without editing this file), a tiny in-process run (:mod:`fedgo_app.fuzz`: digits, 4
clients, 2 rounds, 1 for a one-shot strategy, 1 local epoch, the strategy's expensive knobs
cut) is run once clean (cached per strategy) and then with ONE client's replies to ONE message
type (any the strategy exchanges: ``train``, FedGO's ``train.discriminator`` and
``train.fedgan`` ...) in ONE round mutated: non-finite or huge values in arrays or metrics,
wrong dtypes and shapes, list or string scalars, missing or extra keys and records, scaled
weights, a forged ``metadata.group_id``, a duplicated reply, a missing, garbage or another
client's reply token (``fuzz.KINDS``). Hypothesis draws the kind, the message type and
round, the client, the record and the key. A reply refused for its reply token must be one whose
mutation changed the token (``fuzz.TOKEN_KINDS``): any other mutation is to be judged by
what it changed.

Each case must finish (no exception out of ``run_inprocess``), leave strictly parseable
``*.json`` / ``*.jsonl`` files and write nothing outside its run folder
(``fuzz.verdict``). With the strategy's defaults the mutated reply must then be dropped
with a WARNING naming the client or leave a usable model (a finite final test loss); with the
robust options (``fuzz.ROBUST``: the median of the round's models, per-teacher scale
normalisation, CPFL's median stopping loss, wherever the strategy has them) the final accuracy
must stay within ``fuzz.ROBUST_MARGIN`` of the clean robust run's or, if lower, of the run
without the mutated reply (a robust server treats a bad reply at worst as a missing one).

**What fails today** is :data:`KNOWN_FAILURES` (from ``benchmarks/fuzz_replies.py``'s full
profile): those (strategy, mutation kind) pairs are left out of the fuzzing test and each has
a strict-xfail test of its own that replays the case found, so that a fix turns it into an
XPASS (a failure) and its entry is then removed, after which the fuzzing test draws that kind
again.

**CI profile**: a fixed-seed sample (``derandomize``, no example database, no shrinking): per
strategy one clean run with the robust options, :data:`EXAMPLES` mutated runs with them and
:data:`DEFAULT_EXAMPLES` with the defaults (whose replies are those of the robust clean run:
the options change how replies are combined, not which are asked for), and one case per known
failure (replayed as found). ``FEDGO_FUZZ_EXAMPLES`` raises both counts. The longer profile
is ``benchmarks/fuzz_replies.py``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fedgo_app import fuzz as fr

# -- the hardening targets: what fails today ------------------------------------------------
# (strategy, mutation kind) -> (why, the case that shows it); strategy "*": every strategy (a
# cause they share), the case then names the strategy it is replayed on ("on"). The why is the
# first line of what `benchmarks/fuzz_replies.py` reported; the case is the reply
# (fuzz_replies.Target.label) and the Mutation's record / key / whole / other, replayed by
# test_a_known_failure_still_fails (strict xfail). A pair listed here is left out of the
# fuzzing test's draws. When a fix lands its case XPASSes (a failure): remove the entry, and
# the fuzzing test draws that kind again.
KNOWN_FAILURES: dict[tuple[str, str], tuple[str, dict]] = {}


def known(name: str, kind: str) -> bool:
    return (name, kind) in KNOWN_FAILURES or ("*", kind) in KNOWN_FAILURES


EXAMPLES = int(os.environ.get("FEDGO_FUZZ_EXAMPLES", "1"))
"""Mutated runs per strategy with the robust options (its clean run comes on top)."""

DEFAULT_EXAMPLES = int(os.environ.get("FEDGO_FUZZ_EXAMPLES", "1"))
"""Mutated runs per strategy with its defaults."""


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # a fixed sample: the same cases on every run
        database=None,
        phases=(Phase.explicit, Phase.generate),  # no shrinking: every case is a whole run
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        print_blob=False,
    )


def draw_mutation(data, name: str, clean: fr.Clean, kinds: list[str]) -> fr.Mutation:
    """A mutation of one of ``kinds`` on one of the clean run's replies."""
    usable = [k for k in kinds if any(fr.applicable(k, t) for t in clean.targets)]
    if not usable:
        pytest.skip(f"{name}: none of {kinds} applies to its replies")
    # Hypothesis tries the simplest example (the first of every list) first: a per-strategy
    # order gives each strategy another first case.
    random.Random(name).shuffle(usable)
    kind = data.draw(st.sampled_from(usable), label="kind")
    targets = {t.label(): t for t in clean.targets if fr.applicable(kind, t)}
    target = targets[data.draw(st.sampled_from(list(targets)), label="reply")]
    mutation = fr.choose(
        kind, target, lambda options: data.draw(st.sampled_from(options)), clean.others(target)
    )
    data.draw(st.just(mutation.describe()), label="mutation")  # printed with a failing case
    return mutation


def check_case(name: str, mutation: fr.Mutation, clean: fr.Clean, tmp_path_factory) -> None:
    out = tmp_path_factory.mktemp(f"fuzz-{name}-")
    try:
        outcome = fr.run_case(name, out / "run", mutation, robust=clean.robust)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    reason = fr.judge(name, mutation, outcome, clean, tmp_path_factory.getbasetemp())
    assert reason is None, f"{mutation.describe()}: {reason}"


def clean_of(name: str, tmp_path_factory) -> fr.Clean:
    """``name``'s clean run with the robust options (cached per process)."""
    clean = fr.clean_run(name, tmp_path_factory.getbasetemp(), robust=True)
    if not clean.targets:
        pytest.skip(f"{name} exchanges no messages with clients: nothing to fuzz")
    return clean


def kinds_of(name: str) -> list[str]:
    return [k for k in fr.KINDS if not known(name, k)]


@pytest.mark.parametrize("name", fr.strategy_names())
@fuzz_settings(DEFAULT_EXAMPLES)
@given(data=st.data())
def test_a_mutated_reply_is_dropped_or_leaves_a_usable_model(name, data, tmp_path_factory):
    # The defaults' verdict reads the clean run's replies and warnings only, not its accuracy.
    clean = dataclasses.replace(clean_of(name, tmp_path_factory), robust=False)
    check_case(name, draw_mutation(data, name, clean, kinds_of(name)), clean, tmp_path_factory)


@pytest.mark.parametrize("name", fr.strategy_names())
@fuzz_settings(EXAMPLES)
@given(data=st.data())
def test_with_the_robust_options_a_mutated_reply_is_harmless(name, data, tmp_path_factory):
    clean = clean_of(name, tmp_path_factory)
    check_case(name, draw_mutation(data, name, clean, kinds_of(name)), clean, tmp_path_factory)


def known_cases():
    for (name, kind), (why, case) in sorted(KNOWN_FAILURES.items()):
        case = dict(case)
        on = case.pop("on", name)
        yield pytest.param(
            on,
            kind,
            case,
            id=f"{'all' if name == '*' else name}-{kind}",
            marks=pytest.mark.xfail(strict=True, reason=why),
        )


@pytest.mark.parametrize(("name", "kind", "case"), list(known_cases()))
def test_a_known_failure_still_fails(name, kind, case, tmp_path_factory):
    clean = clean_of(name, tmp_path_factory)
    check_case(name, fr.replay(clean, kind, **case), clean, tmp_path_factory)


@pytest.mark.parametrize("name", fr.strategy_names())
def test_no_honest_reply_is_refused_for_its_token(name, tmp_path_factory):
    """Every message type of every strategy (its clean run, cached for the fuzzing tests)
    carries a reply token that its honest reply echoes: none is refused for it."""
    clean = clean_of(name, tmp_path_factory)
    refused = [w for w in clean.outcome.warnings if any(t in w for t in fr.TOKEN_REFUSALS)]
    assert not refused, refused


@pytest.mark.parametrize(
    ("kind", "fields", "reason"),
    [
        ("token_missing", {}, "echoes no reply token"),
        ("token_garbage", {"other": "nonhex"}, "answers another instruction"),
        ("token_other", {}, "answers another instruction"),
    ],
)
def test_a_reply_with_a_changed_token_is_dropped_for_it(kind, fields, reason, tmp_path_factory):
    """FedAvg's round-2 reply of client 0 with its echoed token removed, made garbage or
    swapped for another client's: dropped, naming the client and the token."""
    clean = dataclasses.replace(clean_of("fedavg", tmp_path_factory), robust=False)
    mutation = fr.replay(clean, kind, "train@2/client 0", **fields)
    out = tmp_path_factory.mktemp("fuzz-token-")
    try:
        outcome = fr.run_case("fedavg", out / "run", mutation)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    assert fr.judge("fedavg", mutation, outcome, clean) is None
    said = [w for w in outcome.answer if "client 0 (node 2)" in w]
    assert len(said) == 1 and reason in said[0], outcome.answer


def test_a_drop_for_the_token_of_another_mutation_is_a_finding():
    """The verdict does not take a drop for the reply token as the answer to a mutation that
    left the token alone (the intake would never have checked what the mutation changed)."""
    target = fr.Target("train", 1, 0, (fr.Slot("metrics", "metric", ("train_loss",)),))
    clean = fr.Clean("fedavg", fr.Outcome(accuracy=0.6, loss=1.0), [target])
    line = "Dropping reply of client 0 (node 2): echoes no reply token"
    outcome = fr.Outcome(answer=[line], applied=["x"], warnings=[line], accuracy=0.6, loss=1.0)
    mutation = fr.Mutation(target, "metric_nan", "metrics", "train_loss")
    assert "refused for its reply token" in fr.verdict("fedavg", mutation, outcome, clean)
    assert fr.verdict("fedavg", fr.Mutation(target, "token_missing"), outcome, clean) is None
