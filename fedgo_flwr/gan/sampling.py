"""Samples of FedGO's server generator, and the client discriminators' logits on a data set.

After FedGO's pre-FL stage (Jang, Park & Lee, ICML 2025, Sec. 3.2, App. D) the server evaluates
every client discriminator on the distillation set once per run (:func:`discriminator_logits`);
that set is either the server data (D1) or ``G``'s samples (D2, :func:`sample`,
:func:`generated_set`). Also here: the latent codes, the freezing of a network while it is only
evaluated, and the integer checks that the training loops of :mod:`fedgo_flwr.gan.wgan_gp` and
:mod:`fedgo_flwr.gan.discriminator_training` share. Latent codes come from an explicit
``torch.Generator`` (``rng=``), so samples repeat exactly on CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.aggregation import lower_median
from fedgo_flwr.learning.distill import view_batches
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.kernels import inference_batch, place
from fedgo_flwr.runtime.progress import Progress

__all__ = [
    "DiscriminatorScreen",
    "discriminator_logits",
    "neutralise_nonfinite",
    "neutral_logits",
    "discriminator_scale_outliers",
    "screen_discriminators",
    "generated_set",
    "sample",
    "stored_like",
]

run_log = logging.getLogger("flwr")


def _latent(n: int, latent_dim: int, rng: torch.Generator, device: torch.device) -> Tensor:
    """``n`` standard-normal latent codes drawn on the CPU from ``rng``, then moved."""
    return torch.randn(n, latent_dim, generator=rng).to(device)


def _latent_dim(generator: nn.Module, latent_dim: int | None) -> int:
    value = latent_dim if latent_dim is not None else getattr(generator, "latent_dim", None)
    if value is None or int(value) != value or int(value) < 1:
        raise ValueError(
            "latent_dim must be given (an int >= 1) when the generator has no 'latent_dim' "
            f"attribute, got {value!r}"
        )
    return int(value)


@contextlib.contextmanager
def _frozen(*modules: nn.Module) -> Iterator[None]:
    """Eval mode and no grad for ``modules``; restores each module's train/eval mode afterwards."""
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        with torch.no_grad():
            yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.train(mode)


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def sample(
    generator: nn.Module,
    n: int,
    latent_dim: int | None = None,
    *,
    rng: torch.Generator,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
) -> Tensor:
    """Draw ``n`` samples ``G(z)`` reproducibly, e.g. the distillation set of scenario D2 (Sec 3.2).

    All ``n`` latent codes are drawn up front on the CPU from ``rng`` and ``G`` runs in eval
    mode (BatchNorm running statistics) without gradients, so the result depends only on the
    generator's weights and the seed -- not on ``batch_size`` or ``device``. ``G``'s train/eval mode
    is restored afterwards.

    Returns:
        ``(n, *output_shape)`` float32 CPU tensor (images in ``[-1, 1]``).
    """
    n = _check_positive_int("n", n, minimum=0)
    batch_size = _check_positive_int("batch_size", batch_size)
    zdim = _latent_dim(generator, latent_dim)
    dev = torch.device(device)
    place(generator, dev)
    z_all = torch.randn(n, zdim, generator=rng)
    outs: list[Tensor] = []
    with _frozen(generator):
        for i in range(0, n, batch_size):
            outs.append(generator(z_all[i : i + batch_size].to(dev)).float().cpu())
    if outs:
        return torch.cat(outs)
    shape = getattr(generator, "output_shape", None)
    return torch.empty(0, *shape) if shape is not None else torch.empty(0)


def generated_set(
    generator: nn.Module,
    n: int,
    latent_dim: int | None,
    rng: torch.Generator,
    *,
    like: ArrayDataset,
    device: torch.device | str = "cpu",
) -> ArrayDataset:
    """``n`` samples of ``generator`` (:func:`sample`) as an unlabeled data set stored like
    ``like`` (``uint8`` images when it holds ``uint8``, else ``float32``), with its number of
    classes and flip setting: a distillation set of generated data (FedGO D2, DaFKD)."""
    return stored_like(sample(generator, n, latent_dim, rng=rng, device=device), like)


def stored_like(x: Tensor, like: ArrayDataset) -> ArrayDataset:
    """Generated images ``x`` (in ``[-1, 1]``, CPU) as an unlabeled data set stored like
    ``like``: ``uint8`` when it holds ``uint8`` (rounded to the nearest level), else
    ``float32``; its number of classes and flip setting."""
    if like.x.dtype == np.uint8:
        x_np = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    else:
        x_np = x.numpy().astype(np.float32)
    return ArrayDataset(
        x=x_np, y=np.zeros(len(x_np), dtype=np.int64), num_classes=like.num_classes, flip=like.flip
    )


