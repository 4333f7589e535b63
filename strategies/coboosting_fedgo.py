"""Co-Boosting with FedGO's discriminator-odds weights (beyond both papers).

One-shot FL as :class:`~strategies.coboosting.CoBoosting`, but the ensemble weighs client
``k`` on sample ``x`` by FedGO's odds weight ``w_k(x) = n_k Phi_k(x) / sum_i n_i Phi_i(x)``
(Jang, Park, Lee, ICML 2025, Thm 3.6 Eq. (9)) instead of, or on top of, Co-Boosting's learned
scalar ``w_k``. The generator G goes out with the one training message; every client trains
its model and then its discriminator against G and uploads both in the same reply
(``clients/oneshot_fedgo.py``): still one round, and the discriminators cost one extra
upload each. G is loaded from ``strategy.generator.path`` (FedGO's G2, an off-the-shelf
generator; ``strategy.generator.module`` names any generator factory, see
:mod:`fedgo_flwr.gan.external`), trained on the server's share when it has one (G1,
``generator.steps > 0``), and otherwise left untrained (seeded): FedGO's Table 12 reports odds
against an untrained G already help.

``combine``: ``odds`` (FedGO's weights alone; the scalar weights stay 1/n) or ``odds_learned``
(member ``k`` weighs ``w_k Phi-weight_k(x)``, ``w`` learned by Co-Boosting's eq. 12 through the
odds). The weights enter everywhere the ensemble does: synthesis, the weight steps,
diversification, distillation, and the reported ``ensemble_accuracy_fedgo`` (odds only) and
``ensemble_accuracy_learned`` (the combination). A client whose discriminator is missing or
unusable is left out with its model (it has no weight to give). Once every reply is in, each
discriminator's logit scale is checked against the others'
(``strategy.aggregation.discriminator_bound`` times their median;
:meth:`CoBoostingFedGO.screened`): one far above them, a large bias or a scaled last layer,
weighs with the lower median of the others' logits instead (on every sample: the typical
client's say, not the logit 0, which would claim synthetic samples that honest discriminators
call fake). No client's odds weight averaged
over a batch exceeds its cap (:func:`~fedgo_flwr.weighting.mean_share_caps`:
``max(2/n, 3 n_k / sum n)``, and with 3 or more clients at most ``max(1/2, n_k / sum n)``).

``disc_mode``: the odds from a discriminator logit ``z``, FedGO's App. E.2 double sigmoid
``exp(sigmoid(z))`` by default or its Def. 3.5 odds ``exp(z)`` (``sigmoid``); which to take
against an untrained G: ``docs/architecture.md`` ("Co-Boosting with FedGO's odds").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.supercore import log
from torch import Tensor, nn

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.datafree import (
    BoostSettings,
    DataFreeDistillation,
    fedgo_multipliers,
)
from fedgo_flwr.gan import screen_discriminators
from fedgo_flwr.gan.settings import DiscriminatorConfig, GeneratorConfig
from fedgo_flwr.learning.aggregation import check_arrays
from fedgo_flwr.learning.training import predict_logits
from fedgo_flwr.protocol.oneshot_fedgo import DISCRIMINATOR_KEY
from fedgo_flwr.runtime.fileio import safe_torch_load
from fedgo_flwr.runtime.messages import to_numpy
from fedgo_flwr.weighting import (
    DISC_MODES,
    SHARE_CAP_RULE,
    cap_mean_shares,
    mean_share_caps,
)
from strategies._prefl import check_generator, seeded_generator, train_generator
from strategies.base import Reply, ReplyRejected
from strategies.coboosting import CoBoosting, CoBoostingConfig

__all__ = ["CoBoostingFedGO", "CoBoostingFedGOConfig"]

COMBINE = ("odds", "odds_learned")
GENERATOR_KEY = "generator"


@dataclass
class CoBoostingFedGOConfig(CoBoostingConfig):
    """Co-Boosting's parameters plus FedGO's generator and discriminator sections."""

    combine: str = "odds_learned"
    """The ensemble weighs client k on sample x by FedGO's odds weight ``n_k Phi_k(x) / sum_i n_i
    Phi_i(x)`` alone (``odds``) or times Co-Boosting's learned ``w_k`` (``odds_learned``)."""
    disc_mode: str = "double_sigmoid"
    """How discriminator logits become odds, as FedGO's ``disc_mode``."""
    generator: GeneratorConfig = field(default_factory=lambda: GeneratorConfig(steps=0))
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)

    def check(self, c: Checker) -> None:
        c.choice("combine", COMBINE)
        c.choice("disc_mode", DISC_MODES)


