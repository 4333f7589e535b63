"""FedGO: ensemble distillation weighted by client-discriminator odds.

Jang, Park, Lee, "Provably Near-Optimal Federated Ensemble Distillation with Negligible
Overhead", ICML 2025, Sec. 3.2, Alg. 1-3 (App. D) and App. E.2.

Pre-FL stage (:meth:`FedGO.setup`, before round 1, once per run):

1. the server obtains a generator G: trained with WGAN-GP on its unlabeled data (scenario G1,
   Alg. 2) or loaded from ``strategy.generator.path`` (G2: off-the-shelf, or an earlier run's);
2. G goes to every client in one Flower message round (``train.discriminator``); each client
   trains its discriminator D_k once against the frozen G (Alg. 3) and sends it back;
3. the server keeps the K discriminators and G on disk (``discriminators.pt``,
   ``generator.pt`` in the run folder, reusable with ``strategy.discriminator.path``) and
   computes every D_k's logits on the distillation set (each augmentation view) and on the test
   split once: the discriminators are fixed, so their outputs are too.

Each round is FedDF's (``strategies/feddf.py``) with the weighting
``w_k(x) = n_k Φ_k(x) / Σ_{i∈A^t} n_i Φ_i(x)``, Φ = D/(1-D), over the round's participating
clients (Thm 3.6, Eq. 9). The discriminator output is the paper's composition of two sigmoids
(``weighting_params: {disc_mode: double_sigmoid}``, odds in (1, e)) by default, a single sigmoid
as an option.
The same stage serves the DaFKD-style ``domain`` weighting (``strategy.weighting: domain``).

``distill_data``: ``server`` distils on the server's unlabeled data (D1); ``generated`` on
``generated_size`` samples of G drawn once (D2; no labels, so no pseudo-label diagnostics).

A client whose discriminator never arrives gets the neutral logit 0 everywhere (logged). So does
one whose reply is unusable: each discriminator reply is checked like a model reply (an error
reply, a missing record, unreadable arrays, keys, shapes or dtypes other than those of a freshly
built discriminator, non-finite values; :meth:`FedGO._discriminator_problem`), and a bad one is
dropped with a warning naming the client's partition and node id before anything is saved.
Discriminators loaded from ``strategy.discriminator.path`` (or from the run's own
``discriminators.pt`` on resume) get the same checks; a bad file is an error naming the file and
the client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from clients.fedgo import DISCRIMINATOR_MESSAGE, GENERATOR_KEY
from fedgo_flwr.aggregation import check_arrays
from fedgo_flwr.checkpoint import safe_torch_load
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.distill import num_views
from fedgo_flwr.fileio import atomic_torch_save
from fedgo_flwr.gan import (
    build_critic,
    build_discriminator,
    build_generator,
    count_bytes,
    discriminator_logits,
    sample,
    train_wgan_gp,
)
from fedgo_flwr.gan.settings import DiscriminatorConfig, GeneratorConfig
from fedgo_flwr.messages import ARRAYS, CONFIG, METRICS, stream_replies, to_numpy
from fedgo_flwr.rng import derive_seed, make_rng
from fedgo_flwr.schema import Checker
from fedgo_flwr.shutdown import raise_if_stopping
from fedgo_flwr.weighting import get_weighting
from strategies.feddf import FedDF, FedDFConfig

DISTILL_DATA = ("server", "generated")


@dataclass
class FedGOConfig(FedDFConfig):
    """FedDF's parameters plus the generator, the discriminators and the distillation data.

    ``generator`` and ``discriminator`` are also the clients' parameters (``clients/fedgo.py``).
    """

    weighting: str = "fedgo"
    distill_data: str = "server"
    generated_size: int = 10_000
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)

    def check(self, c: Checker) -> None:
        super().check(c)
        c.choice("distill_data", DISTILL_DATA)
        c.require("generated_size", self.generated_size >= 1, "must be >= 1")
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

    def disc_logits(self, pids: list[int], split: str) -> torch.Tensor | None:
        return self._disc[split][pids]

    # -- pre-FL stage ----------------------------------------------------------------------
    def setup(self, grid: Grid) -> None:
        res = self.resources
        assert res is not None
        report: dict[str, object] = {}
        shape = res.bundle.train.input_shape
        gp = self.params.generator
        gen_path, disc_path = gp.path, self.params.discriminator.path
        saved_gen, saved_discs = res.out_dir / "generator.pt", res.out_dir / "discriminators.pt"
        if self.resuming and saved_gen.is_file() and saved_discs.is_file():
            # A resumed run reuses its own pre-FL results instead of redoing them.
            gen_path, disc_path = str(saved_gen), str(saved_discs)
        generator = build_generator(
            gp.name,
            gp.latent_dim,
            shape,
            seed=derive_seed(self.cfg.seed, "gen-init"),
            **gp.model_kwargs(),
        )
        t0 = time.perf_counter()
        if gen_path:
            generator.load_state_dict(safe_torch_load(gen_path, "generator file"))
            report["generator"] = {"source": gen_path}
            log(INFO, "FedGO: generator loaded from %s", gen_path)
        else:
            critic = build_critic(
                gp.name, shape, seed=derive_seed(self.cfg.seed, "critic-init"), **gp.model_kwargs()
            )
            server_set = res.bundle.train.subset(res.partition.server)
            log(INFO, "FedGO: training the WGAN-GP generator, %d steps", gp.steps)
            stats = train_wgan_gp(
                generator,
                critic,
                server_set,
                steps=gp.steps,
                batch_size=gp.batch_size,
                lr=gp.lr,
                n_critic=gp.n_critic,
                gp_lambda=gp.gp_lambda,
                rng=make_rng(self.cfg.seed, "wgan"),
                device=res.device,
                augment=self.cfg.data.augment,
            )
            report["generator"] = {"source": "trained on server data (G1)", **stats}
        generator.cpu()
        report["generator_time"] = time.perf_counter() - t0
        if not saved_gen.is_file() or gen_path != str(saved_gen):
            atomic_torch_save(saved_gen, generator.state_dict())

        discs, disc_report = self._discriminators(grid, generator, disc_path)
        report.update(disc_report)
        if self.params.distill_data == "generated":
            self._use_generated_data(generator)
        t0 = time.perf_counter()
        self._disc = {
            "distill": self._logits_all(discs, self.distill_set, self.views),
            "test": self._logits_all(discs, res.bundle.test, 1),
        }
        report["disc_logits_time"] = time.perf_counter() - t0
        report["disc_stats"] = discriminator_stats(self._disc["distill"][sorted(discs), 0])
        report["bytes"] = {
            "model": count_bytes(self.model_factory()),
            "generator": count_bytes(generator),
            "discriminator": count_bytes(
                build_discriminator(self.params.discriminator.name, shape)
            ),
        }
        name = "prefl-resume.json" if self.resuming else "prefl.json"
        (res.out_dir / name).write_text(json.dumps(report, indent=2, default=float))
        log(INFO, "FedGO pre-FL stage done: %s", json.dumps(report["bytes"]))

    def _discriminators(
        self, grid: Grid, generator: torch.nn.Module, path: str | None
    ) -> tuple[dict[int, torch.nn.Module], dict[str, object]]:
        """Collect D_k from every client (or load them); save them with the run."""
        res = self.resources
        assert res is not None
        dp = self.params.discriminator
        shape = res.bundle.train.input_shape
        states: dict[int, dict[str, torch.Tensor]] = {}
        report: dict[str, object] = {}
        # What every discriminator must look like. Seeded, so the global RNG is left alone.
        template = build_discriminator(dp.name, shape, seed=0).state_dict()
        reference = {k: v.numpy() for k, v in template.items()}
        if path:
            states = self._load_discriminators(path, reference)
            report["discriminators"] = {"source": path}
        else:
            content = RecordDict(
                {
                    GENERATOR_KEY: ArrayRecord(generator.state_dict()),
                    CONFIG: self.message_config(server_round=0),
                }
            )
            messages = self.messages_to(content, self.node_ids.values(), DISCRIMINATOR_MESSAGE)
            t0 = time.perf_counter()
            per_client: dict[str, dict[str, float]] = {}
            # As the rounds do: a SuperLink's 'Node Unavailable' reply is credited to its node.
            replies = list(stream_replies(grid, messages, self.cfg.round_timeout))
            answered = {reply.metadata.src_node_id for reply in replies}
            for pid, node in sorted(self.node_ids.items()):
                if node not in answered:
                    log(WARNING, "FedGO: no discriminator from client %d (node %d)", pid, node)
            for reply in replies:
                accepted = self._accept_discriminator(reply, states, reference)
                if accepted is not None:
                    pid, states[pid], per_client[str(pid)] = accepted
            report["discriminator_round_time"] = time.perf_counter() - t0
            report["discriminators"] = per_client
            raise_if_stopping("the discriminators")  # some may have died with the stop
            atomic_torch_save(res.out_dir / "discriminators.pt", states)
        discs: dict[int, torch.nn.Module] = {}
        for pid, state in states.items():
            disc = build_discriminator(dp.name, shape)
            disc.load_state_dict(state)
            discs[pid] = disc
        missing = sorted(set(range(self.cfg.data.num_clients)) - set(discs))
        if missing:
            log(WARNING, "FedGO: clients %s have no discriminator; neutral weights", missing)
        report["missing_discriminators"] = missing
        return discs, report

    def _accept_discriminator(
        self,
        reply: Message,
        states: Mapping[int, object],
        reference: Mapping[str, np.ndarray],
    ) -> tuple[int, dict[str, torch.Tensor], dict[str, object]] | None:
        """``(partition id, state dict, metrics)`` of a usable discriminator reply; ``None``
        (logged) for an unusable one. Nothing in the reply can raise out of here."""
        node = reply.metadata.src_node_id
        pid = self.partition_of.get(node, -1)
        try:
            reason = self._discriminator_problem(reply, pid, states)
            if reason is None:
                arrays = to_numpy(reply.content[ARRAYS])  # read once, then checked
                reason = check_arrays(arrays, reference, "discriminator")
            if reason is None:
                state = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in arrays.items()}
                return pid, state, dict(reply.content[METRICS])
        except Exception as exc:  # noqa: BLE001 - no reply may end the run
            reason = f"unreadable reply ({type(exc).__name__}: {exc})"
        log(
            WARNING,
            "FedGO: dropping the discriminator of client %d (node %d): %s; neutral weight",
            pid,
            node,
            reason,
        )
        return None

    def _discriminator_problem(
        self,
        reply: Message,
        pid: int,
        states: Mapping[int, object],
    ) -> str | None:
        """Why a discriminator reply is unusable before its arrays are read (``None``: read
        them and check them against the reference)."""
        if reply.has_error():
            return f"client error: {reply.error.reason}"
        if pid < 0:
            return "not a node of this run"
        if pid in states:
            return "a second discriminator from this client"
        content = reply.content
        if ARRAYS not in content.array_records:
            return f"no ArrayRecord '{ARRAYS}'"
        if METRICS not in content.metric_records:
            return f"no MetricRecord '{METRICS}'"
        return None

    def _load_discriminators(
        self, path: str, reference: Mapping[str, np.ndarray]
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Discriminators saved by a run (``discriminators.pt``: partition id -> state dict),
        each checked against ``reference``; a bad file raises ``ValueError`` naming the file
        and the client."""
        where = f"discriminator file {path}"
        raw = safe_torch_load(path, "discriminator file")
        if not isinstance(raw, Mapping):
            raise ValueError(
                f"{where}: not a mapping of partition id -> discriminator state dict "
                f"(got {type(raw).__name__})"
            )
        num_clients = self.cfg.data.num_clients
        states: dict[int, dict[str, torch.Tensor]] = {}
        for key, state in raw.items():
            pid = _partition_id(key)
            if pid is None or not 0 <= pid < num_clients:
                raise ValueError(
                    f"{where}: client {key!r}: not a partition id (0..{num_clients - 1})"
                )
            if pid in states:
                raise ValueError(f"{where}: client {pid}: appears twice")
            if not isinstance(state, Mapping) or not all(
                isinstance(v, torch.Tensor) for v in state.values()
            ):
                raise ValueError(f"{where}: client {pid}: not a state dict of tensors")
            arrays = {str(k): v.detach().cpu().numpy() for k, v in state.items()}
            problem = check_arrays(arrays, reference, "discriminator")
            if problem is not None:
                raise ValueError(f"{where}: client {pid}: {problem}")
            states[pid] = dict(state)
        return states

    def _use_generated_data(self, generator: torch.nn.Module) -> None:
        """Scenario D2: G's samples, drawn once, replace the server data for distillation."""
        rng = make_rng(self.cfg.seed, "d2-samples")
        x = sample(
            generator,
            self.params.generated_size,
            self.params.generator.latent_dim,
            rng=rng,
        )
        template = self.distill_set
        if template.x.dtype == np.uint8:
            x_np = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
        else:
            x_np = x.numpy().astype(np.float32)
        self.distill_set = ArrayDataset(
            x=x_np,
            y=np.zeros(len(x_np), dtype=np.int64),
            num_classes=template.num_classes,
            flip=template.flip,
        )
        self.distill_labels = None
        self.views = num_views(self.distill_set, self.params.distill.augment)

    def _logits_all(
        self, discs: dict[int, torch.nn.Module], data: ArrayDataset, views: int
    ) -> torch.Tensor:
        """``(K, V, N)`` raw logits of every client's discriminator (0 where it is missing)."""
        assert self.resources is not None
        return discriminator_logits(
            discs,
            data,
            views=views,
            num_clients=self.cfg.data.num_clients,
            device=self.resources.device,
        )


def _partition_id(key: object) -> int | None:
    """A ``discriminators.pt`` key as a partition id: an int, or a string of digits."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.isdigit():
        return int(key)
    return None


def discriminator_stats(z: torch.Tensor) -> dict[str, float]:
    """How informative the discriminators are on the distillation set (``z``: ``(K, N)``).

    Saturated discriminators (sigmoid(z) near 1 for every client on real data) make the double
    sigmoid's odds all equal to e, and FedGO's weights collapse to data-size weighting.
    """
    if z.numel() == 0:
        return {}
    d = torch.sigmoid(z.double())
    return {
        "mean_sigmoid": d.mean().item(),
        "share_sigmoid_above_0.99": (d > 0.99).double().mean().item(),
        "mean_odds_double_sigmoid": torch.exp(d).mean().item(),
        "mean_spread_of_logits_across_clients": z.double().std(0).mean().item()
        if z.shape[0] > 1
        else 0.0,
    }
