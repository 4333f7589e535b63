"""The losses of data-free synthesis and distillation (Co-Boosting, DENSE, DeepInversion).

Synthesis minimises ``ce_weight * L_H + adv_weight * L_A (+ bn_weight * L_BN + priors)``
(:mod:`fedgo_flwr.datafree.synthesis`): the hardness-weighted cross-entropy of Co-Boosting's
eqs. 5-6 (:func:`hard_cross_entropy`), the adversarial term of eq. 7 (:func:`adversarial_kl`),
DeepInversion's batch-norm statistics (:class:`BNStatistics`) and image priors
(:func:`image_prior_losses`). The student distils with :func:`kd_loss` (eq. 4).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "BNStatistics",
    "adversarial_kl",
    "hard_cross_entropy",
    "image_prior_losses",
    "kd_loss",
]


def hard_cross_entropy(logits: Tensor, labels: Tensor, exponent: float = 1.0) -> Tensor:
    """``L_H`` of eq. 6: mean over the batch of ``d(x)^exponent * CE(A_w(x), y)`` with the
    difficulty ``d(x) = 1 - softmax(A_w(x))_y`` of eq. 5 (GHM, Li et al. 2019) detached, as in
    the authors' code (``exponent`` is their ``--hs``, 1 by default). ``exponent = 0`` is the
    plain cross-entropy of eq. 3."""
    ce = F.cross_entropy(logits, labels, reduction="none")
    if exponent == 0:
        return ce.mean()
    p_true = F.softmax(logits, dim=1).gather(1, labels.view(-1, 1)).squeeze(1)
    return ((1.0 - p_true).detach().pow(exponent) * ce).mean()


def adversarial_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float = 1.0,
    mask: bool = False,
) -> Tensor:
    """``L_A`` of eq. 7: minus the batch mean of ``T^2 KL(softmax(A_w/T) || softmax(f_S/T))``.

    Minimising it pushes the generator towards samples where student and ensemble disagree.
    Paper: ``T = 1``; the authors' code: ``T = 3``. ``mask``: DENSE's variant, counting only
    the samples whose arg-max differs between student and ensemble (the mean stays over the
    whole batch, as in the DENSE code).
    """
    t = float(temperature)
    log_q = F.log_softmax(student_logits / t, dim=1)
    p = F.softmax(teacher_logits / t, dim=1)
    per_sample = F.kl_div(log_q, p, reduction="none").sum(1) * (t * t)
    if mask:
        per_sample = per_sample * (student_logits.argmax(1) != teacher_logits.argmax(1)).float()
    return -per_sample.mean()


def kd_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 4.0) -> Tensor:
    """Eq. 4 as the authors' ``KLDiv(T)``: ``T^2 KL(softmax(t/T) || softmax(s/T))``, batch mean."""
    t = float(temperature)
    log_q = F.log_softmax(student_logits / t, dim=1)
    p = F.softmax(teacher_logits.detach() / t, dim=1)
    return F.kl_div(log_q, p, reduction="batchmean") * (t * t)


class BNStatistics:
    """DeepInversion's batch-norm statistics loss (Yin et al., CVPR 2020, eq. 4) over models.

    Forward hooks on every ``BatchNorm2d`` of ``models`` record, for the current forward pass,
    ``||mean(x) - running_mean||_2 + ||var(x) - running_var||_2`` of the layer's input;
    :meth:`loss` is their sum over the layers of a model, averaged over the models (the authors'
    ``sum(h.r_feature) / len(models)``). :attr:`layers` is 0 for models without batch norm
    (e.g. ``cnn5``), and the loss is then 0. Call :meth:`remove` when done.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        self.models = len(models)
        self._values: list[Tensor] = []
        self._handles = [
            m.register_forward_hook(self._hook)
            for model in models
            for m in model.modules()
            if isinstance(m, nn.BatchNorm2d)
        ]

    @property
    def layers(self) -> int:
        return len(self._handles)

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...], _out: Tensor) -> None:
        x = inputs[0]
        mean = x.mean(dim=(0, 2, 3))
        var = x.permute(1, 0, 2, 3).reshape(x.shape[1], -1).var(dim=1, unbiased=False)
        assert isinstance(module, nn.BatchNorm2d)
        self._values.append(
            torch.norm(module.running_var - var, 2) + torch.norm(module.running_mean - mean, 2)
        )

    def reset(self) -> None:
        self._values = []

    def loss(self) -> Tensor:
        """The loss of the forward passes since the last :meth:`reset`."""
        if not self._values:
            return torch.zeros(())
        return torch.stack(self._values).sum() / max(self.models, 1)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def image_prior_losses(x: Tensor) -> tuple[Tensor, Tensor]:
    """DeepInversion's image priors: total variation (mean squared neighbour differences,
    as ``get_image_prior_losses`` in the authors' code) and the L2 norm of the batch."""
    dh = x[:, :, 1:, :] - x[:, :, :-1, :]
    dw = x[:, :, :, 1:] - x[:, :, :, :-1]
    tv = dh.pow(2).mean() + dw.pow(2).mean() if x.shape[2] > 1 and x.shape[3] > 1 else x.sum() * 0
    return tv, x.pow(2).mean()
