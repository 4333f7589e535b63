"""DaFKD: domain-aware knowledge distillation with a generator trained alongside the models.

Wang et al., "DaFKD: Domain-aware Federated Knowledge Distillation", CVPR 2023. Each round:

1. the server draws the round's distillation set X_t = G^t(z) from its generator (``distill_size``
   samples, seeded by the round) and sends the global model and G^t;
2. each sampled client trains its classifier, its own discriminator head on the classifier's
   features and G together (``clients/dafkd.py``) and returns the model, G_k and its head;
3. the server averages models and generators by n_k, evaluates each client's discriminator
   D_k = sigmoid(d_k(h_k(x))) on X_t from the uploaded model and head, and distils the averaged
   model on X_t towards the ensemble weighted by the domain-aware weights
   w_k(x) = D_k(x) / sum_i D_i(x) (FedGO Sec. 2; :func:`fedgo_flwr.weighting` ``domain``), once
   every head of the round is in and has been bounded and screened; no client's domain weight
   averaged over X_t exceeds its cap (:func:`fedgo_flwr.weighting.mean_share_caps`).

It is :class:`strategies.feddf.FedDF` with the per-round generated distillation set, the
generator's average and the discriminators read on the teacher pass; every FedDF parameter
applies. Each round records ``disc_prob_mean``, ``disc_prob_spread`` and the clients'
``gan_d_loss`` / ``gan_g_loss``. ``distill_data: server`` distils on the server's unlabeled share
instead (FedGO scenario D1). From the authors' code (``haozhaowang/DaFKD2023``): no distillation
in the first round (``distill_from_round``: 2), the distillation set drawn with the previous
round's generator. Its deviations from that code and the code's settings:
``docs/design/peers.md`` §3.2 and §8.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from logging import WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.supercore import log
from torch import Tensor

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan import generated_set, screen_discriminators
from fedgo_flwr.learning.aggregation import (
    BoundedAverage,
    bound_uploads,
    check_arrays,
    warn_bounded,
)
from fedgo_flwr.learning.distill import num_views, view_batches
from fedgo_flwr.models.features import FeatureTap
from fedgo_flwr.protocol.dafkd import DISC_HEAD_KEY, GENERATOR_KEY, DaFKDClientConfig
from fedgo_flwr.records.checkpoint import arrays_problem
from fedgo_flwr.runtime.fileio import safe_torch_load
from fedgo_flwr.runtime.kernels import place
from fedgo_flwr.runtime.messages import to_numpy, to_record
from fedgo_flwr.runtime.rng import derive_seed, make_rng
from strategies.base import Reply, ReplyRejected
from strategies.feddf import FedDF, FedDFConfig

DISTILL_DATA = ("generated", "server")


@dataclass
class DaFKDConfig(DaFKDClientConfig, FedDFConfig):
    """FedDF's parameters (``weighting`` defaults to ``domain``), the client's generator and
    GAN schedule, ``distill_data`` (``generated``: a new set from G every round; ``server``),
    ``distill_size`` and ``distill_from_round``."""

    weighting: str = "domain"
    distill_data: str = "generated"
    distill_size: int = 1280
    distill_from_round: int = 2

    def check(self, c: Checker) -> None:
        c.choice("distill_data", DISTILL_DATA)
        c.require("distill_size", self.distill_size >= 1, "must be >= 1")
        c.require("distill_from_round", self.distill_from_round >= 1, "must be >= 1")
        if self.distill_data == "generated":
            c.require(
                "val_fraction",
                self.val_fraction == 0,
                "must be 0 with distill_data generated (no labelled server split is used)",
            )


@torch.no_grad()
def logits_and_discriminator(
    model: torch.nn.Module,
    head: Mapping[str, np.ndarray],
    data: ArrayDataset,
    views: int,
    batch_size: int,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """``(V, N, C)`` logits of ``model`` (eval mode) and ``(V, N)`` logits of the discriminator
    ``head`` (``weight`` (1, d), ``bias`` (1,)) on its features, in one pass over ``data``."""
    place(model, device).eval()
    weight = torch.as_tensor(head["weight"], device=device)
    bias = torch.as_tensor(head["bias"], device=device)
    logits: list[list[Tensor]] = [[] for _ in range(views)]
    disc: list[list[Tensor]] = [[] for _ in range(views)]
    with FeatureTap(model) as tap:
        for v, x in view_batches(data, views, batch_size, device):
            out = model(x)
            logits[v].append(out.float().cpu())
            disc[v].append((tap.read(out) @ weight.T + bias).squeeze(1).float().cpu())
    return torch.stack([torch.cat(p) for p in logits]), torch.stack([torch.cat(d) for d in disc])


class DaFKD(FedDF):
    """FedDF with DaFKD's generator, client discriminators and domain-aware weights."""

    name = "dafkd"
    client_algorithm = "dafkd"
    Config = DaFKDConfig
    uses_discriminators = True
    supports_heterogeneous_models = False  # one feature size for the clients' heads
    reply_metrics = ("gan_d_loss", "gan_g_loss")

    @classmethod
    def distils_on_server_data(cls, config: DaFKDConfig) -> bool:
        return config.distill_data == "server"

    @classmethod
    def check_config(cls, config: Any, c: Checker, cfg: ExperimentConfig | None = None) -> None:
        super().check_config(config, c, cfg)
        gen = config.generator
        c.at("strategy.generator.", gen).require(
            "federated_rounds",
            gen.federated_rounds == 0,
            "must be 0 for dafkd: its generator is trained with the clients' models every round",
        )
        if gen.steps:
            ignored = (
                "ignored: dafkd trains no generator at the server (only name, latent_dim, "
                "width, module, path and lr apply)"
            )
            if cfg is not None and cfg.strict and "strategy.generator.steps" in c.sources:
                c.at("strategy.generator.", gen).fail(
                    "steps", f"{ignored}; strict: true refuses it"
                )
            log(WARNING, "strategy.generator.steps %s", ignored)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        res = self.resources
        assert res is not None
        self.shape = tuple(res.bundle.train.input_shape)
        gen = self.params.generator.build(self.shape, seed=derive_seed(self.cfg.seed, "gen-init"))
        if self.params.generator.path is not None:  # start from saved weights
            gen.load_state_dict(safe_torch_load(self.params.generator.path, "generator file"))
        self.generator = {k: v.detach().numpy().copy() for k, v in gen.state_dict().items()}
        self._generator_module = gen

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "generator": self.generator}

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """The generator is ``strategy.generator``'s (keys, shapes, dtypes, finite values)."""
        problem = super().state_problem(state, server_round)
        if problem is None and state.get("generator") is not None:
            what, of = "'strategy_state.generator'", "strategy.generator's model"
            problem = arrays_problem(state["generator"], self.generator, what, of, bound=None)
        return problem

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("generator") is not None:
            self.generator = state["generator"]

    # -- sending ---------------------------------------------------------------------------
    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        record = super().train_record(server_round, arrays, config)
        record[GENERATOR_KEY] = to_record(self.generator)
        return record

    # -- receiving -------------------------------------------------------------------------
    def begin_round(self, server_round: int) -> None:
        if self.params.distill_data == "generated":
            self._generator_module.load_state_dict(
                {k: torch.from_numpy(np.array(v)) for k, v in self.generator.items()}
            )
            self.distill_set = generated_set(
                self._generator_module,
                self.params.distill_size,
                self.params.generator.latent_dim,
                make_rng(self.cfg.seed, "dafkd", server_round),
                like=self._server_set_template(),
            )
            self.distill_labels = None
            self.views = num_views(self.distill_set, self.params.distill.augment)
        super().begin_round(server_round)
        self.generator_avg = BoundedAverage(
            self.aggregation, f"round {server_round}: the generator", self.generator
        )
        self._disc: dict[str, dict[int, Tensor]] = {"distill": {}, "test": {}}
        self._heads: dict[int, dict[str, np.ndarray]] = {}

    def _server_set_template(self) -> ArrayDataset:
        """How generated images are stored: like the training images (dtype, flips)."""
        assert self.resources is not None
        return self.resources.bundle.train

    def reply_templates(self, pid: int) -> dict[str, Mapping[str, np.ndarray]]:
        """The model, the generator's arrays and a ``Linear(d, 1)`` head."""
        dim = self.feature_dim()
        head = {"weight": np.zeros((1, dim), np.float32), "bias": np.zeros(1, np.float32)}
        return {
            **super().reply_templates(pid),
            GENERATOR_KEY: self.generator,
            DISC_HEAD_KEY: head,
        }

    def uploads_of(self, reply: Reply) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The reply's generator and head, checked (:class:`ReplyRejected` names the problem)."""
        for key in (GENERATOR_KEY, DISC_HEAD_KEY):
            if key not in reply.content.array_records:
                raise ReplyRejected(f"no ArrayRecord '{key}'")
        generator = to_numpy(reply.content[GENERATOR_KEY])
        problem = check_arrays(generator, self.generator, GENERATOR_KEY, of="the generator")
        if problem is not None:
            raise ReplyRejected(problem)
        head = to_numpy(reply.content[DISC_HEAD_KEY])
        dim = self.feature_dim()
        expected = {
            "weight": np.zeros((1, dim), np.float32),
            "bias": np.zeros(1, np.float32),
        }
        problem = check_arrays(head, expected, DISC_HEAD_KEY, of="a Linear(d, 1) head")
        if problem is not None:
            raise ReplyRejected(problem)
        return generator, head

    def feature_dim(self) -> int:
        if not hasattr(self, "_feature_dim"):
            probe = self.model_factory().eval()
            x = torch.as_tensor(self._server_set_template().to_tensors(np.arange(1))[0])
            with torch.no_grad(), FeatureTap(probe) as tap:
                self._feature_dim = int(tap.read(probe(x)).shape[1])
        return self._feature_dim

    def absorb(self, server_round: int, reply: Reply) -> None:
        generator, head = self.uploads_of(reply)
        self._head = head
        super().absorb(server_round, reply)  # teacher logits and discriminator logits
        self.generator_avg.add(generator, reply.num_examples, reply.partition_id)
        self._heads[reply.partition_id] = head

    def teacher_logits(
        self, reply: Reply, split: str, data: ArrayDataset, views: int, batch_size: int
    ) -> Tensor:
        """The teacher pass, also reading D_k's logit ``d_k(h_k(x))`` on every view."""
        assert self.resources is not None
        logits, disc = logits_and_discriminator(
            self.scratch, self._head, data, views, batch_size, self.resources.device
        )
        self._disc[split][reply.partition_id] = disc
        return logits

    def disc_logits(self, pids: list[int], split: str) -> Tensor | None:
        return torch.stack([self._disc[split][p] for p in pids])

    def bound_heads(self, server_round: int, pids: list[int]) -> None:
        """``strategy.aggregation.upload_bound`` on the round's discriminator heads: a head
        whose norm exceeds the bound times the round's median is scaled down to it. Its
        discriminator logits ``d_k(h) = w . h + b`` are linear in the head, so they are
        scaled by the same factor (a WARNING names the client)."""
        heads, self._heads = self._heads, {}
        order = [p for p in pids if p in heads]
        _, bounded = bound_uploads(
            [heads[p] for p in order], self.aggregation.upload_bound, clients=order
        )
        warn_bounded(bounded, f"round {server_round}: the discriminator head")
        for b in bounded:
            for split in self._disc.values():
                if b.client in split:
                    split[b.client] = split[b.client] * b.scale

    def screen_heads(self, server_round: int, pids: list[int]) -> None:
        """The round's discriminators (head on features), all in, screened before any weight
        is computed (:func:`~fedgo_flwr.gan.screen_discriminators`, FedGO's screen): one whose
        logits on the distillation set are not finite, or whose logit scale there exceeds
        ``strategy.aggregation.discriminator_bound`` times the round's median, gets on every sample
        of both sets the lower median of the other heads' logits (the round's typical say; the
        logit 0, ``D = 1/2``, would claim every generated sample, which honest heads call
        fake), a WARNING naming the client. The head's norm bound
        (:meth:`bound_heads`) does not see this: a head of ordinary norm on features of large
        norm (the client's own model) can still give logits far beyond the others'."""
        splits = [s for s in ("distill", "test") if all(p in self._disc[s] for p in pids)]
        stacked = [torch.stack([self._disc[s][p] for p in pids]) for s in splits]
        screen = screen_discriminators(
            stacked,
            pids,
            range(len(pids)),
            self.aggregation.discriminator_bound,
            f"DaFKD round {server_round}",
            "the distillation set",
        )
        for s, z in zip(splits, stacked, strict=True):
            for i, p in enumerate(pids):
                if p in screen.clients:
                    self._disc[s][p] = z[i]

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        pids = [r.partition_id for r in replies]
        self.bound_heads(server_round, pids)  # before any weight is computed
        self.screen_heads(server_round, pids)
        if server_round < self.params.distill_from_round:
            out = self.averaged()
            self.previous = out
            self.bank, self.test_logits = None, {}
        else:
            out = super().aggregate(server_round, replies)
        self.generator = self.generator_avg.result()
        probs = torch.sigmoid(self.disc_logits(pids, "distill")[:, 0].double())  # (K, N)
        self.last_round.update(
            disc_prob_mean=float(probs.mean()),
            disc_prob_spread=float(probs.std(dim=0, unbiased=False).mean()),
        )
        self._disc = {"distill": {}, "test": {}}
        return out
