"""FedGO's GAN settings, shared by the server (strategy) and the clients.

The server builds and trains the generator from :class:`GeneratorConfig` and the clients build
the same generator from it to load its weights; :class:`DiscriminatorConfig` says how each client
trains its discriminator (Jang, Park, Lee, ICML 2025, App. E.2). Both sections live under
``strategy.`` in an experiment configuration (``strategy.generator.*``,
``strategy.discriminator.*``); :class:`GanConfig` groups them for the clients. Every value is
checked by the section's ``check`` method (see :mod:`fedgo_flwr.config.schema`), one key per
check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.gan.critics import build_critic
from fedgo_flwr.gan.discriminator_training import DISCRIMINATOR_LOSSES
from fedgo_flwr.gan.discriminators import DISCRIMINATOR_NAMES, build_discriminator
from fedgo_flwr.gan.external import generator_from_config, load_generator_factory
from fedgo_flwr.gan.generators import GENERATOR_NAMES

__all__ = ["REFERENCES", "DiscriminatorConfig", "GanConfig", "GeneratorConfig"]


@dataclass
class GeneratorConfig:
    """Server generator (FedGO App. E.2: WGAN-GP, Adam 2e-4, betas (0, 0.9), n_critic 5, λ 10).

    ``path``: load a saved generator instead of training one (scenario G2, off-the-shelf, or a
    generator from an earlier run); otherwise it is trained on the server's unlabeled data (G1).
    ``width``: channel width of the ``dcgan``/``resnet`` generator and critic (64 in WGAN-GP's
    reference code; 32 costs about a quarter on a CPU).

    ``module``: G2 with any generator, ``"package.module:callable"`` or
    ``"path/to/file.py:callable"``, a factory called as ``factory(latent_dim=..., shape=(C, H,
    W))`` that returns an ``nn.Module`` mapping ``(n, latent_dim)`` normal codes to ``(n,
    *shape)`` images in ``[-1, 1]`` (:mod:`fedgo_flwr.gan.external`). It replaces ``name`` (and
    ``width``); ``path``, if given, holds its state dict, else the factory's own weights are used.
    ``steps`` must then be 0: WGAN-GP trains only this project's generators (``name``), whose
    critic it has. **The module must be importable on every client too**, not only on the
    server: each client builds the same generator (:meth:`build`) to load the server's weights,
    and a client imports it only if its own node config allows it (``allow-code``,
    :mod:`fedgo_flwr.runtime.trust`; a refusal is the client's error reply naming the module).
    :meth:`check` imports it (on the server and on each client); the strategy's pre-flight
    check builds it and checks its output shape against the classifier's input.

    ``cache``: a folder of trained G1 generators (:mod:`fedgo_flwr.gan.cache`; ``~`` expands).
    A run that trains one (``steps`` > 0, no ``path`` or ``module``) first looks there for the
    generator an earlier run trained on the same server images with the same settings, seed,
    device and torch version, and loads it instead of training; otherwise it trains and stores
    its own. Unset (the default): always train, store nothing.

    ``federated_rounds`` (T'; 0: off): scenario G3, the generator and its WGAN-GP critic trained
    federatedly with FedGAN before the discriminator round (``strategies/_fedgan.py``): each
    round every client trains both for ``local_epochs`` passes of the critic over its data and
    the server averages them (paper: T' = 5, 3 epochs). Needs no server data; ``steps`` must be
    0 (the server trains nothing itself) and there is no ``path`` or ``module`` to load.
    """

    name: str = "dcgan"
    latent_dim: int = 100
    """Size of the generator's normal latent codes."""
    width: int = 64
    steps: int = 1000
    batch_size: int = 64
    """WGAN-GP batch size."""
    lr: float = 2e-4
    """Adam's learning rate (generator and critic)."""
    n_critic: int = 5
    """Critic steps per generator step (WGAN-GP)."""
    gp_lambda: float = 10.0
    """Weight of WGAN-GP's gradient penalty."""
    path: str | None = None
    module: str | None = None
    federated_rounds: int = 0
    local_epochs: int = 3
    cache: str | None = None

    def build(self, shape: Sequence[int], *, seed: int | None = None) -> nn.Module:
        """This section's generator for samples of ``shape`` (seeded initial weights): the
        factory of ``module`` if set, else ``name``; the one builder of server and clients
        (:func:`~fedgo_flwr.gan.external.generator_from_config`)."""
        return generator_from_config(self, shape, seed=seed)

    def build_critic(self, shape: Sequence[int], *, seed: int | None = None) -> nn.Module:
        """The WGAN-GP critic of this section's generator (G1 at the server, G3 at clients)."""
        return build_critic(self.name, shape, seed=seed, **self.model_kwargs())

    def wgan_kwargs(self) -> dict[str, float]:
        """The WGAN-GP settings of :func:`~fedgo_flwr.gan.wgan_gp.train_wgan_gp` beyond the
        networks, the data, the number of steps and the randomness."""
        return {
            "batch_size": self.batch_size,
            "lr": self.lr,
            "n_critic": self.n_critic,
            "gp_lambda": self.gp_lambda,
        }

    def model_kwargs(self) -> dict[str, int]:
        """Keyword arguments of :func:`~fedgo_flwr.gan.generators.build_generator` and
        :func:`~fedgo_flwr.gan.critics.build_critic` beyond the name and the shapes."""
        return {"width": self.width} if self.name in ("dcgan", "resnet") else {}

    def check(self, c: Checker) -> None:
        c.choice("name", GENERATOR_NAMES)
        c.require("latent_dim", self.latent_dim >= 1, "must be >= 1")
        c.require("width", self.width >= 1, "must be >= 1")
        c.require("steps", self.steps >= 0, "must be >= 0")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("n_critic", self.n_critic >= 1, "must be >= 1")
        c.require("gp_lambda", self.gp_lambda >= 0, "must be >= 0")
        c.require("federated_rounds", self.federated_rounds >= 0, "must be >= 0 (0: no G3)")
        c.require("local_epochs", self.local_epochs >= 1, "must be >= 1")
        if self.cache is not None:
            c.require("cache", self.cache.strip() != "", "must be a folder (or unset: no cache)")
        if self.federated_rounds > 0:
            g3 = f"with {c.prefix}federated_rounds > 0 (scenario G3, FedGAN at the clients)"
            c.require("steps", self.steps == 0, f"must be 0 {g3}: the server trains nothing")
            c.require("path", self.path is None, f"must be unset {g3}")
            c.require("module", self.module is None, f"must be unset {g3}")
        if self.module is not None:
            try:
                load_generator_factory(self.module, f"{c.prefix}module")
            except ValueError as exc:
                c.fail(
                    "module",
                    f"{exc} (the module must be importable on the server and on every client)",
                )
            c.require(
                "steps",
                self.steps == 0,
                f"must be 0 with {c.prefix}module: an off-the-shelf generator (scenario G2) is "
                "used as it is (its own weights, or those of path); WGAN-GP trains only this "
                "project's generators (name)",
            )


REFERENCES: tuple[str, ...] = ("generator", "server", "mixture")
"""What a client discriminator learns to tell its data from (``discriminator.reference``)."""


@dataclass
class DiscriminatorConfig:
    """Client discriminators (FedGO App. E.2: 4-layer CNN, Adam 2e-4, betas (0.5, 0.999)).

    ``epochs``: 30 in the paper on CIFAR. ``path``: reuse discriminators saved by an earlier
    run (``discriminators.pt``) instead of a discriminator round. ``loss``: the squashing the
    discriminator is trained through (``sigmoid``: BCE on sigmoid(z), the paper's Alg. 3).

    Beyond the paper (informative discriminators): by FedGO's Eq. (9) the weight
    is ``n_k p_k(x) / sum_i n_i p_i(x)``, and a discriminator trained against any reference
    density ``p_ref`` estimates ``p_k / p_ref``; the reference cancels in the weights wherever it
    covers the clients' data. ``reference`` picks it:

    * ``generator`` (the paper, Alg. 3): samples of the server's generator G;
    * ``server``: the server's unlabeled images, ``reference_size`` of them (0: its whole share)
      drawn once per run with the seed and sent with the discriminator message (the bytes are
      reported in ``prefl.json``); no generator is needed unless the distillation set is
      generated (D2);
    * ``mixture``: each negative batch takes a ``mixture`` share of server images, the rest
      from G.

    Regularisers that keep D_k from saturating: ``spectral_norm`` (every conv/linear layer),
    ``label_smoothing`` (one-sided: real targets ``1 - s``, Salimans et al. 2016), and early
    stopping (``patience`` epochs without a lower loss on a held-out ``holdout`` share of the
    client's data and of the reference; the best epoch's weights are kept; 0: off).
    """

    name: str = "cnn4"
    """The discriminator network."""
    epochs: int = 5
    batch_size: int = 64
    """Discriminator training batch size."""
    lr: float = 2e-4
    """Adam's learning rate."""
    loss: str = "sigmoid"
    path: str | None = None
    reference: str = "generator"
    reference_size: int = 0
    mixture: float = 0.5
    spectral_norm: bool = False
    label_smoothing: float = 0.0
    patience: int = 0
    holdout: float = 0.1

    @property
    def uses_generator(self) -> bool:
        """Whether the negatives include samples of G."""
        return self.reference != "server"

    @property
    def uses_server_images(self) -> bool:
        """Whether the server sends images of its own share as negatives."""
        return self.reference != "generator"

    def build(self, shape: Sequence[int], *, seed: int | None = None) -> nn.Module:
        """This section's discriminator for inputs of ``shape`` (seeded initial weights)."""
        return build_discriminator(self.name, shape, seed=seed, spectral_norm=self.spectral_norm)

    def check(self, c: Checker) -> None:
        c.choice("name", DISCRIMINATOR_NAMES)
        c.choice("loss", DISCRIMINATOR_LOSSES)
        c.choice("reference", REFERENCES)
        c.require("epochs", self.epochs >= 1, "must be >= 1")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("reference_size", self.reference_size >= 0, "must be >= 0 (0: all)")
        c.require("mixture", 0 < self.mixture < 1, "must lie in (0, 1)")
        c.require("label_smoothing", 0 <= self.label_smoothing < 0.5, "must lie in [0, 0.5)")
        c.require("patience", self.patience >= 0, "must be >= 0 (0: no early stopping)")
        c.require("holdout", 0 < self.holdout < 1, "must lie in (0, 1)")


@dataclass
class GanConfig:
    """The generator and discriminator sections together (what a client needs)."""

    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)
