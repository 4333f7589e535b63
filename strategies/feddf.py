"""FedDF and the ensemble-distillation family: FedAvg init + distillation of a weighted ensemble.

Lin, Kong, Stich, Jaggi, "Ensemble Distillation for Robust Model Fusion in Federated Learning",
NeurIPS 2020, Alg. 1: each round the server model starts from the n_k-weighted average of the
client models and is distilled on unlabeled server data towards the clients' ensemble
(AVGLOGITS: softmax of the averaged logits). The FedGO paper (Jang et al., ICML 2025, Sec. 2 and
Alg. 1) generalises the average to a per-sample weighting ``w_k(x)``; this class implements that
general form, and the weighting is chosen by name (``strategy.weighting``): ``uniform`` (FedDF),
``data_size``, ``variance`` (Fed-ET), ``entropy`` (FedHKT/FedDS), ``oracle`` (true labels: a
simulation-only upper bound) here; ``fedgo`` and ``domain`` (client discriminators) in
``strategies/fedgo.py``. What a weighting needs comes from its entry in
:data:`fedgo_flwr.weighting.WEIGHTING_METHODS`.

No client's weight averaged over the samples exceeds ``max(2/K, 3 n_k / sum n)``, and with 3 or
more clients a round ``max(1/2, n_k / sum n)`` (:func:`fedgo_flwr.weighting.mean_share_caps`),
and ``strategy.weight_cap`` bounds any one client's share of a sample's weights. The initial
average follows ``strategy.aggregation``; the teachers are the client models as received.

The distillation set is the server's unlabeled share of the training data (FedGO scenario D1)
or the images of ``data.public_path``; ``distill_size`` draws that many of them once per run.
With ``model.client_models`` the server keeps one prototype per architecture (FedDF Sec. 3,
Alg. 3), each distilled towards the ensemble of all the round's clients. Each round records the
distillation's loss, steps and times, and every ``ensemble_eval_every`` rounds the averaged
model's and the ensemble's test accuracy; with ``diagnostics``, ``pl_acc_<method>``.
``docs/architecture.md`` ("FedDF") has the details.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from flwr.supercore import log
from torch import Tensor, nn

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.aggregation import new_average
from fedgo_flwr.learning.clipping import array_outliers
from fedgo_flwr.learning.distill import (
    TEACHER_NORMS,
    DistillConfig,
    TeacherBank,
    bound_teachers,
    distill,
    normalise_teachers,
    num_views,
    predict_views,
    teacher_logits_problem,
)
from fedgo_flwr.learning.numerics import KeptReplies
from fedgo_flwr.learning.task import heterogeneous_models
from fedgo_flwr.learning.training import evaluate
from fedgo_flwr.records.checkpoint import arrays_problem
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.kernels import inference_batch
from fedgo_flwr.runtime.messages import to_record
from fedgo_flwr.runtime.rng import derive_seed, make_rng
from fedgo_flwr.weighting import (
    SHARE_CAP_RULE,
    WEIGHTING_METHODS,
    WEIGHTING_NAMES,
    WeightingInputs,
    cap_mean_shares,
    cap_weights,
    check_weight_cap,
    compute_weights,
    ensemble_logits,
    get_weighting,
    mean_share_caps,
    pseudo_labels,
)
from strategies.base import BaseConfig, Reply, ReplyRejected, Strategy

INITS = ("average", "previous")


@dataclass
class FedDFConfig(BaseConfig):
    """Parameters of the ensemble-distillation strategies (``strategy.<key>`` in YAML)."""

    weighting: str = "uniform"
    """How the ensemble weighs each client on each sample: a method of the weighting registry
    (below; ``fedgo`` and ``domain`` need FedGO's discriminators)."""
    weighting_params: dict[str, Any] = field(default_factory=dict)
    """Parameters of weighting methods by method name, e.g.
    ``{entropy: {temperature: 2}, fedgo: {disc_mode: sigmoid}}``; every method not named, and
    every parameter not given, takes the registry's defaults. Keyed by method, so swapping
    ``weighting`` stays a one-line change, and the diagnostics of each method use its settings."""
    weight_cap: float | None = None
    """No client's share of a sample's ensemble weight above this (``null``: no cap; the excess goes
    to the others in proportion; the weights still sum to 1); it must satisfy ``weight_cap * clients
    per round >= 1``. It bounds single-sigmoid FedGO, where one client with huge discriminator
    logits takes weight 1. Pseudo-labels and ensemble evaluation use it; the ``pl_acc_*``
    diagnostics do not."""
    init: str = "average"
    """Distillation starts from the n_k-weighted average of the round's client models (``average``)
    or from the last server model (``previous``)."""
    val_fraction: float = 0.0
    """Labelled share of the server set held out for the ``feddf`` distillation protocol's early
    stopping."""
    distill_size: int | None = None
    """Distil on this many of the server's unlabeled images (or of ``data.public_path``'s), drawn
    once with the seed; ``null``: all."""
    ensemble_eval_every: int = 1
    """Test the weighted ensemble of the round's client models every N rounds and in the last (0:
    never)."""
    diagnostics: bool = True
    """Record the pseudo-label accuracy of every weighting and the label oracle on the same client
    models each round (``pl_acc_<weighting>``)."""
    teacher_batch_size: int = 64
    """Samples per forward pass of the server's inference with the client models (teacher
    logits, ensemble tests) and their discriminators (FedGO); the results do not depend on it.
    64 is the fastest on a CPU (larger batches leave the L2 cache; measured in
    ``benchmarks/studies/performance.md``); on a GPU use 512 or more."""
    teacher_norm: str = "none"
    """``none`` (the papers' ensemble) or ``std``: every teacher's logits rescaled to the median
    teacher's scale before the weights and the ensemble
    (:func:`fedgo_flwr.learning.distill.normalise_teachers`), so that a client cannot steer the
    pseudo-labels by scaling its last layer up."""
    distill: DistillConfig = field(default_factory=DistillConfig)

    def check(self, c: Checker) -> None:
        c.choice("weighting", WEIGHTING_NAMES)
        per_method = c.at(f"{c.prefix}weighting_params.", self.weighting_params)
        for name, params in self.weighting_params.items():
            if name not in WEIGHTING_METHODS:
                per_method.fail(
                    name, f"not a weighting; choose one of {', '.join(WEIGHTING_NAMES)}"
                )
            if not isinstance(params, Mapping):
                per_method.fail(name, "must be a mapping of the method's parameters")
            try:
                self.weighting_params[name] = get_weighting(name).check_params(params)
            except ValueError as exc:
                per_method.fail(name, str(exc))
        if self.weight_cap is not None:
            try:
                check_weight_cap(self.weight_cap)
            except ValueError:
                c.fail("weight_cap", "must be in (0, 1] (or null: no cap)")
        c.choice("init", INITS)
        c.require("val_fraction", 0 <= self.val_fraction < 1, "must be in [0, 1)")
        if self.distill.protocol == "feddf":
            c.require(
                "val_fraction",
                self.val_fraction > 0,
                "must be > 0 for the feddf protocol (early stopping)",
            )
        if self.distill_size is not None:
            c.require("distill_size", self.distill_size >= 1, "must be >= 1 (or null: all)")
        c.require("ensemble_eval_every", self.ensemble_eval_every >= 0, "must be >= 0 (0: never)")
        c.require("teacher_batch_size", self.teacher_batch_size >= 1, "must be >= 1")
        c.choice("teacher_norm", TEACHER_NORMS)


class FedDF(Strategy):
    """Ensemble distillation with a per-sample weighting chosen by name."""

    name = "feddf"
    client_algorithm = "fedavg"
    Config = FedDFConfig
    uses_discriminators = False
    supports_heterogeneous_models = True

    @classmethod
    def check_config(
        cls, config: FedDFConfig, c: Checker, cfg: ExperimentConfig | None = None
    ) -> None:
        super().check_config(config, c, cfg)
        if cfg is not None and config.weight_cap is not None:
            k = cfg.clients_per_round
            c.require(
                "weight_cap",
                config.weight_cap * k >= 1 - 1e-12,
                f"infeasible for {k} clients per round: weight_cap * {k} must be >= 1",
            )
        if cfg is not None and heterogeneous_models(cfg) and cls.supports_heterogeneous_models:
            agg = config.aggregation
            at = c.at(f"{c.prefix}aggregation.", agg)
            at.require(
                "rule",
                agg.rule == "mean",
                "must be 'mean' with model.client_models (set strategy.aggregation.rule=mean): "
                "each architecture's prototype starts from the plain n_k-weighted mean of its "
                "own clients (FedDF Alg. 3), and no other rule is defined across architectures",
            )
            at.require(
                "clip_norm",
                agg.clip_norm is None,
                "must be null with model.client_models: each architecture's prototype starts "
                "from the plain n_k-weighted mean of its own clients (FedDF Alg. 3)",
            )
        needs = get_weighting(config.weighting).requires
        if "disc_logits" in needs and not cls.uses_discriminators:
            c.fail(
                "weighting",
                f"'{config.weighting}' needs client discriminators: use strategy.name=fedgo",
            )

    @classmethod
    def ensemble_teachers(cls, cfg: ExperimentConfig) -> int | None:
        """The round's clients (the mean-share cap weighs every weighting's ensemble)."""
        return cfg.clients_per_round

    @classmethod
    def distils_on_server_data(cls, config: FedDFConfig) -> bool:
        """Whether the distillation set is the server's share of the data (FedDF Alg. 1; FedGO
        D1): then ``data.server_fraction`` must be > 0. FedGO's D2 distils on generated data."""
        return True

    uses_public_data = True

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        params, data = cfg.strategy.params, cfg.data
        on_server = cls.distils_on_server_data(params)
        if data.public_path is not None:
            c.at("data.", data).require(
                "public_path",
                on_server,
                f"{cls.name} distils on generated data here; set its distill_data to server "
                "to distil on the public images",
            )
            c.at("strategy.", params).require(
                "val_fraction",
                params.val_fraction == 0,
                "must be 0 with data.public_path: the public images have no labels",
            )
        elif on_server:
            c.at("data.", data).require(
                "server_fraction",
                data.server_fraction > 0,
                f"must be > 0 for {cls.name}: it distils on the server's share of the data "
                "(or set data.public_path)",
            )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        res = self.resources
        if res is None:
            raise ValueError(f"{self.name} needs the server's data (ServerResources)")
        on_server = self.distils_on_server_data(self.params)
        if on_server:
            server_set = self.distill_pool()
        else:  # distils on generated data: the server share only sizes the (empty) template
            server_set = res.bundle.train.subset(res.partition.server)
        rng = np.random.default_rng(self.cfg.seed)
        order = rng.permutation(len(server_set))
        n_val = int(round(self.params.val_fraction * len(server_set)))
        self.val_set = server_set.subset(order[:n_val]) if n_val else None
        self.distill_set: ArrayDataset = server_set.subset(np.sort(order[n_val:]))
        self.views = num_views(self.distill_set, self.params.distill.augment)
        # Known in simulation only; used for diagnostics and the oracle, never for training.
        public = self.cfg.data.public_path is not None and on_server
        self.distill_labels: Tensor | None = None if public else torch.as_tensor(self.distill_set.y)
        self.class_counts = torch.as_tensor(
            res.partition.histogram(res.bundle.train.y, res.bundle.train.num_classes),
            dtype=torch.float64,
        )
        self.scratch = self.model_factory()
        self.student = self.model_factory()
        self.previous: dict[str, np.ndarray] | None = None
        # FedDF Alg. 3: one prototype per client architecture other than model.name.
        archs = sorted({self.architectures.of(p) for p in range(self.cfg.data.num_clients)})
        self.other_archs = [a for a in archs if a != self.cfg.model.name]
        self.scratches = {a: self.model_factory(a) for a in self.other_archs}
        self.arch_students = {a: self.model_factory(a) for a in self.other_archs}
        self.protos = {a: dict(self.architectures.initial[a]) for a in self.other_archs}
        self._main_scratch = self.scratch

    def distill_pool(self) -> ArrayDataset:
        """The server images distilled on (and validated on): all of
        :meth:`~strategies.base.Strategy.server_unlabeled`, or ``distill_size`` of them drawn
        once per run with the seed, in index order.

        Without ``data.public_path`` the draw is made on the indices of the server's share, and
        only the drawn images are read and copied. The training set is a memory map; copying the
        whole share first (25,000 CIFAR images where 2,000 are distilled on, in
        ``conf/bench/scale-cifar10.yaml``) read most of the file into the server's memory and kept
        a copy (the peak with and without: ``benchmarks/studies/scale.md``, "Pull batches"). A
        strategy that needs the whole share (a G1 generator, FedGO's discriminator reference)
        still loads it through ``server_unlabeled``.
        """
        res = self.resources
        size = self.params.distill_size
        public = self.cfg.data.public_path is not None
        count = len(self.server_unlabeled()) if public else len(res.partition.server)
        if count == 0:
            raise ValueError(f"{self.name} needs server data: data.server_fraction is 0")
        if size is None or size >= count:
            return self.server_unlabeled()
        draw = np.random.default_rng(derive_seed(self.cfg.seed, "distill-size"))
        keep = np.sort(draw.choice(count, size, False))
        if public:
            return self.server_unlabeled().subset(keep)
        return res.bundle.train.subset(np.asarray(res.partition.server)[keep])

    def state_dict(self) -> dict[str, Any]:
        return {"previous": self.previous, "protos": self.protos}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.previous = state.get("previous")
        self.protos.update(state.get("protos") or {})

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """The previous round's student is ``None`` or a model of ``model.name``; the
        prototypes are models of the client architectures they are named by."""
        problem = super().state_problem(state, server_round)
        previous = state.get("previous")
        if problem is None and previous is not None:
            problem = self.model_problem(previous, "'strategy_state.previous'")
        protos = state.get("protos") or {}
        if problem is None and not isinstance(protos, Mapping):
            return "'strategy_state.protos': not a dict of architectures"
        for arch, arrays in protos.items():
            if problem is not None:
                break
            if arch not in self.architectures.initial or arch == self.cfg.model.name:
                return f"'strategy_state.protos': {arch!r} is no client architecture of this run"
            what = f"'strategy_state.protos.{arch}'"
            problem = arrays_problem(
                arrays, self.architectures.initial[arch], what, f"model {arch!r}"
            )
        return problem

    def arrays_for(self, arch: str, arrays: ArrayRecord) -> ArrayRecord:
        """FedDF Alg. 3: clients of another architecture start from its fused prototype."""
        if arch == self.cfg.model.name:
            return arrays
        return to_record(self.protos[arch])

    # -- weighting -------------------------------------------------------------------------
    def disc_logits(self, pids: list[int], split: str) -> Tensor | None:
        """``(K, V, N)`` discriminator logits of clients ``pids`` (none for plain FedDF)."""
        return None

    def weights(
        self,
        name: str,
        logits: Tensor,
        replies: list[Reply],
        split: str,
        labels: Tensor | None,
        params: Mapping[str, Any] | None = None,
        cap: float | None = None,
        share_cap: bool = False,
    ) -> Tensor:
        """``(K, V, N)`` weights of method ``name`` for teacher logits ``(K, V, N, C)``.

        ``params``: the method's parameters; by default its ``weighting_params`` (registry
        defaults for what is not configured). ``share_cap``: no client's weight averaged over
        the views and samples above its cap (:func:`~fedgo_flwr.weighting.mean_share_caps`,
        :func:`~fedgo_flwr.weighting.cap_mean_shares`, a WARNING naming the client; the
        weights of the ensemble, not the ``pl_acc_*`` diagnostics). ``cap``: then the largest
        share of one client on any sample (:func:`~fedgo_flwr.weighting.cap_weights`; raised
        to ``1/K`` with a log line when fewer clients replied than ``1/cap``).
        """
        if params is None:
            params = self.params.weighting_params.get(name, {})
        needs = get_weighting(name).requires
        pids = [r.partition_id for r in replies]
        disc = self.disc_logits(pids, split) if "disc_logits" in needs else None
        oracle = "labels" in needs
        per_view = []
        for v in range(logits.shape[1]):
            inputs = WeightingInputs(
                logits=logits[:, v],
                num_examples=torch.tensor([float(r.num_examples) for r in replies]),
                disc_logits=None if disc is None else disc[:, v],
                labels=labels if oracle else None,
                class_counts=self.class_counts[pids] if oracle else None,
            )
            per_view.append(compute_weights(name, inputs, **params))
        weights = torch.stack(per_view, dim=1)
        if share_cap:
            sizes = torch.tensor([float(r.num_examples) for r in replies])
            caps = mean_share_caps(sizes)
            weights, capped = cap_mean_shares(weights, caps)
            for k in capped:
                log(
                    WARNING,
                    "the %s weights of client %d on %s: mean share above its cap %.3g (%s); "
                    "scaled down to it",
                    name,
                    pids[k],
                    "the test split" if split == "test" else "the distillation set",
                    float(caps[k]),
                    SHARE_CAP_RULE,
                )
        if cap is not None:
            k = len(replies)
            if cap * k < 1 - 1e-12:
                log(WARNING, "weight_cap %g is below 1/%d with %d replies: uniform", cap, k, k)
                cap = 1 / k
            weights = cap_weights(weights, cap)
        return weights

    def diagnostic_weightings(self) -> list[tuple[str, str, Mapping[str, Any] | None]]:
        """``(metric suffix, method, params or None for the default)`` of every registered
        weighting (and variant) whose inputs this strategy has."""
        out: list[tuple[str, str, Mapping[str, Any] | None]] = []
        for name, method in WEIGHTING_METHODS.items():
            if "disc_logits" in method.requires and not self.uses_discriminators:
                continue
            out.append((name, name, None))
            out.extend((f"{name}_{suffix}", name, v) for suffix, v in method.variants.items())
        return out

    # -- aggregation -----------------------------------------------------------------------
    def begin_round(self, server_round: int) -> None:
        super().begin_round(server_round)
        self.bank = TeacherBank(
            self.distill_set,
            augment=self.params.distill.augment,
            batch_size=self.params.teacher_batch_size,
            teacher_norm=self.params.teacher_norm,
        )
        every = self.params.ensemble_eval_every
        self.ensemble_eval = every > 0 and (
            server_round % every == 0 or server_round == self.cfg.rounds
        )
        self.test_logits: dict[int, Tensor] = {}
        self.teacher_time = self.eval_time = 0.0
        self.arch_running = {a: new_average(self.aggregation) for a in self.other_archs}

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Turn the model into teacher logits, check them, then add them to the ensemble and
        the model to the running average; the model itself is not kept (one client model in
        memory at a time).

        The order matters: a model whose logits are not finite numbers of at most
        :data:`~fedgo_flwr.learning.distill.MAX_TEACHER_LOGIT` (checked on the distillation set
        and, in rounds with the ensemble evaluation, on the test split:
        :func:`~fedgo_flwr.learning.distill.teacher_logits_problem`) is dropped with
        :class:`ReplyRejected` before it enters either the ensemble or the parameter average."""
        res = self.resources
        assert res is not None
        t0 = time.perf_counter()
        arch = self.architectures.of(reply.partition_id)
        self.scratch = self.scratches.get(arch, self._main_scratch)
        self.scratch.load_state_dict(self.to_state(reply.arrays))
        bank = self.bank
        batch = inference_batch(bank.batch_size, res.device)  # the batch it runs at
        with profiling.phase("teacher_logits", len(bank.data) * bank.views, batch):
            logits = self.teacher_logits(reply, "distill", bank.data, bank.views, bank.batch_size)
        self.teacher_time += time.perf_counter() - t0
        test_logits = None
        if self.ensemble_eval:
            t0 = time.perf_counter()
            with profiling.phase("ensemble_eval", len(res.bundle.test), batch):
                test_logits = self.teacher_logits(
                    reply, "test", res.bundle.test, 1, self.params.teacher_batch_size
                )
            self.eval_time += time.perf_counter() - t0
        for where, z in (("the distillation set", logits), ("the test split", test_logits)):
            problem = None if z is None else teacher_logits_problem(z, where)
            if problem is not None:
                raise ReplyRejected(problem)
        if arch in self.arch_running:
            self.arch_running[arch].add(reply.arrays, reply.num_examples)
        else:
            super().absorb(server_round, reply)
        bank.add_logits(logits, key=reply.partition_id)
        if test_logits is not None:
            self.test_logits[reply.partition_id] = test_logits

    def bounded_teachers(
        self, logits: Tensor, replies: list[Reply], where: str, server_round: int
    ) -> Tensor:
        """The round's teacher logits ``(K, ..., C)`` (in ``replies``' order) with every
        teacher whose logit scale exceeds ``strategy.aggregation.upload_bound`` times the
        round's median teacher scale rescaled to that median, a WARNING naming the client
        (:func:`~fedgo_flwr.learning.distill.bound_teachers`). Its model is in the parameter average
        already (the classifier's bounds are ``clip_norm`` and the rules); here it stops the
        client from steering the ensemble by scaling its last layer up."""
        out, outliers = bound_teachers(logits, self.aggregation.upload_bound)
        for k, scale, median in outliers:
            log(
                WARNING,
                "round %d: the teacher logits of client %d on %s: scale %.3g is %.3g x the "
                "round's median %.3g, above strategy.aggregation.upload_bound = %g; "
                "rescaled to the median",
                server_round,
                replies[k].partition_id,
                where,
                scale,
                scale / median if median > 0 else float("inf"),
                median,
                self.aggregation.upload_bound,
            )
        return out

    def leave_out_teacher_models(self, server_round: int, replies: list[Reply]) -> list[Reply]:
        """``replies`` without the teachers whose models no honest round gives.

        Where the rule keeps the round's models (``consensus``, the default, ``median``,
        ``trimmed_mean``), a client model with an array whose update is longer than
        ``strategy.aggregation.teacher_array_bound`` (50) times the round's lower median norm
        of that array's updates (:func:`~fedgo_flwr.learning.clipping.array_outliers`) is left
        out of the ensemble: its logits are dropped from the distillation set's and the test
        split's, a WARNING names the client, and the round records ``teachers_left_out``. Its
        model still went into the average, where the rule bounds it.

        Why: as one-shot FL leaves out a teacher beyond the logit bound. A model that puts the
        whole update budget into one class's bias keeps its logit scale within
        ``upload_bound`` of the others' and would lean every pseudo-label to that class; one
        scaled away (``y = x - 48 x``) teaches noise; such a teacher clipped back to the bound
        still taught worse than none (measured: ``benchmarks/studies/trust.md``, "Teachers
        left out"). Honest models stay far below the bound (at most 13.4: "The radial clip").
        The streaming mean (``rule: mean``) keeps no models, so it has no such check."""
        running = self.averager.running
        factor = self.aggregation.teacher_array_bound
        if factor is None or not isinstance(running, KeptReplies) or self.bank is None:
            return replies
        outliers = array_outliers(running.replies, self.global_arrays, factor)
        left_out = set()
        for o in outliers:
            pid = running.clients[o.index]
            left_out.add(pid)
            self.bank.remove_logits(pid)
            self.test_logits.pop(pid, None)
            log(
                WARNING,
                "round %d: the model of client %d: its update of %s is %.3g x the round's "
                "median of that array, above strategy.aggregation.teacher_array_bound = %g; "
                "left out of the ensemble",
                server_round,
                pid,
                o.key,
                o.ratio,
                factor,
            )
        self.last_round["teachers_left_out"] = len(left_out)
        return [r for r in replies if r.partition_id not in left_out]

    def teacher_logits(
        self, reply: Reply, split: str, data: ArrayDataset, views: int, batch_size: int
    ) -> Tensor:
        """``(V, N, C)`` logits of ``reply``'s model (loaded in ``self.scratch``) on ``data``
        (``split``: ``distill`` or ``test``); DaFKD also reads its discriminator on the pass."""
        assert self.resources is not None
        return predict_views(self.scratch, data, views, batch_size, self.resources.device)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        res = self.resources
        assert res is not None
        device = res.device
        if self.averager.count:
            average = self.averaged()
        else:  # no client of model.name replied (mixed architectures): its last model
            average = self.previous if self.previous is not None else self.global_arrays
        init = average if self.params.init == "average" or self.previous is None else self.previous
        ensemble_eval, eval_time = self.ensemble_eval, self.eval_time

        t0 = time.perf_counter()
        bank = self.bank
        replies = self.leave_out_teacher_models(server_round, replies)
        logits = self.bounded_teachers(bank.logits, replies, "the distillation set", server_round)
        distill_labels = self.distill_labels
        cap = self.params.weight_cap
        weights = self.weights(
            self.params.weighting,
            logits,
            replies,
            "distill",
            distill_labels,
            cap=cap,
            share_cap=True,
        )
        targets = pseudo_labels(logits, weights, self.params.distill.temperature)
        metrics = {"teacher_time": self.teacher_time + time.perf_counter() - t0}

        if self.params.diagnostics and distill_labels is not None:
            for suffix, name, params in self.diagnostic_weightings():
                w = self.weights(name, logits[:, :1], replies, "distill", distill_labels, params)
                pred = ensemble_logits(logits[:, 0], w[:, 0]).argmax(-1)
                metrics[f"pl_acc_{suffix}"] = (pred == distill_labels).float().mean().item()
        if ensemble_eval:
            t_eval = time.perf_counter()
            tl = torch.stack([self.test_logits[r.partition_id] for r in replies])  # (K,1,N,C)
            tl = normalise_teachers(tl, self.params.teacher_norm)
            tl = self.bounded_teachers(tl, replies, "the test split", server_round)
            test_labels = torch.as_tensor(res.bundle.test.y)
            w = self.weights(
                self.params.weighting, tl, replies, "test", test_labels, cap=cap, share_cap=True
            )
            mixed = ensemble_logits(tl[:, 0], w[:, 0])
            metrics["ensemble_test_accuracy"] = (
                (mixed.argmax(-1) == test_labels).float().mean().item()
            )
            metrics["ensemble_test_loss"] = F.cross_entropy(mixed, test_labels).item()

        self.student.load_state_dict(self.to_state(init))
        if ensemble_eval:
            loss, acc = evaluate(self.student, res.bundle.test, self.cfg.eval.batch_size, device)
            metrics.update(init_test_accuracy=acc, init_test_loss=loss)
            metrics["ensemble_eval_time"] = eval_time + time.perf_counter() - t_eval
        result = distill(
            self.student,
            self.distill_set,
            targets,
            self.params.distill,
            server_round=server_round,
            rng=make_rng(self.cfg.seed, "distill", server_round),
            device=device,
            validate=self.validate if self.val_set is not None else None,
            generated=not self.distils_on_server_data(self.params),
            progress=f"{self.name} distillation, round {server_round}",
        )
        metrics.update(
            distill_loss=result.loss, distill_steps=result.steps, distill_time=result.seconds
        )
        for arch in self.other_archs:
            metrics.update(self.fuse_prototype(arch, targets, server_round))
        self.last_round.update(metrics)
        self.bank, self.test_logits = None, {}
        # Copies: numpy views of the student's tensors would change with the next round's student.
        out = {k: v.detach().cpu().numpy().copy() for k, v in self.student.state_dict().items()}
        self.previous = out
        return out

    def fuse_prototype(self, arch: str, targets: Tensor, server_round: int) -> dict[str, float]:
        """FedDF Alg. 3 lines 9-14 for the prototype of ``arch``: start from the n_k-weighted
        average of this round's clients of ``arch`` (its previous prototype if none replied, or
        with ``init: previous``) and distil it towards the same targets, the ensemble of every
        client; returns its ``distill_loss_<arch>`` and ``test_accuracy_<arch>``."""
        res = self.resources
        assert res is not None
        running = self.arch_running[arch]
        use_average = running.count and self.params.init == "average"
        init = running.result() if use_average else self.protos[arch]
        student = self.arch_students[arch]
        student.load_state_dict(self.to_state(init))
        result = distill(
            student,
            self.distill_set,
            targets,
            self.params.distill,
            server_round=server_round,
            rng=make_rng(self.cfg.seed, "distill", server_round, arch),
            device=res.device,
            validate=self.validate if self.val_set is not None else None,
            generated=not self.distils_on_server_data(self.params),
            progress=f"{self.name} distillation of {arch}, round {server_round}",
        )
        self.protos[arch] = {
            k: v.detach().cpu().numpy().copy() for k, v in student.state_dict().items()
        }
        loss, acc = evaluate(student, res.bundle.test, self.cfg.eval.batch_size, res.device)
        return {
            f"distill_loss_{arch}": result.loss,
            f"test_accuracy_{arch}": acc,
            f"test_loss_{arch}": loss,
            f"clients_{arch}": running.count,
        }

    def validate(self, model: nn.Module) -> float:
        assert self.val_set is not None and self.resources is not None
        return evaluate(model, self.val_set, self.cfg.eval.batch_size, self.resources.device)[1]

    @staticmethod
    def to_state(arrays: dict[str, np.ndarray]) -> dict[str, Tensor]:
        return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in arrays.items()}
