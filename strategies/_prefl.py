"""FedGO's pre-FL stage, for every strategy that weights by client-discriminator odds.

Jang, Park, Lee, ICML 2025, Alg. 2-3 (App. D): the server obtains a generator G (trained with
WGAN-GP on its unlabeled data, scenario G1, or loaded from ``strategy.generator.path``, G2),
sends it to every client in one message round (``train.discriminator``, answered by the
``fedgo`` client algorithm, ``clients/fedgo.py``), and keeps the returned discriminators; a
resumed run reuses the run's own ``generator.pt`` and ``discriminators.pt``.

:class:`DiscriminatorStage` is a part that a strategy whose ``Config`` has ``generator`` and
``discriminator`` sections (:mod:`fedgo_flwr.gan.settings`) builds in its ``setup`` (as
``self.prefl``), from what it needs: FedGO (``strategies/fedgo.py``) and CPFL with FedGO-weighted
distillation (``strategies/cpfl.py``). Their pre-flight check calls :func:`check_generator`. A
private module (``_``): not a strategy of its own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.names import dataset_entry
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan import cache as generator_cache
from fedgo_flwr.gan import train_wgan_gp
from fedgo_flwr.gan.external import generator_output_problem
from fedgo_flwr.gan.settings import GeneratorConfig
from fedgo_flwr.learning.aggregation import AggregationConfig, check_arrays
from fedgo_flwr.learning.task import load_bundle
from fedgo_flwr.protocol import RoundIntake
from fedgo_flwr.protocol.fedgo import DISCRIMINATOR_MESSAGE, GENERATOR_KEY, REFERENCE_KEY
from fedgo_flwr.protocol.fedgo import PROTOCOL as FEDGO
from fedgo_flwr.runtime import messages as msgs
from fedgo_flwr.runtime.fileio import atomic_torch_save, safe_torch_load
from fedgo_flwr.runtime.messages import ARRAYS, CONFIG, stream_replies, to_record
from fedgo_flwr.runtime.progress import Progress
from fedgo_flwr.runtime.rng import derive_seed, make_rng
from fedgo_flwr.runtime.shutdown import raise_if_stopping
from strategies._fedgan import FedGANStage
from strategies._sending import Outbox


class DiscriminatorStage(FedGANStage):
    """Generator and client discriminators (FedGO Alg. 2-3), a part of the strategy.

    ``cfg``: the experiment (``cfg.strategy.params`` has the ``generator`` and
    ``discriminator`` sections); ``resources``: the server's data, device and run folder;
    ``outbox``: the strategy's messages (the ``train.discriminator`` and ``train.fedgan``
    rounds go to every client); ``run_token``: this run's; ``data``: what a G1 generator is
    trained on and the server's reference images come from (FedGO: the server's unlabeled
    data; CPFL: its public set); ``needs_generator``: whether the run uses G (the
    discriminators' reference, or D2's distillation set); ``resuming``: the run continues from
    a checkpoint (its own ``generator.pt`` and ``discriminators.pt`` are reused);
    ``aggregation``: the FedGAN rounds' averages (G3); ``stage_times``: where the seconds of
    the ``generator`` and ``discriminators`` stages are written (the strategy's).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        resources: Any,
        outbox: Outbox,
        *,
        run_token: str,
        data: Callable[[], ArrayDataset],
        needs_generator: bool,
        resuming: bool,
        aggregation: AggregationConfig,
        stage_times: dict[str, float],
    ) -> None:
        self.cfg = cfg
        self.params = cfg.strategy.params
        self.resources = resources
        self.outbox = outbox
        self.run_token = run_token
        self.data = data
        self.needs_generator = needs_generator
        self.resuming = resuming
        self.aggregation = aggregation
        self.stage_times = stage_times

    def reference_images(self) -> np.ndarray:
        """The server images sent as the discriminators' reference (``discriminator.reference``
        ``server`` or ``mixture``): ``reference_size`` of :attr:`data`, drawn once per run with
        the seed (0: all of them), in index order."""
        data = self.data()
        size = self.params.discriminator.reference_size
        return np.asarray(data.x[reference_indices(len(data), size, self.cfg.seed)])

    def discriminator_message_config(self) -> ConfigRecord:
        """The config of the ``train.discriminator`` messages: the ``fedgo`` client algorithm
        with the generator and discriminator settings, whatever the strategy's own client."""
        config = self.outbox.config(0, self.run_token)
        fields = [f.name for f in dataclasses.fields(FEDGO.Config)]
        own = dataclasses.asdict(self.params)
        config[msgs.ALGORITHM] = FEDGO.name
        params = {k: own[k] for k in fields}
        config[msgs.CLIENT_PARAMS] = json.dumps(params, sort_keys=True, allow_nan=False)
        return config

    def obtain_generator(
        self, grid: Grid | None = None
    ) -> tuple[torch.nn.Module, str | None, dict[str, object]]:
        """G (trained, loaded, or the resumed run's own), where the discriminators come from
        (a file, or ``None``: ask the clients), and the report so far; G is saved with the run.
        ``grid`` reaches the clients for scenario G3 (``generator.federated_rounds``)."""
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
        generator = seeded_generator(self.cfg.seed, gp, shape)
        t0 = time.perf_counter()
        if not self.needs_generator and not gen_path:
            report["generator"] = {"source": "not needed (discriminator.reference: server)"}
            log(INFO, "FedGO: no generator needed (strategy.discriminator.reference: server)")
        elif gen_path:
            generator.load_state_dict(safe_torch_load(gen_path, "generator file"))
            report["generator"] = {"source": gen_path}
            if gp.module:
                report["generator"]["module"] = gp.module
            log(INFO, "FedGO: generator loaded from %s", gen_path)
        elif gp.module:
            # G2 with the user's generator as its factory made it (e.g. pretrained weights).
            report["generator"] = {"source": "module (its own weights)", "module": gp.module}
            log(INFO, "FedGO: generator of strategy.generator.module %s", gp.module)
        elif gp.federated_rounds > 0:
            if grid is None:
                raise RuntimeError("scenario G3 (generator.federated_rounds) needs the grid")
            log(INFO, "FedGO: FedGAN at the clients, %d rounds (G3)", gp.federated_rounds)
            report["generator"] = self.train_federated_generator(grid, generator)
        elif gp.steps == 0:
            # FedGO's Table 12: even an untrained generator's discriminators help; and the
            # only choice without server data and without a generator file.
            report["generator"] = {"source": "untrained (generator.steps 0)"}
            log(INFO, "FedGO: untrained generator (strategy.generator.steps 0)")
        else:
            report["generator"] = self.train_or_reuse_generator(generator, res.device, shape)
        generator.cpu()
        report["generator_time"] = time.perf_counter() - t0
        self.stage_times["generator"] = report["generator_time"]
        if not saved_gen.is_file() or gen_path != str(saved_gen):
            atomic_torch_save(saved_gen, generator.state_dict())

        return generator, disc_path, report

    def train_or_reuse_generator(
        self, generator: torch.nn.Module, device: torch.device, shape: tuple[int, ...]
    ) -> dict[str, object]:
        """Scenario G1: train ``generator`` with WGAN-GP on the server's data, or, with
        ``strategy.generator.cache`` set, load the one an earlier run trained with the same
        data, settings and seed (:mod:`fedgo_flwr.gan.cache`) and store it after training; a
        training that an earlier run left unfinished goes on from its snapshot."""
        gp = self.params.generator
        data = self.data()
        source = "trained on server data (G1)"
        if not gp.cache:
            log(INFO, "FedGO: training the WGAN-GP generator, %d steps", gp.steps)
            return {"source": source, **train_generator(generator, self.cfg, data, device, shape)}
        key = generator_cache.generator_key(
            gp,
            seed=self.cfg.seed,
            data=np.asarray(data.x),
            flip=data.flip,
            augment=self.cfg.data.augment,
            device=device,
        )
        hit, why = generator_cache.load_cached_generator(gp.cache, key)
        if hit is not None:
            try:
                generator.load_state_dict(hit.state)
            except RuntimeError as exc:
                hit, why = None, f"{hit.entry} does not fit the generator ({exc})"
        if hit is not None:
            log(INFO, "FedGO: generator from the cache, %s (%d steps)", hit.entry, gp.steps)
            return {**hit.stats, "source": f"{source}, from the cache", "cache": str(hit.entry)}
        log(INFO, "FedGO: training the WGAN-GP generator, %d steps (cache: %s)", gp.steps, why)
        snapshot = generator_cache.training_snapshot(gp.cache, key)
        stats = train_generator(generator, self.cfg, data, device, shape, resume_file=snapshot)
        entry = generator_cache.store_generator(gp.cache, key, generator.state_dict(), stats)
        return {"source": source, **stats, "cache": str(entry)}

    def discriminators(
        self, grid: Grid, generator: torch.nn.Module, path: str | None
    ) -> tuple[dict[int, torch.nn.Module], dict[str, object]]:
        """Collect D_k from every client (or load them); save them with the run."""
        res = self.resources
        assert res is not None
        dp = self.params.discriminator
        shape = res.bundle.train.input_shape
        started = time.perf_counter()
        states: dict[int, dict[str, torch.Tensor]] = {}
        report: dict[str, object] = {}
        # What every discriminator must look like. Seeded, so the global RNG is left alone.
        template = dp.build(shape, seed=0).state_dict()
        reference = {k: v.numpy() for k, v in template.items()}
        if path:
            states = self._load_discriminators(path, reference)
            report["discriminators"] = {"source": path}
        else:
            content = RecordDict({CONFIG: self.discriminator_message_config()})
            if dp.uses_generator:
                content[GENERATOR_KEY] = ArrayRecord(generator.state_dict())
            if dp.uses_server_images:
                images = self.reference_images()
                content[REFERENCE_KEY] = to_record({REFERENCE_KEY: images})
                report["reference"] = {
                    "kind": dp.reference,
                    "images": len(images),
                    "bytes_per_client": int(images.nbytes),
                }
            messages = self.outbox.to(content, self.outbox.node_ids, DISCRIMINATOR_MESSAGE)
            t0 = time.perf_counter()
            per_client: dict[str, dict[str, float]] = {}
            # As the rounds do: a SuperLink's 'Node Unavailable' reply is credited to its node.
            intake = self.prefl_intake("discriminator")
            spec = FEDGO.reply(DISCRIMINATOR_MESSAGE)
            said = Progress("FedGO discriminators (replies)", len(messages), "clients")
            for reply in stream_replies(grid, messages, self.cfg.round_timeout):
                said.advance()
                checked = intake.take(reply, spec, {ARRAYS: reference})
                if checked is not None:
                    pid = checked.partition_id
                    states[pid] = {
                        k: torch.from_numpy(np.array(v, copy=True))
                        for k, v in checked.arrays[ARRAYS].items()
                    }
                    per_client[str(pid)] = checked.metrics
            said.close()
            for pid in intake.silent:
                log(
                    WARNING,
                    "FedGO: no discriminator from client %d (node %d)",
                    pid,
                    self.outbox.node_ids[pid],
                )
            report["discriminator_round_time"] = time.perf_counter() - t0
            report["discriminators"] = per_client
            raise_if_stopping("the discriminators")  # some may have died with the stop
            atomic_torch_save(res.out_dir / "discriminators.pt", states)
        discs: dict[int, torch.nn.Module] = {}
        for pid, state in states.items():
            disc = dp.build(shape)
            disc.load_state_dict(state)
            discs[pid] = disc
        self.stage_times["discriminators"] = time.perf_counter() - started
        missing = sorted(set(range(self.cfg.data.num_clients)) - set(discs))
        if missing:
            log(WARNING, "FedGO: clients %s have no discriminator; neutral weights", missing)
        report["missing_discriminators"] = missing
        return discs, report

    def prefl_intake(self, what: str) -> RoundIntake:
        """The intake of a round sent to every client (the discriminator round, a FedGAN
        round): n_k is the server's count of each client's whole partition, the data these
        rounds train on."""
        sizes = None if self.resources is None else self.resources.partition.client_sizes
        nodes = self.outbox.node_ids
        return RoundIntake(nodes, nodes, sizes, what=what, tokens=self.outbox.tokens)

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


