"""FedGO's scenario G3: the generator trained federatedly with FedGAN before the FL rounds.

Rasouli, Sun, Rajagopal, "FedGAN: Federated Generative Adversarial Networks for Distributed
Data", 2020, Alg. 1: every client trains a local generator and discriminator on its own data,
starting from the server's current pair, and the server averages both, weighted by the
clients' data sizes. FedGO (Jang, Park, Lee, ICML 2025, Sec. 3.2 and App. E.2): "When training
a generator in a data-free setting, i.e., the case (G3), we utilized the FedGAN algorithm. The
generator was trained for only T' = 5 communication rounds, with each local generator and
discriminator trained for 3 epochs per round", with WGAN-GP's architecture and training
(Sec. 4), here the ``strategy.generator`` section's (``federated_rounds`` = T',
``local_epochs``). The generator then serves the discriminator round and the generated
distillation set (D2) as a G1 or G2 generator would; a client's FedGAN critic is not its FedGO
discriminator.

Where the papers are silent: an "epoch" is one pass of the critic over the client's data, the
pair is averaged after every round, every client takes part in every round with fresh Adam
states. A client whose reply the intake refuses is left out of that round's average with a
warning naming it (a round without any usable reply keeps the previous pair); the average is
weighted by the server's own count of each client's data and follows ``strategy.aggregation``
(:class:`fedgo_flwr.learning.aggregation.BoundedAverage`). ``docs/architecture.md`` ("FedGAN")
lists each choice.

Each round's pair is saved (``fedgan.pt`` in the run folder), so a resumed run goes on from the
last finished round; the messages are ``train.fedgan``, answered by ``clients/fedgo.py``. A saved
pair is checked before it is used (:func:`read_fedgan_checkpoint`); a bad one stops the run with
one :class:`~fedgo_flwr.records.checkpoint.CheckpointError` naming the file, and a file of another
configuration is started over, with a WARNING.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.learning.aggregation import BoundedAverage
from fedgo_flwr.protocol.fedgo import CRITIC_KEY, FEDGAN_MESSAGE, GENERATOR_KEY
from fedgo_flwr.protocol.fedgo import PROTOCOL as FEDGO
from fedgo_flwr.records.checkpoint import (
    CheckpointError,
    arrays_problem,
    config_differences,
)
from fedgo_flwr.runtime import messages as msgs
from fedgo_flwr.runtime.fileio import atomic_torch_save, safe_torch_load
from fedgo_flwr.runtime.messages import CONFIG, stream_replies
from fedgo_flwr.runtime.rng import derive_seed
from fedgo_flwr.runtime.shutdown import raise_if_stopping

CHECKPOINT = "fedgan.pt"


class FedGANStage:
    """The FedGAN rounds of scenario G3, the base of :class:`strategies._prefl.
    DiscriminatorStage` (which gives it ``params``, ``cfg``, ``resources``, ``outbox``,
    ``aggregation``, ``prefl_intake`` and ``discriminator_message_config``)."""

    def train_federated_generator(
        self, grid: Grid, generator: torch.nn.Module
    ) -> dict[str, object]:
        """Train ``generator`` (in place) with ``strategy.generator.federated_rounds`` FedGAN
        rounds; returns the report for ``prefl.json``."""
        res = self.resources
        gp = self.params.generator
        shape = res.bundle.train.input_shape
        critic = gp.build_critic(shape, seed=derive_seed(self.cfg.seed, "critic-init"))
        templates = {
            GENERATOR_KEY: {k: v.numpy() for k, v in generator.state_dict().items()},
            CRITIC_KEY: {k: v.numpy() for k, v in critic.state_dict().items()},
        }
        checkpoint = res.out_dir / CHECKPOINT
        rounds: list[dict[str, object]] = []
        first = 1
        if self.cfg.resume and checkpoint.is_file():
            # The run may have stopped inside the pre-FL stage, before any round checkpoint
            # of the ServerApp: the FedGAN checkpoint carries its own config to compare.
            saved = read_fedgan_checkpoint(checkpoint, templates, gp.federated_rounds)
            changed = config_differences(saved["config"], self.cfg)
            if changed:
                log(
                    WARNING,
                    "FedGAN: %s is another config's (%s); starting over",
                    checkpoint,
                    changed,
                )
            else:
                generator.load_state_dict(_as_state(saved[GENERATOR_KEY]))
                critic.load_state_dict(_as_state(saved[CRITIC_KEY]))
                rounds, first = list(saved["rounds"]), saved["round"] + 1
                log(INFO, "FedGAN: resuming after round %d", first - 1)
        bytes_pair = sum(a.nbytes for t in templates.values() for a in t.values())
        spec = FEDGO.reply(FEDGAN_MESSAGE)
        for rnd in range(first, gp.federated_rounds + 1):
            t0 = time.perf_counter()
            config = self.discriminator_message_config()
            config[msgs.SERVER_ROUND] = rnd  # the clients' rng depends on the round
            content = RecordDict(
                {
                    GENERATOR_KEY: ArrayRecord(generator.state_dict()),
                    CRITIC_KEY: ArrayRecord(critic.state_dict()),
                    CONFIG: config,
                }
            )
            messages = self.outbox.to(content, self.outbox.node_ids, FEDGAN_MESSAGE)
            sent = {
                GENERATOR_KEY: _arrays_of(generator),
                CRITIC_KEY: _arrays_of(critic),
            }
            averages = {
                key: BoundedAverage(self.aggregation, f"FedGAN round {rnd}: the {key}", sent[key])
                for key in templates
            }
            intake = self.prefl_intake(f"FedGAN round {rnd} reply")
            used, losses = [], []
            for reply in stream_replies(grid, messages, self.cfg.round_timeout):
                checked = intake.take(reply, spec, templates)
                if checked is None:
                    continue
                pid = checked.partition_id
                for key in templates:  # weighted by the server's n_k, never the claim
                    averages[key].add(checked.arrays[key], float(checked.num_examples), pid)
                used.append(pid)
                losses.append(checked.metrics.get("gan_wasserstein", float("nan")))
            raise_if_stopping("the FedGAN round")
            if used:
                generator.load_state_dict(_as_state(averages[GENERATOR_KEY].result()))
                critic.load_state_dict(_as_state(averages[CRITIC_KEY].result()))
            else:
                log(WARNING, "FedGAN round %d: no usable reply; the pair is unchanged", rnd)
            missing = sorted(set(range(self.cfg.data.num_clients)) - set(used))
            rounds.append(
                {
                    "round": rnd,
                    "clients": sorted(used),
                    "left_out": missing,
                    "mean_wasserstein": float(np.nanmean(losses)) if losses else float("nan"),
                    "seconds": time.perf_counter() - t0,
                }
            )
            log(INFO, "FedGAN round %d/%d: %d clients", rnd, gp.federated_rounds, len(used))
            atomic_torch_save(
                checkpoint,
                {
                    "round": rnd,
                    "config": self.cfg.to_dict(),
                    GENERATOR_KEY: generator.state_dict(),
                    CRITIC_KEY: critic.state_dict(),
                    "rounds": rounds,
                },
            )
        return {
            "source": "trained federatedly (G3, FedGAN)",
            "federated_rounds": gp.federated_rounds,
            "local_epochs": gp.local_epochs,
            "rounds": rounds,
            # Both ways, every round, every client: the generator and the critic.
            "bytes_per_client_per_round": 2 * bytes_pair,
        }


def read_fedgan_checkpoint(
    path, templates: dict[str, dict[str, np.ndarray]], federated_rounds: int
) -> dict:
    """``fedgan.pt`` loaded safely and checked: a dict whose ``config`` is a dict, whose
    generator and critic are arrays like ``templates``' (keys, shapes, dtypes, finite values:
    a run's own averages of accepted replies, which are finite and shaped so), whose ``round``
    is an int in 1..``federated_rounds`` and ``rounds`` a list; the pair comes back as numpy
    arrays. Anything else is one :class:`CheckpointError` naming ``path``."""
    try:
        saved = safe_torch_load(str(path), "FedGAN checkpoint")
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc

    def fail(problem: str) -> CheckpointError:
        return CheckpointError(f"FedGAN checkpoint {path}: {problem}")

    names = {"round", "config", GENERATOR_KEY, CRITIC_KEY, "rounds"}
    if not isinstance(saved, dict) or set(saved) != names:
        found = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
        raise fail(f"holds {found}, expected the fields {sorted(names)}")
    if not isinstance(saved["config"], dict) or not isinstance(saved["rounds"], list):
        raise fail("'config' must be a dict and 'rounds' a list")
    rnd = saved["round"]
    if type(rnd) is not int or not 1 <= rnd <= federated_rounds:
        raise fail(
            f"'round' is {rnd!r}, not one of the {federated_rounds} rounds "
            "(strategy.generator.federated_rounds)"
        )
    out = dict(saved)
    for key, template in templates.items():
        state = saved[key]
        if not isinstance(state, dict) or not all(
            isinstance(v, torch.Tensor) for v in state.values()
        ):
            raise fail(f"'{key}' is not a dict of tensors")
        arrays = {k: v.detach().cpu().numpy() for k, v in state.items()}
        problem = arrays_problem(arrays, template, f"'{key}'", f"the configured {key}", None)
        if problem:
            raise fail(problem)
        out[key] = arrays
    return out


def _arrays_of(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A copy of ``module``'s state as arrays (what the server sends this round)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def _as_state(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in arrays.items()}