def discriminator_logits(
    discs: Mapping[int, nn.Module],
    data: ArrayDataset,
    *,
    views: int = 1,
    num_clients: int | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
    progress: str | None = None,
) -> Tensor:
    """Raw logits ``z_k(x)`` of every client's discriminator on every view of every sample.

    The server computes this once per run for the distillation set and the test split (the
    discriminators are fixed after pre-FL, Alg. 2) and feeds it to
    :class:`fedgo_flwr.weighting.WeightingInputs` (``disc_logits``). The samples are taken from
    ``data`` in order by :func:`fedgo_flwr.learning.distill.view_batches` (normalised as by
    :func:`fedgo_flwr.data.batches`; view 1 is the horizontal flip), so the views line up with the
    teachers' logits on the same set. Each discriminator runs in eval mode without gradients, one
    at a time on ``device``; afterwards it is back on the CPU in its previous train/eval mode.

    Args:
        discs: Discriminators (raw-logit output) by client id (the row they fill).
        data: The samples.
        views: Number of views ``V`` (1: the samples as they are; 2: also their flips).
        num_clients: Number of rows ``K``; defaults to the largest client id plus one. Rows of
            clients without a discriminator are 0 (:func:`screen_discriminators` then gives
            them the neutral logits).
        device: Where to evaluate.
        batch_size: Samples per forward pass.
        progress: The stage's name in progress lines (discriminators done;
            :class:`fedgo_flwr.runtime.progress.Progress`); ``None``: none.

    Returns:
        ``(K, V, N)`` float32 CPU tensor.

    Raises:
        ValueError: A client id outside ``0 .. K-1``, or a bad ``views`` / ``batch_size``.
    """
    views = _check_positive_int("views", views)
    batch_size = _check_positive_int("batch_size", batch_size)
    if num_clients is None:
        num_clients = max(discs, default=-1) + 1
    num_clients = _check_positive_int("num_clients", num_clients, minimum=0)
    bad = sorted(k for k in discs if not 0 <= k < num_clients)
    if bad:
        raise ValueError(f"client ids {bad} outside 0..{num_clients - 1} (num_clients)")
    out = torch.zeros(num_clients, views, len(data))
    if not discs or len(data) == 0:
        return out
    dev = torch.device(device)
    batch_size = inference_batch(batch_size, dev)
    images = len(discs) * views * len(data)
    said = Progress(progress, len(discs), "discriminators")
    with profiling.phase("discriminator_logits", images, batch_size), said:
        batched = view_batches(data, views, batch_size, dev)
        _fill_discriminator_logits(out, discs, batched, dev, said)
    return out


def neutralise_nonfinite(*logits: Tensor) -> list[int]:
    """Set to 0 every client row ``k`` of the ``(K, ...)`` tensors
    ``logits`` (in place) that holds a non-finite value in any of them; return those ``k``.

    A discriminator whose weights are finite can still give infinite or NaN logits (a scaled
    upload); FedGO's odds ``D_k / (1 - D_k)`` of such a row are undefined, and one such row
    would make every weight on the sample undefined. Its client is then treated as one
    without a discriminator (:func:`screen_discriminators` gives it the neutral logits), in
    every tensor, so that the weights on the distillation set and on the test split agree.
    """
    rows = sorted(
        {int(k) for z in logits for k in torch.nonzero(~torch.isfinite(z.flatten(1)).all(1))}
    )
    for z in logits:
        z[rows] = 0.0
    return rows


def discriminator_scale_outliers(
    logits: Tensor, clients: Sequence[int], factor: float | None
) -> list[tuple[int, float, float]]:
    """``(k, scale, median)`` of every client ``k`` of ``clients`` whose discriminator's logit
    scale in ``logits`` ``(K, ...)`` (the root mean square of its raw logits over every sample
    and view) exceeds ``factor`` times the lower median scale of ``clients``' discriminators;
    ``factor`` ``None``: none.

    The discriminators' counterpart of the teachers' relative check
    (:func:`fedgo_flwr.learning.distill.teacher_scale_outliers`): a client that scales its
    discriminator's last layer by ``c`` scales its logits by ``c``, which pushes its odds
    ``D_k / (1 - D_k)`` to 0 or infinity and so takes or gives away every sample's weight,
    while the logits stay finite. ``factor`` is ``strategy.aggregation.discriminator_bound``.
    """
    if factor is None or not clients:
        return []
    scales = {k: float(logits[k].double().pow(2).mean().sqrt()) for k in clients}
    median = lower_median(list(scales.values()))
    return [(k, s, median) for k, s in scales.items() if s > factor * median]


