"""The DENSE / Co-Boosting generator of synthetic images, its re-initialisation, its images' scale.

Data-free distillation (:mod:`fedgo_flwr.datafree`) synthesises its images with this network
(``source: generator``): DENSE (Zhang et al., NeurIPS 2022) and Co-Boosting (Dai et al., ICLR
2024) use the same one, re-initialised every epoch by the authors' code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "Generator",
    "reset_generator",
    "to_model_input",
]


class Generator(nn.Module):
    """The DENSE / Co-Boosting generator (the authors' ``datafree.models.generator.Generator``).

    ``Linear(nz -> 2 ngf (H/4) (W/4))``, BN, upsample x2, ``Conv3x3(2 ngf -> 2 ngf)`` (no bias),
    BN, LeakyReLU(0.2), upsample x2, ``Conv3x3(2 ngf -> ngf)`` (no bias), BN, LeakyReLU(0.2),
    ``Conv3x3(ngf -> C)``, sigmoid: images in ``[0, 1]`` (:func:`to_model_input` maps them to the
    models' ``[-1, 1]``). Paper defaults ``nz = 256``, ``ngf = 64`` (App. B.1: "the same as
    DENSE"). ``H`` and ``W`` must be multiples of 4 (32x32 CIFAR, 8x8 digits).
    """

    def __init__(self, image_shape: Sequence[int], nz: int = 256, ngf: int = 64) -> None:
        super().__init__()
        if len(image_shape) != 3:
            raise ValueError(
                f"the generator makes images (C, H, W), got shape {tuple(image_shape)}"
            )
        c, h, w = (int(s) for s in image_shape)
        if h % 4 or w % 4 or h < 4 or w < 4:
            raise ValueError(f"the generator needs H and W multiples of 4, got {h}x{w}")
        self.image_shape = (c, h, w)
        self.nz = int(nz)
        self.grid = (h // 4, w // 4)
        self.project = nn.Linear(self.nz, 2 * ngf * self.grid[0] * self.grid[1])
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * ngf),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * ngf),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, c, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: Tensor) -> Tensor:
        out = self.project(z).view(z.shape[0], -1, *self.grid)
        return self.body(out)


def reset_generator(model: nn.Module, rng: torch.Generator) -> None:
    """Re-initialise ``model`` as the authors do every epoch (``reset_model``).

    Convolution and linear weights ~ N(0, 0.02), their biases 0; BatchNorm weights ~ N(1, 0.02),
    biases 0; running statistics reset. Drawn from ``rng`` (CPU), so the reset is seeded.
    """
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                m.weight.copy_(_normal(m.weight.shape, 0.0, 0.02, rng))
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(_normal(m.weight.shape, 1.0, 0.02, rng))
                m.bias.zero_()
                m.reset_running_stats()


def _normal(shape: torch.Size, mean: float, std: float, rng: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=rng) * std + mean


def to_model_input(images: Tensor) -> Tensor:
    """Images in ``[0, 1]`` to the models' inputs in ``[-1, 1]`` (this project's normalisation,
    mean = std = 0.5 as the authors' normaliser)."""
    return images * 2.0 - 1.0
