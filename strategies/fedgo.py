"""FedGO: ensemble distillation weighted by client-discriminator odds.

Jang, Park, Lee, "Provably Near-Optimal Federated Ensemble Distillation with Negligible
Overhead", ICML 2025, Sec. 3.2, Alg. 1-3 (App. D) and App. E.2.

Pre-FL stage (:meth:`FedGO.setup`, before round 1, once per run; the generator and the
discriminator round are :class:`strategies._prefl.DiscriminatorStage`, a part shared with CPFL
and built here as ``self.prefl``): the server obtains a generator G (trained with WGAN-GP on its
unlabeled data, G1, or loaded from ``strategy.generator.path``, G2); G goes to every client
(``train.discriminator``), each trains its discriminator D_k once against the frozen G (Alg. 3)
and sends it back; the server keeps G and the D_k on disk (``generator.pt``,
``discriminators.pt``) and computes every D_k's logits on the distillation set and the test split
once.

Each round is FedDF's (``strategies/feddf.py``) with the weighting
``w_k(x) = n_k Φ_k(x) / Σ_{i∈A^t} n_i Φ_i(x)``, Φ = D/(1-D), over the round's participating
clients (Thm 3.6, Eq. 9), D the paper's double sigmoid by default
(``weighting_params: {disc_mode: double_sigmoid}``, odds in (1, e)). The same stage serves the
DaFKD-style ``domain`` weighting. ``distill_data``: ``server`` (D1) or ``generated`` (D2,
``generated_size`` samples of G drawn once). Beyond the paper,
``strategy.discriminator.reference`` has the clients train D_k against the server's own images.

A client whose discriminator never arrives or is unusable (checked like a model reply:
:meth:`FedGO._discriminator_problem`; a bad one is dropped with a warning naming the client)
gets the neutral logits everywhere: on each sample the lower median of the logits of the
discriminators that passed the screen (:func:`~fedgo_flwr.gan.screen_discriminators`).
Discriminators loaded from a file get the same checks. ``docs/architecture.md`` ("FedGO") has
the stage, the reference and the checks in full.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from logging import INFO, WARNING

import torch
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan import (
    count_bytes,
    discriminator_logits,
    generated_set,
    screen_discriminators,
)
from fedgo_flwr.gan.settings import DiscriminatorConfig, GeneratorConfig
from fedgo_flwr.learning.distill import num_views
from fedgo_flwr.runtime.fileio import atomic_write_text, strict_json
from fedgo_flwr.runtime.rng import make_rng
from fedgo_flwr.weighting import byzantine_clients, get_weighting, make_byzantine
from strategies._prefl import DiscriminatorStage, check_generator, discriminator_stats
from strategies.feddf import FedDF, FedDFConfig

DISTILL_DATA = ("server", "generated")


@dataclass
class FedGOConfig(FedDFConfig):
    """FedDF's parameters plus the generator, the discriminators and the distillation data.

    ``generator`` and ``discriminator`` are also the clients' parameters (``clients/fedgo.py``).
    """

    weighting: str = "fedgo"
    """FedGO's odds weights by default."""
    distill_data: str = "server"
    """``server`` (D1: the server's unlabeled share) or ``generated`` (D2: ``generated_size``
    samples of the generator, drawn once). D2 works with ``data.server_fraction: 0`` when the
    generator is loaded, built by ``generator.module``, untrained (``generator.steps: 0``) or
    trained by FedGAN (G3), with the ``fedgo`` distillation protocol."""
    generated_size: int = 10_000
    """Samples in the generated distillation set (D2)."""
    byzantine: int = 0
    """FedGO App. F.8: this many clients (seeded, the same all run, listed in ``prefl.json``) return
    a discriminator that outputs its maximum everywhere. Defences: ``weighting_params.fedgo.clip``,
    ``weight_cap``."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)

    def check(self, c: Checker) -> None:
        c.choice("distill_data", DISTILL_DATA)
        c.require("generated_size", self.generated_size >= 1, "must be >= 1")
        c.require("byzantine", self.byzantine >= 0, "must be >= 0")
        if self.distill_data == "generated":
            c.require(
                "weighting",
                "labels" not in get_weighting(self.weighting).requires,
                f"'{self.weighting}' needs labels, which generated data lacks",
            )


class FedGO(FedDF):
    """FedDF with discriminator-odds weighting and FedGO's pre-FL stage."""

    name = "fedgo"
    client_algorithm = "fedgo"
    Config = FedGOConfig
    uses_discriminators = True

    @classmethod
    def check_config(
        cls, config: FedGOConfig, c: Checker, cfg: ExperimentConfig | None = None
    ) -> None:
        super().check_config(config, c, cfg)
        if cfg is not None:
            k = cfg.data.num_clients
            c.require(
                "byzantine",
                config.byzantine <= k,
                f"must be at most data.num_clients ({k})",
            )

    @classmethod
    def distils_on_server_data(cls, config: FedGOConfig) -> bool:
        return config.distill_data == "server"

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        super().preflight(cfg, c)
        check_generator(cfg, c)  # strategy.generator.module
        params = cfg.strategy.params
        if cfg.data.server_fraction > 0 or cfg.data.public_path is not None:
            return  # the server has unlabeled images (its share, or the public ones)
        dp = params.discriminator
        c.at("strategy.discriminator.", dp).require(
            "reference",
            not dp.uses_server_images,
            f"'{dp.reference}' sends server images, and data.server_fraction 0 leaves none; "
            "use 'generator'",
        )
        # No server data (data-free, scenario D2): the generator cannot be trained on it (G1).
        gen = params.generator
        c.at("strategy.generator.", gen).require(
            "path",
            gen.path is not None or gen.steps == 0 or params.discriminator.path is not None,
            "is needed with data.server_fraction 0: there is no server data to train the "
            "generator on (scenario G1); load one (G2), train it at the clients "
            "(generator.federated_rounds > 0 and steps 0: G3), or set generator.steps 0 "
            "(untrained)",
        )
        c.at("strategy.distill.", params.distill).require(
            "protocol",
            params.distill.protocol != "feddf",
            "feddf early-stops on labelled server data; with data.server_fraction 0 use "
            "the fedgo protocol",
        )

    def disc_logits(self, pids: list[int], split: str) -> torch.Tensor | None:
        return self._disc[split][pids]

    # -- pre-FL stage ----------------------------------------------------------------------
    def setup(self, grid: Grid) -> None:
        res = self.resources
        assert res is not None
        shape = res.bundle.train.input_shape
        self.prefl = DiscriminatorStage(
            self.cfg,
            res,
            self.outbox,
            run_token=self.run_token,
            data=self.server_unlabeled,
            needs_generator=self.params.discriminator.uses_generator
            or self.params.distill_data == "generated",
            resuming=self.resuming,
            aggregation=self.aggregation,
            stage_times=self.stage_times,
        )
        generator, disc_path, report = self.prefl.obtain_generator(grid)
        discs, disc_report = self.prefl.discriminators(grid, generator, disc_path)
        report.update(disc_report)
        if self.params.distill_data == "generated":
            self._use_generated_data(generator)
        t0 = time.perf_counter()
        self._disc = {
            "distill": self._logits_all(discs, self.distill_set, self.views, "the server set"),
            "test": self._logits_all(discs, res.bundle.test, 1, "the test split"),
        }
        report["disc_logits_time"] = time.perf_counter() - t0
        screen = screen_discriminators(
            [self._disc["distill"], self._disc["test"]],
            range(self.cfg.data.num_clients),
            sorted(discs),
            self.aggregation.discriminator_bound,
            "FedGO",
            "the distillation set",
        )
        if screen.nonfinite:
            report["nonfinite_discriminators"] = screen.nonfinite
        if screen.scaled:
            report["scaled_discriminators"] = [pid for pid, _, _ in screen.scaled]
        if self.params.byzantine:
            liars = byzantine_clients(
                self.cfg.seed, self.cfg.data.num_clients, self.params.byzantine
            )
            self._disc = {split: make_byzantine(z, liars) for split, z in self._disc.items()}
            report["byzantine_clients"] = liars
            log(
                WARNING,
                "FedGO: clients %s return Byzantine discriminators (strategy.byzantine %d): "
                "maximal output everywhere",
                liars,
                self.params.byzantine,
            )
        report["disc_stats"] = discriminator_stats(self._disc["distill"][sorted(discs), 0])
        report["bytes"] = {
            "model": count_bytes(self.model_factory()),
            "generator": count_bytes(generator),
            "discriminator": count_bytes(self.params.discriminator.build(shape)),
        }
        name = "prefl-resume.json" if self.resuming else "prefl.json"
        text = strict_json(report, name=name, indent=2, default=float)
        atomic_write_text(res.out_dir / name, text)  # a link at the name is replaced
        log(INFO, "FedGO pre-FL stage done: %s", json.dumps(report["bytes"]))

    def _use_generated_data(self, generator: torch.nn.Module) -> None:
        """Scenario D2: G's samples, drawn once, replace the server data for distillation."""
        self.distill_set = generated_set(
            generator,
            self.params.generated_size,
            self.params.generator.latent_dim,
            make_rng(self.cfg.seed, "d2-samples"),
            like=self.distill_set,
        )
        self.distill_labels = None
        self.views = num_views(self.distill_set, self.params.distill.augment)

    def _logits_all(
        self, discs: dict[int, torch.nn.Module], data: ArrayDataset, views: int, what: str
    ) -> torch.Tensor:
        """``(K, V, N)`` raw logits of every client's discriminator (0 where it is missing) on
        ``what`` (named in progress lines)."""
        assert self.resources is not None
        return discriminator_logits(
            discs,
            data,
            views=views,
            num_clients=self.cfg.data.num_clients,
            device=self.resources.device,
            batch_size=self.params.teacher_batch_size,
            progress=f"FedGO discriminator logits on {what}",
        )
