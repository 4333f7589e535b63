"""Diagnostic: how good would FedGO's weights be with an ideal generator?

FedGO's optimal discriminator is D_k = p_k / (p_k + p_g) (Thm 3.6). With a poor generator p_g is
far from every client's data, D_k is close to 1 on all real images and the odds carry little
information about which client an image resembles. This script replays round 1 of a finished
FedGO run through the library (:func:`replay.replay`: the same seed and config, so the same
sampled clients and the same client models; FedGO's clients train as FedAvg's) and compares the
server set's pseudo-label accuracy, with the teachers' logits from
:class:`fedgo_flwr.learning.distill.TeacherBank` and the weights from the weighting registry
(:func:`fedgo_flwr.weighting.compute_weights`), under:

- the run's own discriminators (trained against its generator, from ``discriminators.pt``);
- "ideal" discriminators trained against samples of the server's unlabeled pool instead of a
  generator, i.e. p_g = the data mixture. Diagnostic only: a deployment would never send server
  data to clients;
- uniform weights and the label oracle (as the run's round-1 ``pl_acc_uniform`` and
  ``pl_acc_oracle``).

    .venv/bin/python -m benchmarks.ideal_generator outputs/bench/cifar10-cpu/fedgo-seed0 [k=v ...]

``k=v`` overrides the run's ``config.yaml`` (e.g. ``data.path=DIR`` where the data lives here).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from flwr.app import Message
from torch import nn

from benchmarks.replay import client_model, replay
from fedgo_flwr.gan import discriminator_logits, train_discriminator
from fedgo_flwr.learning.distill import TeacherBank
from fedgo_flwr.learning.task import client_dataset, load_bundle, make_partition, new_model
from fedgo_flwr.learning.training import get_device
from fedgo_flwr.runtime.rng import derive_seed, make_rng
from fedgo_flwr.weighting import WeightingInputs, compute_weights
from strategies import load_experiment


class PoolSampler(nn.Module):
    """A stand-in generator that maps a latent code to a row of a fixed pool of images."""

    def __init__(self, pool: torch.Tensor, latent_dim: int) -> None:
        super().__init__()
        self.register_buffer("pool", pool)
        self.latent_dim = latent_dim

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        u = torch.special.ndtr(z[:, 0])  # uniform in (0, 1) for a standard normal z
        idx = (u * len(self.pool)).long().clamp_(0, len(self.pool) - 1)
        return self.pool[idx]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="output folder of a finished FedGO run")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value for its config.yaml")
    args = parser.parse_args()
    run = Path(args.run_dir)
    cfg = load_experiment(run / "config.yaml", args.overrides)
    params = cfg.strategy.params
    device = get_device(cfg.device)
    bundle = load_bundle(cfg.data)
    partition = make_partition(cfg)
    server = bundle.train.subset(partition.server)
    x_server, y_server = server.to_tensors()

    # Round 1 exactly as in the run: same init, clients, data and seeds.
    bank = TeacherBank(server, augment=False)
    model = new_model(cfg, bundle)
    sizes: dict[int, int] = {}

    def teacher(reply: Message) -> None:
        pid, size = client_model(reply, model)
        sizes[pid] = size
        bank.add(model, device, key=pid)

    replay(run / "config.yaml", [*args.overrides, "rounds=1"], teacher)
    pids = sorted(sizes)  # the bank stacks its teachers in key order
    logits = bank.logits[:, 0]
    n = torch.tensor([sizes[pid] for pid in pids], dtype=torch.float64)
    counts = torch.as_tensor(partition.histogram(bundle.train.y, bundle.train.num_classes))[pids]

    shape = bundle.train.input_shape
    saved = torch.load(run / "discriminators.pt", map_location="cpu")
    own = []
    for pid in pids:
        disc = params.discriminator.build(shape)
        disc.load_state_dict(saved[pid])
        own.append(disc)
    pool = PoolSampler(x_server, params.generator.latent_dim)
    ideal = []
    for pid in pids:
        disc = params.discriminator.build(shape, seed=derive_seed(cfg.seed, "disc-init", pid))
        train_discriminator(
            disc,
            pool,
            client_dataset(cfg, pid),
            epochs=params.discriminator.epochs,
            latent_dim=params.generator.latent_dim,
            rng=make_rng(cfg.seed, "ideal", pid),
            device=device,
        )
        ideal.append(disc)

    def accuracy(name: str, disc_logits=None, **kw) -> float:
        w = compute_weights(
            name,
            WeightingInputs(
                logits=logits,
                num_examples=n,
                disc_logits=disc_logits,
                labels=y_server,
                class_counts=counts,
            ),
            **kw,
        )
        pred = (w.unsqueeze(-1) * logits).sum(0).argmax(-1)
        return round(100 * (pred == y_server).double().mean().item(), 1)

    z_own = discriminator_logits(dict(enumerate(own)), server, device=device)[:, 0]  # (K, N)
    z_ideal = discriminator_logits(dict(enumerate(ideal)), server, device=device)[:, 0]
    report = {
        "clients": pids,
        "uniform": accuracy("uniform"),
        "oracle": accuracy("oracle"),
        "fedgo_run_discriminators_sigmoid": accuracy("fedgo", z_own, disc_mode="sigmoid"),
        "fedgo_run_discriminators_double": accuracy("fedgo", z_own),
        "fedgo_ideal_sigmoid": accuracy("fedgo", z_ideal, disc_mode="sigmoid"),
        "fedgo_ideal_double": accuracy("fedgo", z_ideal),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