def reference_indices(n: int, size: int, seed: int) -> np.ndarray:
    """Which of the server's ``n`` images are the discriminators' reference: ``size`` of them
    drawn with the seed (all if ``size`` is 0 or at least ``n``), in index order."""
    if not 0 < size < n:
        return np.arange(n)
    order = torch.randperm(n, generator=make_rng(seed, "disc-reference")).numpy()
    return np.sort(order[:size])


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


def seeded_generator(seed: int, gp: GeneratorConfig, shape: tuple[int, ...]) -> torch.nn.Module:
    """FedGO's generator of ``strategy.generator`` with its seeded initial weights (the
    ``module`` factory's or the ``name`` generator, :meth:`GeneratorConfig.build`; the clients
    build theirs with the same seed, ``clients/fedgo.py``)."""
    return gp.build(shape, seed=derive_seed(seed, "gen-init"))


def preflight_input_shape(cfg: ExperimentConfig) -> tuple[int, ...]:
    """The classifier's input shape: the dataset's entry's
    (:data:`fedgo_flwr.config.names.DATASETS`), so the pre-flight check need not load it,
    else read from the data (``imagefolder``, ``hf:``; cached per process, so the ServerApp
    loads it once)."""
    entry = dataset_entry(cfg.data.dataset.strip().lower())
    known = entry.input_shape if entry is not None else None
    return known if known is not None else load_bundle(cfg.data).train.input_shape


