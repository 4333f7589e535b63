"""The parts of the round loop (:meth:`strategies.base.Strategy.start`): a row's result and the
rollback.

:class:`Row` (:class:`fedgo_flwr.records.recorder.Row`) is what one row of ``metrics.jsonl``
produced (:meth:`Strategy.run_row <strategies.base.Strategy.run_row>`), handed whole to the run
recorder. :class:`Rollback`, owned by a strategy as ``self.rollback``, keeps the last good
model.

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

from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, MetricRecord
from flwr.supercore import log

from fedgo_flwr.protocol import RoundIntake
from fedgo_flwr.records.recorder import Row


class Rollback:
    """The last model a round's clients trained from without model faults (``good``), the row
    that trained from it (``good_row``) and, per row, its largest update (``leaders``: client
    and ratio, from the row's ``update_ratio_client`` / ``update_ratio_max``)."""

    def __init__(self, initial: ArrayRecord) -> None:
        self.good = initial
        self.good_row: int | None = None
        self.leaders: dict[int, tuple[Any, Any]] = {}

    def check(
        self,
        row: int,
        intake: RoundIntake,
        fields: dict[str, Any],
        out: Row,
        arrays: ArrayRecord,
    ) -> Row | None:
        """After row ``row``, which trained from ``arrays``, took its replies through
        ``intake`` and made ``out``, with the row's metrics ``fields`` (given ``rolled_back``
        here): ``None`` if the row stands, else the row that replaces ``out`` (its model
        dropped; the loop goes back to :attr:`good`)."""
        undone = None
        if intake.model_broken():
            undone = self.undo(row, intake, fields, out)
        else:
            if not intake.model_faults and intake.accepted:
                self.good, self.good_row = arrays, row
            fields["rolled_back"] = 0
        self.leaders[row] = (fields.get("update_ratio_client"), fields.get("update_ratio_max"))
        return undone

    def undo(self, row: int, intake: RoundIntake, fields: dict[str, Any], out: Row) -> Row:
        """Row ``row``'s replies say the model it sent is broken: its result is dropped, a
        WARNING names the row that trained from :attr:`good` (and so made the next model) and
        its client with the largest update, and the row records ``rolled_back: 1``."""
        faults = intake.model_faults
        pid, reason = min(faults.items())
        blame = ""
        made_by = self.good_row
        if made_by is not None:
            blame = f"; the model after round {made_by}'s was the first with faults"
            leader = self.leaders.get(made_by)
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
            intake.arrived,
            pid,
            reason,
            blame,
        )
        metrics = MetricRecord(dict(fields)) if out.metrics is None else out.metrics
        metrics["rolled_back"] = 1
        fields["rolled_back"] = 1
        return Row(arrays=None, metrics=metrics, due=out.due)
