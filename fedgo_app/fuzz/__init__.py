"""The reply fuzzer: one client's reply to one message type in one round changed on its way to
the server, and a verdict on what the server did with it. ``tests/integration/test_fuzz_replies.py``
runs a fixed-seed sample of cases; ``python -m benchmarks.fuzz_replies`` the long profile.

A *case* is one tiny in-process run (:func:`fedgo_app.inprocess.run_inprocess`: digits, 4
clients, 2 rounds, or 1 for a one-shot strategy, 1 local epoch, each strategy's expensive
knobs cut) whose replies of ONE client to ONE message type in ONE round are changed by wrapping
:meth:`InProcessGrid.stream` (as ``test_tampered_replies.py``'s ``tamper`` does). Strategies are
found by name (:func:`strategies.available`), and what to mutate by watching the strategy's own
clean run (:func:`clean_run`: every message type, round and client whose reply came back, with
its records and keys), so a new algorithm, message type or record is fuzzed without editing
anything here.

The verdict of a case (:func:`verdict`), in this order:

1. the run finished: no exception out of ``run_inprocess`` (a ``ConfigError`` is a bug of the
   fuzzer, raised as such: :class:`FuzzerBug`);
2. every ``*.json`` / ``*.jsonl`` file of the run folder parses strictly (no NaN / Infinity);
3. nothing was written outside the run folder (the repository and the working directory);
4. with the defaults: the mutated client's reply was dropped with a WARNING naming that
   client (its partition id or its node id; logged between the reply's arrival and the
   server's next messages, and not logged by the clean run), or the final model is still
   usable (a finite test loss);
4a. a reply is refused for its reply token (the echo of the message it answers:
   :class:`fedgo_flwr.protocol.RoundIntake`) only where the mutation changed that token
   (:data:`TOKEN_KINDS`): every other mutation keeps the client's echo, so a drop for the token
   would mean the mutation was never checked for what it changed;
5. with the robust options (:data:`ROBUST`, on in both the clean and the mutated run), the
   final test accuracy is at most :data:`ROBUST_MARGIN` below the clean run's, dropped or not.
"""

from fedgo_app.fuzz.cases import (
    ARRAY_VALUES,
    COMMON,
    CUTS,
    EXTRA,
    GROUP_IDS,
    KINDS,
    METADATA_KINDS,
    ROBUST,
    ROBUST_MARGIN,
    ROOT,
    SCALES,
    TOKEN_KINDS,
    TOKEN_REFUSALS,
    WITHHOLD,
    FuzzerBug,
    Interception,
    Mutation,
    Slot,
    Target,
    applicable,
    choose,
    config_file,
    intercepted,
    one_shot,
    robust_overrides,
    tiny_config,
    tiny_overrides,
    to_plain,
)
from fedgo_app.fuzz.judge import (
    Clean,
    Outcome,
    clean_run,
    dropped,
    first_line,
    judge,
    replay,
    run_case,
    strategy_names,
    strict_json_problems,
    verdict,
    withheld_accuracy,
)
from fedgo_app.fuzz.logs import warnings_logged

__all__ = [
    "ARRAY_VALUES",
    "COMMON",
    "CUTS",
    "Clean",
    "EXTRA",
    "FuzzerBug",
    "GROUP_IDS",
    "Interception",
    "KINDS",
    "METADATA_KINDS",
    "Mutation",
    "Outcome",
    "ROBUST",
    "ROBUST_MARGIN",
    "ROOT",
    "SCALES",
    "Slot",
    "TOKEN_KINDS",
    "TOKEN_REFUSALS",
    "Target",
    "WITHHOLD",
    "applicable",
    "choose",
    "clean_run",
    "config_file",
    "dropped",
    "first_line",
    "intercepted",
    "judge",
    "one_shot",
    "replay",
    "robust_overrides",
    "run_case",
    "strategy_names",
    "strict_json_problems",
    "tiny_config",
    "tiny_overrides",
    "to_plain",
    "verdict",
    "warnings_logged",
    "withheld_accuracy",
]
