"""CPFL's stage 1 on the strategy side: every running cohort's round, side by side.

Dhasade et al., EuroMLSys 2025 (Alg. 1 lines 2-8; :mod:`strategies.cpfl`). :class:`CohortRounds`
is the part of :class:`strategies.cpfl.CPFL` that runs the cohorts: per round, each running
cohort's sampled members are sent its model (``fraction`` of its members, a seeded draw per
cohort and round), unless the round would end after the distillation time; each member's reply
is checked (its validation report: :meth:`~CohortRounds.val_problem`), folded into its cohort's
average and its validation loss kept; then each cohort's clock advances by its slowest
participant (:mod:`fedgo_flwr.learning.systems`), its stopping rule sees the round's robust loss
(:func:`fedgo_flwr.learning.cohorts.cohort_loss`) and the round's metrics list every cohort. The
pure bookkeeping (deadline, totals, teacher snapshots) is :mod:`fedgo_flwr.learning.cohorts`'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore import log

from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.aggregation import clip_update
from fedgo_flwr.learning.clipping import round_average
from fedgo_flwr.learning.cohorts import (
    CONVERGED,
    PAUSED,
    Cohort,
    batches_per_epoch,
    cohort_loss,
    cohort_totals,
    distill_deadline,
    holdout_size,
    prune_history,
)
from fedgo_flwr.learning.systems import DeviceProfile, SimClock, round_seconds
from fedgo_flwr.learning.task import sample_clients
from fedgo_flwr.learning.training import predict_logits
from fedgo_flwr.protocol import ReplySpec
from fedgo_flwr.protocol.cpfl import member_reply
from fedgo_flwr.runtime import messages as msgs
from fedgo_flwr.runtime.messages import to_record
from fedgo_flwr.runtime.rng import derive_seed
from strategies.base import Reply, ReplyRejected, client_metrics


class CohortRounds:
    """Stage 1 of :class:`strategies.cpfl.CPFL` (a mixin): its ``cohorts``, ``round_plan``
    (cohort index -> this round's participants), ``profiles`` and ``model_bytes``."""

    def participants(self, server_round: int, cohort: Cohort) -> list[int]:
        """The cohort's clients trained in ``server_round``: ``fraction`` of its members
        (at least ``min_clients``), a seeded draw per (seed, cohort, round)."""
        members = cohort.members
        m = max(self.cfg.min_clients, int(self.cfg.fraction * len(members) + 1e-9))
        if m >= len(members):
            return list(members)
        seed = derive_seed(self.cfg.seed, "cpfl-cohort", cohort.index)
        picks = sample_clients(seed, server_round, len(members), m)
        return [members[i] for i in picks]

    def round_cost(
        self, cohort: Cohort, pids: list[int]
    ) -> tuple[list[DeviceProfile], list[int], int]:
        """Profiles, mini-batches and bytes each way of each participant of a cohort round."""
        t = self.cfg.train
        batches = [
            t.local_epochs * batches_per_epoch(self.client_sizes[p], t.batch_size) for p in pids
        ]
        transfer = 0 if len(cohort.members) == 1 else self.model_bytes
        return [self.profiles[p] for p in pids], batches, transfer

    def deadline(self) -> float | None:
        """The simulated time stage 2 starts at, as far as known (``None``: not yet;
        :func:`fedgo_flwr.learning.cohorts.distill_deadline`)."""
        p = self.params
        return distill_deadline(self.cohorts, p.distill_when, p.distill_at_hours)

    def configure_cohorts(self, server_round: int, config: ConfigRecord) -> list[Message]:
        config = self.message_config(server_round, config)
        deadline = self.deadline()
        messages: list[Message] = []
        self.sampled, self.round_plan = [], {}
        for c in self.cohorts:
            if not c.running:
                continue
            pids = self.participants(server_round, c)
            profiles, batches, transfer = self.round_cost(c, pids)
            duration = round_seconds(profiles, batches, transfer, transfer)
            if deadline is not None and c.clock.seconds + duration > deadline + 1e-9:
                c.status, c.finish_seconds = PAUSED, c.clock.seconds
                log(
                    INFO,
                    "CPFL: cohort %d paused at %.2f h (distillation time)",
                    c.index,
                    c.clock.hours,
                )
                continue
            record = RecordDict({msgs.ARRAYS: to_record(c.arrays), msgs.CONFIG: config})
            messages += self.messages_to(record, pids, MessageType.TRAIN)
            self.sampled += pids
            self.round_plan[c.index] = pids
        self.open_round(sorted(self.sampled))
        if self.cohorts:
            self.global_arrays = self.cohorts[0].arrays  # keys, shapes, dtypes of every reply
        log(INFO, "configure_train: %d cohorts, clients %s", len(self.round_plan), self.sampled)
        return messages

    def reply_spec(self) -> ReplySpec:
        """A cohort member's reply: its local algorithm's, with the validation report."""
        return member_reply(self.params.local_algorithm)

    def val_problem(self, reply: Reply) -> str | None:
        """Why a reply's validation report is unusable: a client with a validation split must
        report a finite ``val_loss >= 0`` (a number, not a bool) and its split's size; a client
        without one must send no ``val_loss``.

        A client without a split that sends a ``val_loss`` has its whole reply dropped, not the
        loss ignored: an honest client derives its split from the same config and seed as the
        server (``clients/cpfl.py`` reports a loss only with a split), so the reply is off the
        protocol, as one with a wrong ``val_examples`` is (dropped too), and its model update
        comes from a client known to misreport.
        """
        p = self.params  # CPFLConfig
        size = self.resources.partition.client_sizes[reply.partition_id]
        expected = holdout_size(size, p.val_fraction, p.min_val_samples)
        if not expected:
            if "val_loss" in reply.metrics:
                return "metric 'val_loss' sent, but the client has no validation split"
            return None
        loss, count = reply.metrics.get("val_loss"), reply.metrics.get("val_examples")
        if (
            isinstance(loss, bool)
            or not isinstance(loss, (int, float))
            or not math.isfinite(loss)
            or loss < 0
        ):
            return f"metric 'val_loss' is {loss!r}, not a finite number >= 0"
        if count != expected:
            return f"val_examples {count!r}, but the client's validation split has {expected}"
        return None

    def sent_arrays(self, pid: int) -> dict[str, np.ndarray]:
        """A member is sent its cohort's model: its update is bounded against that."""
        return self.cohorts[self.cohort_of[pid]].arrays

    def begin_round(self, server_round: int) -> None:
        """Reset what :meth:`absorb` accumulates: per running cohort, its average and its
        members' validation losses; each member's update clipped relative to its cohort's
        round (``clip_factor``, :class:`~fedgo_flwr.learning.clipping.ClippedMean`)."""
        self.averages = {
            i: round_average(
                self.aggregation, self.cohorts[i].arrays, f"Round {server_round}, cohort {i}"
            )
            for i in self.round_plan
        }
        self.losses: dict[int, list[tuple[int, float]]] = {i: [] for i in self.round_plan}

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Fold a member's reply into its cohort's average (its update clipped to
        ``aggregation.clip_norm`` against the cohort's model) and keep its validation loss; a
        reply whose validation report is unusable (:meth:`val_problem`) is dropped."""
        problem = self.val_problem(reply)
        if problem is not None:
            raise ReplyRejected(problem)
        c = self.cohorts[self.cohort_of[reply.partition_id]]
        arrays = reply.arrays
        if self.aggregation.clip_norm is not None:
            arrays, _ = clip_update(arrays, c.arrays, self.aggregation.clip_norm)
        self.averages[c.index].add(arrays, reply.num_examples, reply.partition_id)
        if "val_loss" in reply.metrics:
            self.losses[c.index].append((reply.partition_id, float(reply.metrics["val_loss"])))

    def aggregate_cohorts(self, server_round: int, replies: Iterable[Message]) -> None:
        p = self.params  # CPFLConfig
        active = [self.cohorts[i] for i in self.round_plan]
        self.begin_round(server_round)
        all_replies, _ = self.intake.collect(server_round, replies, self.accept, self.absorb)
        averages, losses = self.averages, self.losses
        accepted: dict[int, list[Reply]] = {c.index: [] for c in active}
        for reply in all_replies:
            accepted[self.cohort_of[reply.partition_id]].append(reply)
        rows = []
        for c in active:
            pids = self.round_plan[c.index]
            profiles, batches, transfer = self.round_cost(c, pids)
            seconds = c.clock.add_round(profiles, batches, transfer, transfer)
            k = c.clock
            c.trace.append((k.seconds, k.cpu_seconds, k.bytes_down, k.bytes_up))
            c.rounds += 1
            got = accepted[c.index]
            sent = c.arrays
            if len(got) >= min(self.cfg.min_clients, len(pids)) and got:
                c.arrays = averages[c.index].result()
                c.updates += len(got)
            else:
                log(
                    WARNING,
                    "Round %d: cohort %d has no usable reply; it keeps its model",
                    server_round,
                    c.index,
                )
            reported = losses[c.index]
            val, clipped = cohort_loss([v for _, v in reported], p.loss_reduce, p.loss_bound)
            if clipped:
                log(
                    WARNING,
                    "Round %d: cohort %d clips the validation loss of client(s) %s to "
                    "strategy.loss_bound (%g) x the cohort's median of the round",
                    server_round,
                    c.index,
                    ", ".join(str(reported[i][0]) for i in clipped),
                    p.loss_bound,
                )
            if c.stopper.observe(val):
                c.best, c.best_round = sent, server_round
                if p.teacher == "best" and p.distill_when < 1:
                    c.history.append((c.clock.seconds, sent))
            if p.teacher == "last" and p.distill_when < 1:
                c.history.append((c.clock.seconds, c.arrays))
            if c.stopper.stopped:
                c.status, c.finish_seconds = CONVERGED, c.clock.seconds
                log(
                    INFO,
                    "CPFL: cohort %d converged in round %d at %.2f simulated hours",
                    c.index,
                    server_round,
                    c.clock.hours,
                )
            rows.append(
                {
                    "cohort": c.index,
                    "clients_sampled": len(pids),
                    "clients_replied": len(got),
                    "val_loss": val,
                    "val_loss_smoothed": c.stopper.smoothed,
                    "round_seconds": seconds,
                    "sim_hours": c.clock.hours,
                    "status": c.status,
                }
            )
        self._prune_history()
        accuracy = self.evaluate_cohorts(server_round, rows)
        total = self.totals()
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": len(all_replies),
            "clients_failed": self.intake.round.failed,
            "cohorts_running": sum(c.running for c in self.cohorts),
            "sim_hours": total.hours,
            "cpu_hours": total.cpu_hours,
            "bytes_total": total.bytes_total,
            "cohorts": rows,
        }
        if accuracy is not None:
            self.last_round["cohort_accuracy_mean"] = accuracy
        if all_replies:
            self.last_round.update(client_metrics(all_replies))

    def _prune_history(self) -> None:
        """Drop teacher snapshots that can no longer be the one at the distillation time."""
        prune_history(self.cohorts, self.params.distill_when)

    def evaluate_cohorts(self, server_round: int, rows: list[dict]) -> float | None:
        """Test accuracy of the models of the cohorts in ``rows`` (every
        ``cohort_eval_every`` rounds, n > 1); their mean, or ``None``."""
        every = self.params.cohort_eval_every
        if len(self.cohorts) == 1 or not every or server_round % every or not rows:
            return None
        for row in rows:
            row["test_accuracy"] = self._accuracy(self.cohorts[row["cohort"]].arrays)
        return float(np.mean([row["test_accuracy"] for row in rows]))

    def _accuracy(self, arrays: dict[str, np.ndarray]) -> float:
        logits = self._test_logits(arrays)
        labels = torch.as_tensor(self.resources.bundle.test.y)
        return float((logits.argmax(1) == labels).float().mean())

    def _test_logits(
        self, arrays: dict[str, np.ndarray], data: ArrayDataset | None = None
    ) -> torch.Tensor:
        model = self.model_factory()
        model.load_state_dict(to_record(arrays).to_torch_state_dict())
        data = self.resources.bundle.test if data is None else data
        return predict_logits(model, data, self.cfg.eval.batch_size, self.resources.device)

    def totals(self) -> SimClock:
        """The cohorts side by side (time: the furthest clock) plus the uploads to the server.

        Once a deadline applies (``distill_when`` < 1, ``distill_at_hours``), each cohort counts
        as of it: rounds that ended after it (run before it was known) are not counted.
        """
        return cohort_totals(self.cohorts, self.deadline(), self.upload_clock)
