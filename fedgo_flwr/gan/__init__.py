"""FedGO's GANs: generators, WGAN-GP critics and client discriminators (plain PyTorch, no Flower).

FedGO (Jang, Park & Lee, ICML 2025) weights client ``k``'s prediction on a sample ``x`` by
``w_k(x) = n_k Φ_k(x) / Σ_i n_i Φ_i(x)`` with ``Φ_k = D_k / (1 - D_k)`` the odds of client ``k``'s
discriminator ``D_k`` (Sec. 3.1.2, Thm 3.6, Eq. (9)). Its *pre-FL* stage (Sec. 3.2, App. D) needs
a generator at the server, trained with WGAN-GP (Gulrajani et al., 2017), and one discriminator
per client trained against it. This package holds, by what each part owns:

* :mod:`fedgo_flwr.gan.generators`, :mod:`fedgo_flwr.gan.critics`,
  :mod:`fedgo_flwr.gan.discriminators` -- the architectures (generators, WGAN-GP critics, client
  discriminators with raw-logit output), each kind with its builder and name tuple;
* :mod:`fedgo_flwr.gan.common` -- what they share: shape checks, :func:`upsampling_plan`,
  seeded construction, DCGAN initialisation, :func:`count_bytes`;
* :mod:`fedgo_flwr.gan.wgan_gp` -- WGAN-GP training of the generator and its gradient penalty,
  FedGAN's generator steps;
* :mod:`fedgo_flwr.gan.discriminator_training` -- client discriminator training (Alg. 3);
* :mod:`fedgo_flwr.gan.sampling` -- sampling the generator, and the discriminators' logits on a
  data set;
* :mod:`fedgo_flwr.gan.external` -- generators from a user's factory
  (``strategy.generator.module``, scenario G2 with any ``nn.Module``) and the one builder of
  FedGO's generator from its configuration, :func:`generator_from_config`;
* :mod:`fedgo_flwr.gan.cache` -- trained G1 generators stored under a hash of what they depend
  on, for later runs to load (``strategy.generator.cache``);
* :mod:`fedgo_flwr.gan.settings` -- the generator / discriminator configuration sections that the
  server and the clients share.

The names below are re-exported here: ``from fedgo_flwr.gan import build_generator`` works.
"""

from fedgo_flwr.gan.cache import (
    GENERATOR_CACHE_VERSION,
    CachedGenerator,
    generator_key,
    load_cached_generator,
    store_generator,
    training_snapshot,
)
from fedgo_flwr.gan.common import count_bytes, upsampling_plan
from fedgo_flwr.gan.critics import (
    CRITIC_NAMES,
    DCGANCritic,
    MLPCritic,
    ResNetCritic,
    build_critic,
)
from fedgo_flwr.gan.discriminator_training import DISCRIMINATOR_LOSSES, train_discriminator
from fedgo_flwr.gan.discriminators import (
    DISCRIMINATOR_NAMES,
    CNN4Discriminator,
    CNNMLPDiscriminator,
    MLPDiscriminator,
    ResNet8Discriminator,
    build_discriminator,
)
from fedgo_flwr.gan.external import (
    build_module_generator,
    generator_from_config,
    generator_output_problem,
    load_generator_factory,
)
from fedgo_flwr.gan.generators import (
    GENERATOR_NAMES,
    DCGANGenerator,
    MLPGenerator,
    ResNetGenerator,
    build_generator,
)
from fedgo_flwr.gan.sampling import (
    DiscriminatorScreen,
    discriminator_logits,
    discriminator_scale_outliers,
    generated_set,
    neutral_logits,
    neutralise_nonfinite,
    sample,
    screen_discriminators,
    stored_like,
)
from fedgo_flwr.gan.settings import REFERENCES, DiscriminatorConfig, GanConfig, GeneratorConfig
from fedgo_flwr.gan.wgan_gp import (
    fedgan_generator_steps,
    gradient_penalty,
    interpolate_gradient_norms,
    train_wgan_gp,
)

__all__ = [
    "CRITIC_NAMES",
    "GENERATOR_CACHE_VERSION",
    "CachedGenerator",
    "generator_key",
    "load_cached_generator",
    "store_generator",
    "training_snapshot",
    "DISCRIMINATOR_LOSSES",
    "DISCRIMINATOR_NAMES",
    "GENERATOR_NAMES",
    "REFERENCES",
    "CNN4Discriminator",
    "CNNMLPDiscriminator",
    "DCGANCritic",
    "DCGANGenerator",
    "DiscriminatorConfig",
    "GanConfig",
    "GeneratorConfig",
    "MLPCritic",
    "MLPDiscriminator",
    "MLPGenerator",
    "ResNet8Discriminator",
    "ResNetCritic",
    "ResNetGenerator",
    "build_critic",
    "build_discriminator",
    "build_generator",
    "build_module_generator",
    "count_bytes",
    "discriminator_logits",
    "neutralise_nonfinite",
    "neutral_logits",
    "discriminator_scale_outliers",
    "screen_discriminators",
    "DiscriminatorScreen",
    "fedgan_generator_steps",
    "generator_from_config",
    "generator_output_problem",
    "gradient_penalty",
    "interpolate_gradient_norms",
    "load_generator_factory",
    "generated_set",
    "sample",
    "stored_like",
    "train_discriminator",
    "train_wgan_gp",
    "upsampling_plan",
]