class MedianDiscriminator(nn.Module):
    """The stand-in for a discriminator the screen refused: on every input, the lower median
    of the logits of the discriminators that passed (``others``; 0 if none did), the say of
    the typical client (:func:`~fedgo_flwr.gan.neutral_logits`). The logit 0 (odds 1) is no
    neutral value on synthetic samples, which honest discriminators may call fake with logits
    far below 0: there it would take more than any honest client's share. Gradients flow
    through the median to the inputs, as through the others (synthesis)."""

    def __init__(self, others: list[nn.Module]) -> None:
        super().__init__()
        self.others = list(others)  # not registered: they are the ensemble's own modules

    def forward(self, x: Tensor) -> Tensor:
        if not self.others:
            return x.new_zeros(x.shape[0], 1)
        z = torch.stack([d(x).float().reshape(x.shape[0], -1) for d in self.others])
        return z.median(dim=0).values


class CoBoostingFedGO(CoBoosting):
    """Co-Boosting whose ensemble weighs each sample by the clients' discriminator odds."""

    name = "coboosting_fedgo"
    client_algorithm = "oneshot_fedgo"
    Config = CoBoostingFedGOConfig

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        super().preflight(cfg, c)
        gp = cfg.strategy.params.generator
        dp = cfg.strategy.params.discriminator
        c.at("strategy.discriminator.", dp).require(
            "reference",
            dp.reference == "generator",
            "must be 'generator' in the one-shot setting: the server sends no images",
        )
        c.at("strategy.generator.", gp).require(
            "federated_rounds",
            gp.federated_rounds == 0,
            "must be 0 in the one-shot setting: FedGAN (G3) takes rounds of its own",
        )
        if gp.steps > 0 and not gp.path:
            c.at("data.", cfg.data).require(
                "server_fraction",
                cfg.data.server_fraction > 0,
                "must be > 0 to train the generator on server data (strategy.generator.steps "
                "> 0); or give strategy.generator.path, or steps: 0 for an untrained generator",
            )
        check_generator(cfg, c)  # strategy.generator.module: builds, right output shape

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.discriminators: dict[int, dict[str, np.ndarray]] = {}
        self._disc_modules: list[nn.Module] | None = None
        self._test_disc: Tensor | None = None
        self.generator = self._generator()
        shape = self.resources.bundle.train.input_shape
        ref = self.params.discriminator.build(shape, seed=0)
        self._disc_reference = {k: v.numpy() for k, v in ref.state_dict().items()}

    def _generator(self) -> nn.Module:
        """G: loaded (G2), trained on the server's share (G1), or untrained (seeded)."""
        gp, res = self.params.generator, self.resources
        shape = res.bundle.train.input_shape
        gen = seeded_generator(self.cfg.seed, gp, shape)
        if gp.path:
            gen.load_state_dict(safe_torch_load(gp.path, "generator file"))
            log(INFO, "%s: generator loaded from %s", self.name, gp.path)
        elif gp.steps > 0:
            server_share = res.bundle.train.subset(res.partition.server)
            train_generator(gen, self.cfg, server_share, res.device, shape)
        elif gp.module:
            log(INFO, "%s: generator of strategy.generator.module %s", self.name, gp.module)
        else:
            log(INFO, "%s: untrained generator (seeded)", self.name)
        return gen.cpu().eval()

    # -- the round -------------------------------------------------------------------------
    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        record = super().train_record(server_round, arrays, config)
        record[GENERATOR_KEY] = ArrayRecord(self.generator.state_dict())
        return record

    def reply_templates(self, pid: int) -> dict[str, Mapping[str, np.ndarray]]:
        """The model of the client's architecture, and its discriminator."""
        return {**super().reply_templates(pid), DISCRIMINATOR_KEY: self._disc_reference}

    def check_reply(self, content: RecordDict) -> str | None:
        if DISCRIMINATOR_KEY not in content.array_records:
            return f"no ArrayRecord '{DISCRIMINATOR_KEY}' (the client's discriminator)"
        return check_arrays(
            to_numpy(content[DISCRIMINATOR_KEY]), self._disc_reference, "discriminator"
        )

    def absorb(self, server_round: int, reply: Reply) -> None:
        if DISCRIMINATOR_KEY in reply.content.array_records:
            disc = {k: np.array(v) for k, v in to_numpy(reply.content[DISCRIMINATOR_KEY]).items()}
        elif reply.partition_id in self.discriminators:  # reused uploads (teachers_from)
            disc = self.discriminators[reply.partition_id]
        else:  # check_reply refused it already; for safety
            raise ReplyRejected("no discriminator")
        problem = self.discriminator_problem(disc)
        if problem is not None:
            raise ReplyRejected(problem)
        super().absorb(server_round, reply)
        self.discriminators[reply.partition_id] = disc

    def discriminator_problem(self, disc: Mapping[str, np.ndarray]) -> str | None:
        """Why ``disc`` cannot weigh the ensemble (``None`` if it can): logits on the test
        split that are not finite. Finite weights can give them (a scaled upload), and one
        such discriminator makes the odds weights of every sample undefined, so synthesis
        would fail; the reply is dropped, model and discriminator, before either is used."""
        shape = self.resources.bundle.train.input_shape
        d = self.params.discriminator.build(shape, seed=0)  # seeded: the global RNG is untouched
        d.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in disc.items()})
        z = predict_logits(
            d, self.resources.bundle.test, self.params.teacher_batch_size, self.resources.device
        )
        if not torch.isfinite(z).all():
            return "discriminator: its logits on the test split are not finite"
        return None

    def drop_teacher(self, pid: int) -> None:
        super().drop_teacher(pid)
        self.discriminators.pop(pid, None)
        self._disc_modules, self._test_disc = None, None

    @classmethod
    def extra_fingerprint(cls, cfg: ExperimentConfig) -> dict[str, Any] | None:
        p = cfg.strategy.params
        generator = dataclasses.asdict(p.generator)
        generator.pop("cache")  # where trained generators are kept shapes nothing here
        return {
            "generator": generator,
            "discriminator": dataclasses.asdict(p.discriminator),
        }

    def extra_uploads(self, pid: int) -> dict[str, np.ndarray] | None:
        return self.discriminators.get(pid)

    def load_extra_uploads(self, pid: int, arrays: dict[str, np.ndarray]) -> None:
        problem = check_arrays(arrays, self._disc_reference, "discriminator")
        if problem is not None:
            raise ValueError(f"saved discriminator of client {pid}: {problem}")
        self.discriminators[pid] = arrays

    # -- the weights -----------------------------------------------------------------------
    def discriminator_modules(self) -> list[nn.Module]:
        """The uploaded discriminators, in :attr:`pids` order, frozen; each one screened
        against the others before it weighs anything (:meth:`screened`)."""
        if self._disc_modules is None:
            shape = self.resources.bundle.train.input_shape
            mods: list[nn.Module] = []
            for pid in self.pids:
                d = self.params.discriminator.build(shape)
                d.load_state_dict(
                    {k: torch.from_numpy(v) for k, v in self.discriminators[pid].items()}
                )
                mods.append(d.to(self.resources.device).eval().requires_grad_(False))
            self._disc_modules = self.screened(mods)
        return self._disc_modules

    def screened(self, mods: list[nn.Module]) -> list[nn.Module]:
        """``mods`` with every discriminator whose logit scale on the test split exceeds
        ``strategy.aggregation.discriminator_bound`` times the lower median of all of them
        (:func:`~fedgo_flwr.gan.screen_discriminators`, the screen FedGO, CPFL and DaFKD use:
        the root mean square of its raw logits, so a large bias counts as much as a scaled
        last layer) replaced by the lower median of the others' logits on every input
        (:class:`MedianDiscriminator`: the typical client's say), a WARNING naming the
        client.

        All of the round's discriminators arrive before any of them is screened: the check
        compares each with the others, and no weight is computed before it. Its model stays a
        member of the ensemble (its logits are checked as a teacher's)."""
        res, bound = self.resources, self.aggregation.discriminator_bound
        z = torch.stack(
            [
                predict_logits(d, res.bundle.test, self.params.teacher_batch_size, res.device)
                .float()
                .view(-1)
                .cpu()
                for d in mods
            ]
        )
        screen = screen_discriminators(
            z, self.pids, range(len(mods)), bound, self.name, "the test split"
        )
        neutral = set(screen.clients)
        passed = [d for p, d in zip(self.pids, mods, strict=True) if p not in neutral]
        pids = zip(self.pids, mods, strict=True)
        return [MedianDiscriminator(passed) if p in neutral else d for p, d in pids]

    def sizes(self) -> Tensor:
        return torch.tensor([self.teacher_sizes[p] for p in self.pids], dtype=torch.float32)

    def odds_weights(self, x: Tensor) -> Tensor:
        """``n_k Phi_k(x) / sum_i n_i Phi_i(x)`` on a batch of model inputs, ``(n, N)``, with
        no client's mean share over the batch above its cap
        (:func:`~fedgo_flwr.weighting.mean_share_caps`,
        :func:`~fedgo_flwr.weighting.cap_mean_shares`)."""
        z = torch.stack([d(x).float().view(-1) for d in self.discriminator_modules()])
        sizes = self.sizes()
        w = fedgo_multipliers(z, sizes.to(z.device), self.params.disc_mode)
        return cap_mean_shares(w, mean_share_caps(sizes))[0]

    def boost_settings(self) -> BoostSettings:
        """``odds`` keeps the scalar weights at 1/n: no weight steps."""
        boost = self.params.boost
        return (
            dataclasses.replace(boost, reweight=False) if self.params.combine == "odds" else boost
        )

    def build_engine(self, initial: dict[str, np.ndarray]) -> DataFreeDistillation:
        engine = super().build_engine(initial)
        engine.sample_weights = self.odds_weights
        return engine

    def test_odds(self) -> Tensor:
        """The FedGO weights on the test split, ``(n, N)`` (computed once)."""
        if self._test_disc is None:
            test, dev = self.resources.bundle.test, self.resources.device
            bs = self.params.teacher_batch_size
            z = torch.stack(
                [
                    predict_logits(d, test, bs, dev).float().view(-1)
                    for d in self.discriminator_modules()
                ]
            )
            sizes = self.sizes()
            odds = fedgo_multipliers(z, sizes, self.params.disc_mode)
            caps = mean_share_caps(sizes)
            self._test_disc, capped = cap_mean_shares(odds, caps)
            for i in capped:
                log(
                    WARNING,
                    "%s: the odds weights of client %d on the test split: mean share above its "
                    "cap %.3g (%s); scaled down to it (and on every synthetic batch)",
                    self.name,
                    self.pids[i],
                    float(caps[i]),
                    SHARE_CAP_RULE,
                )
        return self._test_disc

    def ensemble_metrics(self) -> dict[str, float]:
        out = super().ensemble_metrics()
        odds = self.test_odds()
        out["ensemble_accuracy_fedgo"] = self.ensemble_accuracy(odds)
        if self.engine is not None:
            out["ensemble_accuracy_learned"] = self.ensemble_accuracy(
                self.engine.weights[:, None] * odds
            )
        return out

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["discriminators"] = [
            {"pid": p, "arrays": self.discriminators[p]} for p in sorted(self.discriminators)
        ]
        return state

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(state)
        self.discriminators = {
            int(d["pid"]): dict(d["arrays"]) for d in state.get("discriminators", [])
        }
        self._disc_modules, self._test_disc = None, None