def check_generator(cfg: ExperimentConfig, c: Checker) -> None:
    """Pre-flight check of ``strategy.generator.module`` (scenario G2 with the user's factory;
    :class:`GeneratorConfig` has checked already that it imports and that ``steps`` is 0).

    The generator is built as the run will build it (seeded), drawn on 2 codes, and its output
    must be ``(2, *input_shape)`` of the classifier and finite; a ``path`` must load into it.
    A problem raises :class:`ConfigError` naming ``strategy.generator.module`` (or ``.path``).
    """
    gp = getattr(cfg.strategy.params, "generator", None)
    if not isinstance(gp, GeneratorConfig) or gp.module is None:
        return
    g = c.at("strategy.generator.", gp)
    shape = preflight_input_shape(cfg)
    try:
        generator = seeded_generator(cfg.seed, gp, shape)
    except ValueError as exc:
        g.fail("module", str(exc))
    problem = generator_output_problem(generator, gp.latent_dim, shape)
    if problem is not None:
        g.fail("module", f"{problem} (data.dataset {cfg.data.dataset})")
    if gp.path:
        try:
            generator.load_state_dict(safe_torch_load(gp.path, "generator file"))
        except Exception as exc:  # noqa: BLE001 - any failure is the file's: say which
            text = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
            g.fail("path", f"does not load into the generator of {gp.module}: {text}")


