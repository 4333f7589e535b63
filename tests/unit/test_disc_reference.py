"""Informative discriminators: the reference a client's discriminator is trained against
(``strategy.discriminator.reference``), its regularisers, and FedGO's odds temperature."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan import DiscriminatorConfig, build_discriminator, train_discriminator
from fedgo_flwr.gan.discriminator_training import _Negatives
from fedgo_flwr.weighting import WeightingInputs, compute_weights


def points(center: float, n: int, seed: int, dim: int = 2) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = (center + rng.standard_normal((n, dim))).astype(np.float32)
    return ArrayDataset(x=x, y=np.zeros(n, dtype=np.int64), num_classes=1)


class Constant(nn.Module):
    """A 'generator' whose every sample is ``value`` (to see where negatives come from)."""

    latent_dim = 3

    def __init__(self, value: float, dim: int = 2) -> None:
        super().__init__()
        self.value, self.dim = value, dim
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.full((z.shape[0], self.dim), self.value)


def mlp(seed: int = 0) -> nn.Module:
    return build_discriminator("mlp", (2,), seed=seed, hidden=32)


def test_server_reference_alone_separates_the_data_from_the_reference():
    data, ref = points(2.0, 128, 0), points(-2.0, 128, 1)
    disc = mlp()
    stats = train_discriminator(
        disc, None, data, epochs=20, batch_size=32, lr=1e-2, rng=torch.Generator().manual_seed(0),
        reference=ref,
    )  # fmt: skip
    with torch.no_grad():
        z_data = disc(torch.from_numpy(points(2.0, 200, 5).x))
        z_ref = disc(torch.from_numpy(points(-2.0, 200, 6).x))
    assert stats["accuracy"] > 0.9
    assert (z_data > 0).float().mean() > 0.9 and (z_ref < 0).float().mean() > 0.9


def test_mixture_takes_its_share_of_every_negative_batch_from_each_source():
    ref = ArrayDataset(
        x=np.full((10, 2), -7.0, np.float32), y=np.zeros(10, np.int64), num_classes=1
    )
    neg = _Negatives(Constant(5.0), ref, 0.25, 3, False, torch.device("cpu"))
    x = neg.draw(8, torch.Generator().manual_seed(0))
    assert x.shape == (8, 2)
    assert (x[:, 0] == 5.0).sum() == 6 and (x[:, 0] == -7.0).sum() == 2
    # Share 0 is the paper's loop: generator samples only; share 1: reference only.
    assert (
        _Negatives(Constant(5.0), None, 0.0, 3, False, torch.device("cpu")).draw(
            4, torch.Generator()
        )
        == 5
    ).all()
    assert (
        _Negatives(None, ref, 1.0, 0, False, torch.device("cpu")).draw(4, torch.Generator()) == -7
    ).all()


def test_a_generator_reference_is_the_default_and_needs_no_reference_set():
    """``reference=None``: every negative is G's; the same seed gives the same discriminator."""
    data = points(2.0, 64, 0)
    discs = [mlp(), mlp()]
    for d in discs:
        train_discriminator(
            d, Constant(-2.0), data, epochs=2, batch_size=16, rng=torch.Generator().manual_seed(3)
        )
    a, b = (d.state_dict() for d in discs)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"generator": None}, "needs a non-empty reference"),
        ({"mixture": 0.5}, "needs a non-empty reference"),
        ({"mixture": 1.5, "reference": points(0.0, 4, 0)}, "mixture must lie in"),
        ({"generator": None, "mixture": 0.5, "reference": points(0.0, 4, 0)}, "needs a generator"),
        ({"label_smoothing": 0.5}, "label_smoothing"),
    ],
)
def test_bad_reference_arguments_are_refused(kwargs, message):
    args = {"generator": Constant(0.0), **kwargs}
    with pytest.raises(ValueError, match=message):
        train_discriminator(
            mlp(), args.pop("generator"), points(1.0, 8, 0), epochs=1, rng=torch.Generator(),
            **args,
        )  # fmt: skip