@dataclass
class DiscriminatorScreen:
    """What :func:`screen_discriminators` neutralised: the clients (as given) whose logits
    were not finite, and ``(client, scale, median)`` of those whose logit scale was too large."""

    nonfinite: list[int] = field(default_factory=list)
    scaled: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def clients(self) -> list[int]:
        """Every neutralised client, sorted."""
        return sorted({*self.nonfinite, *(k for k, _, _ in self.scaled)})


def screen_discriminators(
    logits: Tensor | Sequence[Tensor],
    clients: Sequence[int],
    present: Sequence[int],
    factor: float | None,
    who: str,
    where: str,
) -> DiscriminatorScreen:
    """Give every discriminator that cannot weigh anything the neutral logits, in place, with
    one WARNING naming its client; the one screen of every ensemble weighted by discriminators
    (FedGO, CPFL's odds, Co-Boosting + FedGO, DaFKD's heads).

    ``logits``: one ``(K, ...)`` tensor or several (row ``i`` of each is the discriminator of
    client ``clients[i]``, e.g. its logits on the distillation set and on the test split);
    ``present``: the rows that hold a discriminator. First every row with a non-finite value in
    any tensor (:func:`neutralise_nonfinite`); then every present row whose logit scale in the
    first tensor exceeds ``factor`` (``strategy.aggregation.discriminator_bound``; ``None``: no
    scale check) times the lower median of the present finite rows
    (:func:`discriminator_scale_outliers`). The rows that passed are kept; every other row
    (screened, or not ``present``: a client without a discriminator) gets, on every sample of
    every tensor, the lower median of the rows that passed (:func:`neutral_logits`; 0 where
    none did): the say of the round's typical client. Not the logit 0 (odds 1): on samples that
    every honest discriminator calls fake (generated samples, logits far below 0) it would
    claim them all, so a client could take a large share by sending a discriminator that the
    screen refuses.

    Call it once every discriminator of the weighing has arrived and before any weight is
    computed: the scale check compares each with the others, so a discriminator that came
    first cannot set the median the later ones are judged by. ``who`` (the strategy) and
    ``where`` (the data of the first tensor, which the scale is measured on) go into the
    WARNINGs. Returns the clients (from ``clients``) it screened.
    """
    tensors = [logits] if isinstance(logits, Tensor) else list(logits)
    out = DiscriminatorScreen()
    bad = neutralise_nonfinite(*tensors)
    for i in bad:
        run_log.warning(
            "%s: the discriminator of client %d gives non-finite logits; neutral weight",
            who,
            clients[i],
        )
        out.nonfinite.append(clients[i])
    rows = [i for i in present if i not in bad]
    for i, scale, median in discriminator_scale_outliers(tensors[0], rows, factor):
        run_log.warning(
            "%s: the discriminator of client %d: its logit scale %.3g on %s is %.3g x the "
            "median %.3g, above strategy.aggregation.discriminator_bound = %g; neutral weight",
            who,
            clients[i],
            scale,
            where,
            scale / median if median > 0 else float("inf"),
            median,
            factor,
        )
        out.scaled.append((clients[i], scale, median))
    screened = set(out.clients)
    passed = [i for i in present if clients[i] not in screened]
    for z in tensors:
        neutral_logits(z, passed)
    return out


def neutral_logits(z: Tensor, passed: Sequence[int]) -> Tensor:
    """``z`` ``(K, ...)`` with every row not in ``passed`` set, in place, to the lower median
    over the ``passed`` rows on each entry (0 where ``passed`` is empty): the neutral say of a
    client whose discriminator is missing or screened (:func:`screen_discriminators`)."""
    keep = sorted(set(passed))
    others = [i for i in range(z.shape[0]) if i not in set(keep)]
    if not others:
        return z
    if keep:
        z[others] = z[keep].median(dim=0).values.to(z.dtype)
    else:
        z[others] = 0.0
    return z


def _fill_discriminator_logits(
    out: Tensor,
    discs: Mapping[int, nn.Module],
    batched: list[tuple[int, Tensor]],
    dev,
    said: Progress,
) -> None:
    views = out.shape[1]
    for k, disc in discs.items():
        place(disc, dev)
        parts: list[list[Tensor]] = [[] for _ in range(views)]
        with _frozen(disc):
            for v, x in batched:
                parts[v].append(disc(x).float().cpu().reshape(-1))
        out[k] = torch.stack([torch.cat(p) for p in parts])
        disc.cpu()
        said.advance()