def train_generator(
    generator: torch.nn.Module,
    cfg: ExperimentConfig,
    data: ArrayDataset,
    device: torch.device,
    shape: tuple[int, ...],
    *,
    steps: int | None = None,
    on_step: Callable[[int], None] | None = None,
    resume_file: Path | None = None,
) -> dict[str, float]:
    """Train ``generator`` with WGAN-GP on ``data`` (scenario G1) as ``strategy.generator``
    says, against a seeded critic; returns the training statistics. ``steps`` (default:
    ``strategy.generator.steps``) and ``on_step`` (:func:`train_wgan_gp`) let a benchmark keep
    the generators of shorter runs from one long one; ``resume_file`` keeps a snapshot of the
    training in progress, which a later call goes on from (:func:`train_wgan_gp`)."""
    gp = cfg.strategy.params.generator
    critic = gp.build_critic(shape, seed=derive_seed(cfg.seed, "critic-init"))
    return train_wgan_gp(
        generator,
        critic,
        data,
        steps=gp.steps if steps is None else steps,
        **gp.wgan_kwargs(),
        rng=make_rng(cfg.seed, "wgan"),
        device=device,
        augment=cfg.data.augment,
        progress="FedGO generator (WGAN-GP)",
        on_step=on_step,
        resume_file=resume_file,
    )