def test_label_smoothing_keeps_the_discriminator_below_saturation():
    data, ref = points(4.0, 128, 0), points(-4.0, 128, 1)  # perfectly separable

    def mean_real_sigmoid(smoothing: float) -> float:
        disc = mlp()
        train_discriminator(
            disc, None, data, epochs=60, batch_size=32, lr=1e-2, reference=ref,
            label_smoothing=smoothing, rng=torch.Generator().manual_seed(0),
        )  # fmt: skip
        with torch.no_grad():
            return torch.sigmoid(disc(torch.from_numpy(data.x))).mean().item()

    # Optimum of BCE with target 1 - s on separable data: D = 1 - s.
    assert mean_real_sigmoid(0.0) > 0.97
    assert mean_real_sigmoid(0.2) == pytest.approx(0.8, abs=0.05)


def test_early_stopping_keeps_the_best_held_out_epoch():
    """Data and reference from the same density: nothing generalises, the held-out loss stops
    improving early, and the run stops ``patience`` epochs after its best epoch."""
    data, ref = points(0.0, 60, 0), points(0.0, 60, 1)
    disc = build_discriminator("mlp", (2,), seed=0, hidden=256)
    stats = train_discriminator(
        disc, None, data, epochs=200, batch_size=8, lr=1e-2, reference=ref, patience=3,
        holdout=0.25, rng=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert stats["epochs"] < 200
    assert stats["epochs"] == stats["best_epoch"] + 3
    assert stats["num_examples"] == 45  # a quarter of the 60 held out
    assert np.isfinite(stats["holdout_loss"])


def test_spectral_norm_bounds_every_layer():
    cfg = DiscriminatorConfig(name="cnn4", spectral_norm=True)
    disc = cfg.build((3, 32, 32), seed=0)
    disc.train()
    with torch.no_grad():
        for _ in range(20):  # power iterations converge during training forward passes
            disc(torch.randn(4, 3, 32, 32))
    disc.eval()
    convs = [m for m in disc.modules() if isinstance(m, nn.Conv2d)]
    assert convs
    for conv in convs:
        w = conv.weight.reshape(conv.weight.shape[0], -1)
        assert torch.linalg.matrix_norm(w, ord=2).item() <= 1.05
    plain = DiscriminatorConfig(name="cnn4").build((3, 32, 32), seed=0)
    assert set(disc.state_dict()) != set(plain.state_dict())


def test_fedgo_temperature_divides_the_log_odds():
    z = torch.tensor([[0.5, -3.0, 2.0], [1.5, 1.0, -1.0], [0.0, 0.0, 4.0]])
    inputs = WeightingInputs(
        logits=torch.zeros(3, 3, 4), num_examples=torch.tensor([1.0, 2.0, 3.0]), disc_logits=z
    )
    halved = WeightingInputs(
        logits=torch.zeros(3, 3, 4), num_examples=torch.tensor([1.0, 2.0, 3.0]), disc_logits=z / 2
    )
    for mode in ("sigmoid", "double_sigmoid"):
        got = compute_weights("fedgo", inputs, disc_mode=mode, temperature=2.0)
        if mode == "sigmoid":
            want = compute_weights("fedgo", halved, disc_mode=mode)
        else:  # log-odds sigmoid(z), divided by 2
            want = compute_weights(
                "fedgo",
                WeightingInputs(
                    logits=torch.zeros(3, 3, 4),
                    num_examples=torch.tensor([1.0, 2.0, 3.0]),
                    disc_logits=torch.sigmoid(z) / 2,
                ),
                disc_mode="sigmoid",
            )
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got.sum(0), torch.ones(3))
    with pytest.raises(ValueError, match="temperature"):
        compute_weights("fedgo", inputs, temperature=0)


def test_fedgan_epochs_are_critic_passes_over_the_local_data():
    from fedgo_flwr.gan import fedgan_generator_steps

    # 250 images at batch 64: 4 critic steps an epoch, 3 epochs = 12 critic steps, n_critic 5.
    assert fedgan_generator_steps(250, 64, 3, 5) == 2
    assert fedgan_generator_steps(1250, 64, 3, 5) == 12  # the paper's CIFAR-10 client size
    assert fedgan_generator_steps(10, 64, 1, 5) == 1  # never fewer than one step
    with pytest.raises(ValueError, match="epochs"):
        fedgan_generator_steps(10, 64, 0, 5)
