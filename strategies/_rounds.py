"""The round loop every strategy runs: Flower's ``start``, resumable, one row at a time.

:class:`RoundLoop` is the part of :class:`strategies.base.Strategy` that drives a run: the
initial evaluation, then per row of ``metrics.jsonl`` what :meth:`~RoundLoop.run_row` does (a
communication round by default; CPFL's cohort rounds and stage two, one-shot FL's clients'
round and server epochs elsewhere), its evaluation and its checkpoint. A strategy changes the
rows by overriding :meth:`~RoundLoop.plan`, :meth:`~RoundLoop.begin_run`,
:meth:`~RoundLoop.rows`, :meth:`~RoundLoop.row_title` and :meth:`~RoundLoop.run_row`, which
returns a :class:`Row`.

**Rollback.** A model that makes honest training diverge would otherwise freeze a run: every
later round's replies are refused (a NaN training loss, non-finite arrays) and the model is
kept, for good. So after each row whose replies were mostly refused for reasons that point at
the model sent (:meth:`fedgo_flwr.protocol.RoundIntake.model_broken`), the loop discards that
row's result and goes back to the last model that a round's clients trained from without any
such fault, with a WARNING that names the round that trained from it (its aggregate was the
first model with faults) and that round's client with the largest update
(``update_ratio_client`` of its row), and records ``rolled_back: 1``. A model that some but not
most replies fault is used, not rolled back to. A strategy whose rows are not rounds of one
global model (CPFL's cohorts, one-shot FL, central training) sets :attr:`RoundLoop.rolls_back`
``False``. After a resume
the model resumed from is the first one to roll back to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import ClassVar

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from fedgo_flwr.runtime.messages import stream_replies
from fedgo_flwr.runtime.shutdown import raise_if_stopping


@dataclass
class Row:
    """What one row of the round loop (:meth:`Strategy.run_row`) produced.

    ``arrays``: the new global model (``None``: unchanged); ``metrics``: the row's training
    metrics; ``evaluated``: what the row's evaluation sees, if not the global model (an empty
    record: nothing to evaluate, e.g. CPFL's cohorts before distillation); ``due``: evaluate
    this row even if ``eval.every`` would skip it; ``checkpoint``: the arrays the row's
    checkpoint keeps, if not the global model.
    """

    arrays: ArrayRecord | None = None
    metrics: MetricRecord | None = None
    evaluated: ArrayRecord | None = None
    due: bool = False
    checkpoint: ArrayRecord | None = None


class RoundLoop:
    """The round loop of :class:`strategies.base.Strategy` (a mixin)."""

    rolls_back: ClassVar[bool] = True
    """Whether a row whose replies say its model was broken is undone (module docstring)."""

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        *,
        first_round: int = 1,
        round_end: Callable[[int, ArrayRecord], None] | None = None,
    ) -> Result:
        """The round loop of every strategy: Flower's, resumable, one row at a time.

        As :meth:`flwr.serverapp.strategy.Strategy.start`, without the federated evaluation
        phase (this framework evaluates on the server), plus: rows start at ``first_round``
        (a resumed run; the initial evaluation is skipped unless it is 1) and
        ``round_end(row, arrays)`` runs after each row's evaluation (checkpointing). What a
        row does is :meth:`run_row` (a communication round here; CPFL's cohort rounds and
        stage two, one-shot FL's clients' round and server epochs elsewhere), which rows
        there are :meth:`rows`; the loop ends early once :attr:`finished`. A stop asked for
        (Ctrl-C, TERM) ends the loop before a row's results are used or checkpointed.
        """
        log(
            INFO,
            "Starting %s strategy (%s)",
            type(self).__name__,
            self.plan(first_round, num_rounds),
        )
        self.summary()
        result = Result()
        result.arrays = initial_arrays
        self.num_rounds = num_rounds
        if not self.begin_run(initial_arrays):
            return result
        arrays = initial_arrays
        if evaluate_fn and first_round == 1:
            res = evaluate_fn(0, arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        train_config = ConfigRecord() if train_config is None else train_config
        good = arrays  # the last model a round's clients trained from without model faults
        good_row: int | None = None  # the row that trained from it (and made the next model)
        leaders: dict[int, tuple] = {}  # row -> (client, ratio) of its largest update
        for row in self.rows(first_round, num_rounds):
            title = self.row_title(row, num_rounds)
            if title:
                log(INFO, "")
                log(INFO, "%s", title)
            out = self.run_row(row, grid, arrays, ConfigRecord(train_config), timeout)
            # Clients that died with a Ctrl-C/TERM must not make a row
            # (fedgo_flwr.runtime.shutdown).
            raise_if_stopping(f"round {row}")
            if self.rolls_back:
                if self.intake.model_broken():
                    out = self.roll_back(row, out, leaders.get(good_row), good_row)
                    arrays = good
                    result.arrays = arrays
                else:
                    if not self.intake.model_faults and self.intake.accepted:
                        good, good_row = arrays, row
                    self.last_round["rolled_back"] = 0
                leaders[row] = (
                    self.last_round.get("update_ratio_client"),
                    self.last_round.get("update_ratio_max"),
                )
            if out.arrays is not None:
                arrays = out.arrays
                result.arrays = arrays
            if out.metrics is not None:
                result.train_metrics_clientapp[row] = out.metrics
            if evaluate_fn:
                self.evaluate_now = out.due
                res = evaluate_fn(row, arrays if out.evaluated is None else out.evaluated)
                self.evaluate_now = False
                if res is not None:
                    result.evaluate_metrics_serverapp[row] = res
            if round_end is not None:
                raise_if_stopping(f"round {row}'s checkpoint")
                round_end(row, arrays if out.checkpoint is None else out.checkpoint)
            if self.finished:
                break
        return result

    def roll_back(self, row: int, out: Row, leader: tuple | None, made_by: int | None) -> Row:
        """Row ``row``'s replies say the model it sent is broken: its result is dropped (the
        loop goes back to the last model a round trained from without model faults), a
        WARNING names the row that trained from that model (and so made the next one) and its
        client with the largest update (``leader``: client and ratio), and the row records
        ``rolled_back: 1``."""
        faults = self.intake.model_faults
        pid, reason = min(faults.items())
        blame = ""
        if made_by is not None:
            blame = f"; the model after round {made_by}'s was the first with faults"
            client, ratio = leader if leader is not None else (None, None)
            if client is not None and client >= 0:
                blame += (
                    f" (round {made_by}'s largest update came from client {client}, "
                    f"{ratio:.3g} x the round's median update norm)"
                )
        log(
            WARNING,
            "Round %d: %d of %d replies refused because of the model sent (client %d: %s); "
            "rolling back to the last model a round trained from without such faults%s",
            row,
            len(faults),
            self.intake.arrived,
            pid,
            reason,
            blame,
        )
        metrics = MetricRecord(dict(self.last_round)) if out.metrics is None else out.metrics
        metrics["rolled_back"] = 1
        self.last_round["rolled_back"] = 1
        return Row(arrays=None, metrics=metrics, due=out.due)

    def plan(self, first_round: int, num_rounds: int) -> str:
        """How the start of the loop describes the rows to come (logged)."""
        return f"rounds {first_round}..{num_rounds}"

    def begin_run(self, initial_arrays: ArrayRecord) -> bool:
        """Work before the first row of this (possibly resumed) run; ``False``: nothing is
        left to do (a run resumed after its last row)."""
        return True

    def rows(self, first_round: int, num_rounds: int) -> Iterable[int]:
        """The rows of ``metrics.jsonl`` this run makes: here one per communication round."""
        return range(first_round, num_rounds + 1)

    def row_title(self, row: int, num_rounds: int) -> str | None:
        """The row's heading in the log (``None``: none)."""
        return f"[ROUND {row}/{num_rounds}]"

    def run_row(
        self, row: int, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, timeout: float
    ) -> Row:
        """One communication round: send the global model, take the replies as they come
        (:func:`fedgo_flwr.runtime.messages.stream_replies`), aggregate."""
        messages = self.configure_train(row, arrays, config, grid)
        new, metrics = self.aggregate_train(row, stream_replies(grid, messages, timeout))
        return Row(arrays=new, metrics=metrics)
