"""Write ``docs/configuration.md`` from the configuration dataclasses.

Run from the repository root::

    .venv/bin/python -m docs.gen_configuration --write   # or: ... > docs/configuration.md

Every key, its type, default and integer limit come from the dataclasses: the core sections of
:mod:`fedgo_flwr.experiment.config` and, for each strategy of :func:`strategies.available`, its
``Config`` with every base class and nested section (``strategy.aggregation``, ``strategy.distill``
...). What each section's ``check`` method refuses is read from its source (``c.require``,
``c.choice``, ``c.fail``), and which strategies read a section from the classes. A section's
prose is its class docstring; a key's description is its attribute docstring (a string right
below the field), else the entry of :data:`NOTES` for it, else the class docstring, which then
must name the key. ``tests/unit/test_docs.py`` keeps the committed file equal to this output and
every key described.

This is a development tool: nothing of the library or the apps imports it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import strategies
from fedgo_flwr.experiment.config import ExperimentConfig, StrategyConfig
from fedgo_flwr.experiment.schema import MAX_INT
from fedgo_flwr.weighting import WEIGHTING_METHODS

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "configuration.md"
COMMAND = ".venv/bin/python -m docs.gen_configuration --write"

STRATEGY_ORDER = (
    "fedavg",
    "fedprox",
    "scaffold",
    "feddisco",
    "feduv",
    "fedtgp",
    "fedgkd",
    "fedgkd_plus",
    "feddf",
    "fedgo",
    "dafkd",
    "central",
    "cpfl",
    "oneshot",
    "coboosting",
    "dense",
    "fadi",
    "coboosting_fedgo",
)
"""The order of the strategy sections (related ones together); others follow by name."""

HIDDEN = {"StrategyConfig.params", "StrategyConfig.sources"}
"""Fields that are no YAML keys (the strategy's parameters sit beside ``strategy.name``)."""

NOTES: dict[str, str] = {
    # ExperimentConfig (top-level keys)
    "ExperimentConfig.name": "Run name: the prefix of the run's log lines, and the folder "
    "`outputs/<name>/` of its runs when `output_dir` is not set.",
    "ExperimentConfig.seed": "Seeds the partition, the model's initialisation, client sampling "
    "and client training; every random draw of a round is derived from `(seed, round, ...)`.",
    "ExperimentConfig.rounds": "Federated rounds (for CPFL: the most rounds a cohort runs; the "
    "one-shot strategies need 1).",
    "ExperimentConfig.fraction": "Share of the clients sampled each round: "
    "`max(min_clients, floor(fraction * data.num_clients))`.",
    "ExperimentConfig.min_clients": "A round needs this many usable replies, else the model is "
    "kept.",
    "ExperimentConfig.output_dir": "Where the run writes its files (relative paths: against "
    "`$FEDGO_WORKDIR` if set, else the working directory). Not set (`null`), every run gets a "
    "new folder `outputs/<name>/<date-time>` (`%Y-%m-%d_%H-%M-%S`, then `-1`, `-2` ... if "
    "taken), and `outputs/<name>/latest` links to the newest; the folder chosen is logged. A "
    "folder named here that holds another run's files is refused unless `resume` or "
    "`overwrite` is set.",
    "ExperimentConfig.device": "The server's device: `auto` (CUDA if present, else MPS, else "
    "the CPU), `cpu`, `cuda`, `cuda:N` or `mps`.",
    "ExperimentConfig.client_device": "The clients' device, the same choices. In a simulation "
    "a client sees a GPU only with `resources.client_gpus > 0`; `cuda` without it is refused.",
    "ExperimentConfig.round_timeout": "Seconds the server waits for a round's replies; a "
    "client that has not replied by then is left out of the round (logged with its id).",
    "ExperimentConfig.checkpoint": "Write `checkpoint.pt` (the server's state) after every "
    "round, and let clients keep their state (SCAFFOLD's c_i) on disk.",
    "ExperimentConfig.resume": "Continue from `output_dir/checkpoint.pt` (or "
    "`checkpoint.prev.pt`) if there is one, or without `output_dir` from the run "
    "`outputs/<name>/latest` names (none yet: a new run); a run that stopped before its first "
    "checkpoint starts again. The configuration must equal the checkpoint's except for "
    "`rounds`, `resume`, `overwrite`, `round_timeout`, `faults`, `checkpoint`, `device`, "
    "`resources`, `name` and `output_dir`; raising `rounds` extends a finished run.",
    "ExperimentConfig.overwrite": "Replace the earlier run in `output_dir`. Without it (or "
    "`resume`), a folder that holds a run's files (`metrics.jsonl`, `summary.json`, "
    "`model.pt`, checkpoints, FedGO's files) is refused before anything is written.",
    "ExperimentConfig.faults": "Deliberate client failures for tests and demos, e.g. "
    "`[{partition: 1, round: 2, kind: crash}]`. Only nodes that opted in act them out (node "
    "config `allow-faults=true`; simulated nodes: `FEDGO_ALLOW_FAULTS=1`, which `./run.sh` "
    "sets); other nodes ignore them with a WARNING.",
    "FaultConfig.kind": "What the client does (see above).",
    # DataConfig
    "DataConfig.dataset": "`digits` (scikit-learn's, built in), `four_gaussians` (synthetic, "
    "FedGO App. E.1), `cifar10`, `cifar100` (torchvision), `imagefolder` (a local "
    "`train/<class>/*`, `test/<class>/*` tree) or `hf:<id>` (a Hugging Face image dataset: "
    "`pip install -e .[hf]`, needs internet).",
    "DataConfig.path": "The ImageFolder root, or the folder holding torchvision's CIFAR "
    "archives (`cifar-10-batches-py/`, `cifar-100-python/`).",
    "DataConfig.download": "Let torchvision download CIFAR (needs internet); without it a "
    "missing archive stops the run before it starts.",
    "DataConfig.num_clients": "K, the number of clients (partitions).",
    "DataConfig.alpha": "Dirichlet concentration of the `dirichlet` and `dirichlet_prior` "
    "splits (smaller: more skewed).",
    "DataConfig.server_fraction": "Share of each class the server holds (unlabeled for "
    "training; its labels only feed diagnostics). 0: none (FedAvg, FedProx, SCAFFOLD, the "
    "one-shot data-free strategies, FedGO distilling on generated data). FedDF and FedGO on "
    "server data need it; CPFL with more than one cohort needs it or `data.public_path`.",
    "DataConfig.min_client_size": "The split is redrawn until every client holds this many "
    "samples.",
    "DataConfig.augment": "Random horizontal flips during training, where the dataset allows them.",
    "DataConfig.train_subset": "Use a stratified subset of this many training images (fixed, "
    "independent of the seed).",
    "DataConfig.test_subset": "Evaluate on a stratified subset of this many test images "
    "(fixed, independent of the seed).",
    "DataConfig.public_path": "The server's unlabeled images from another data set: a folder "
    "of images (any depth), resized to the training images' size, e.g. STL-10's unlabeled "
    "split for CIFAR-10 clients (FedDF Fig. 5-6, FedGO App. F.3). CPFL and the FedDF family "
    "distil on it, and FedGO trains its G1 generator and server-referenced discriminators on "
    "it; `data.server_fraction` may then be 0. Other strategies refuse it. `null`: the "
    "server's share.",
    "DataConfig.quantity_sigma": "`dirichlet_prior` only: client amounts ~ "
    "LogNormal(log(N/K), sigma) over the client pool of N samples (0: equal amounts; "
    "Co-Boosting uses 0.4, 0.8, 1.2).",
    "ModelConfig.name": "`cnn` (small, CPU-sized), `cnn_bn` (the same with BatchNorm), `mlp`, "
    "`resnet8` (FedDF's CIFAR ResNet-8), `resnet18` (CIFAR variant), `vgg11_bn`, `resnet50`, "
    "`gn_lenet` (GroupNorm LeNet of Hsieh et al. 2020, CPFL's CIFAR-10 model; raw logits), "
    "`cnn5` (Co-Boosting's 5-layer CNN, the authors' `CNNCifar`), `lenet5` (the PyTorch "
    "tutorial's LeNet-5, Co-Boosting's MNIST model), `mobilenetv3_small` and `shufflenetv2` "
    "(Co-Boosting's heterogeneous clients, ImageNet layouts as in the authors' code). A model "
    "that cannot take the dataset's inputs is refused by key when the run starts.",
    "ModelConfig.client_models": "One name per client, or a shorter list repeated over the "
    "partition ids; at most `data.num_clients` names. Strategies that average parameters "
    "refuse names other than `model.name`; `coboosting`, `coboosting_fedgo`, `dense` and "
    "`fadi` take them (their ensemble meets in the logits; the student is `model.name`), and "
    "so do `feddf` and `fedgo` (FedDF Alg. 3: one prototype per architecture, each started "
    "from its own clients' average and distilled towards the ensemble of all clients; the "
    "others report `test_accuracy_<arch>`). Each client is sent its own architecture's "
    "arrays and its reply is checked against them.",
    # TrainConfig, EvalConfig, ResourcesConfig
    "TrainConfig.local_epochs": "Client epochs per round.",
    "TrainConfig.batch_size": "Client batch size.",
    "TrainConfig.optimizer": "The clients' optimiser.",
    "TrainConfig.lr": "The clients' learning rate.",
    "TrainConfig.momentum": "SGD momentum.",
    "TrainConfig.weight_decay": "L2 weight decay of the clients' optimiser.",
    "EvalConfig.batch_size": "Batch of the server's test evaluation (64: the fastest on a CPU; "
    "the results do not depend on it; 512 or more on a GPU).",
    "EvalConfig.every": "Evaluate every N rounds (and in the last).",
    "ResourcesConfig.client_cpus": "CPUs of one simulated ClientApp (also its torch threads; a "
    "SuperNode caps them at its CPU count or its `max-threads`).",
    "ResourcesConfig.client_gpus": "GPU share of one simulated ClientApp (0.25: four clients "
    "per GPU); with 0 Ray hides the GPUs from the clients.",
    "ResourcesConfig.server_cpus": "Torch threads of the ServerApp (distillation, evaluation); "
    "`null`: all cores.",
    # strategy.aggregation
    "AggregationConfig.rule": "How every averaging strategy (FedAvg, FedProx, SCAFFOLD's "
    "model update, the FedDF family's average initialisation) combines the round's client "
    "models: `mean` (n_k-weighted, FedAvg), `median` or `trimmed_mean` (coordinate-wise and "
    "unweighted, Yin et al., ICML 2018; these keep the round's models in memory).",
    "AggregationConfig.trim_fraction": "`trimmed_mean` drops `floor(trim_fraction * m)` of the "
    "`m` replies at each end of every coordinate; it must trim at least one of the clients "
    "sampled per round.",
    "AggregationConfig.clip_norm": "Clip each client's update to this L2 norm before the rule "
    "(Sun et al. 2019); rounds record `clients_clipped`. SCAFFOLD's control variates are not "
    "clipped.",
    "AggregationConfig.upload_bound": "Bounds FedGAN's generator and critic (G3), DaFKD's "
    "generator and discriminator heads, FedTGP's prototypes (each class's; the median one "
    "vote per client), SCAFFOLD's control deltas, and each teacher's logit scale (FedDF "
    "family: scaled down; one-shot: left out). An upload whose L2 norm exceeds `upload_bound` "
    "times the round's (lower) median is scaled down to it, with a WARNING naming the client.",
    # strategy.name
    "StrategyConfig.name": "The server algorithm: a module of `strategies/` ({strategies}). "
    "Its own parameters sit beside it (`strategy.<key>`, below); parameters of other "
    "strategies are ignored with a warning, so swapping `strategy.name` is a one-line change.",
    # FedDF family
    "FedDFConfig.weighting": "How the ensemble weighs each client on each sample: a method of "
    "the weighting registry (below; `fedgo` and `domain` need FedGO's discriminators).",
    "FedDFConfig.weight_cap": "No client's share of a sample's ensemble weight above this "
    "(the excess goes to the others in proportion; the weights still sum to 1); it must "
    "satisfy `weight_cap * clients per round >= 1`. It bounds single-sigmoid FedGO, where one "
    "client with huge discriminator logits takes weight 1. Pseudo-labels and ensemble "
    "evaluation use it; the `pl_acc_*` diagnostics do not.",
    "FedDFConfig.init": "Distillation starts from the n_k-weighted average of the round's "
    "client models (`average`) or from the last server model (`previous`).",
    "FedDFConfig.val_fraction": "Labelled share of the server set held out for the `feddf` "
    "distillation protocol's early stopping.",
    "FedDFConfig.distill_size": "Distil on this many of the server's unlabeled images (or of "
    "`data.public_path`'s), drawn once with the seed; `null`: all.",
    "FedDFConfig.ensemble_eval_every": "Test the weighted ensemble of the round's client "
    "models every N rounds and in the last (0: never).",
    "FedDFConfig.diagnostics": "Record the pseudo-label accuracy of every weighting and the "
    "label oracle on the same client models each round (`pl_acc_<weighting>`).",
    "DistillConfig.protocol": "`fedgo`: `epochs` passes with Adam at `lr`, cosine decay across "
    "`decay_rounds` rounds (`lr_decay`); `feddf`: at most `max_steps` steps, validation every "
    "`eval_every`, stop after `patience` steps without improvement, `grad_clip`, the best "
    "student kept.",
    "DistillConfig.epochs": "Passes over the distillation set per round (`fedgo` protocol).",
    "DistillConfig.batch_size": "Distillation batch size.",
    "DistillConfig.lr": "Adam's learning rate.",
    "DistillConfig.lr_decay": "Cosine decay of `lr` across `decay_rounds` rounds (`fedgo`).",
    "DistillConfig.decay_rounds": "The rounds the cosine decay spans (`fedgo`).",
    "DistillConfig.temperature": "Softmax temperature of the teacher ensemble and the student.",
    "DistillConfig.augment": "Random flips of the distillation images, where the data allow.",
    "DistillConfig.max_steps": "Most steps per round (`feddf` protocol).",
    "DistillConfig.eval_every": "Steps between validations (`feddf` protocol).",
    "DistillConfig.patience": "Steps without a better validation before stopping (`feddf`).",
    "DistillConfig.grad_clip": "Gradient norm clip (`feddf` protocol).",
    "DistillConfig.bn_stats": "The student's BatchNorm statistics while it distils: `update` "
    "(train mode), `batch` (train mode, then the averaged model's running statistics are put "
    "back), `eval` (BatchNorm in eval mode: the averaged model's statistics normalise every "
    "batch); `auto`: `batch` on generated data (FedGO D2, DaFKD), `update` on real data. "
    "Generated images' statistics can ruin a server model under `update` "
    "(`fedgo_flwr/learning/distill.py` explains).",
    "FedGOConfig.weighting": "FedGO's odds weights by default.",
    "FedGOConfig.distill_data": "`server` (D1: the server's unlabeled share) or `generated` "
    "(D2: `generated_size` samples of the generator, drawn once). D2 works with "
    "`data.server_fraction: 0` when the generator is loaded, built by `generator.module`, "
    "untrained (`generator.steps: 0`) or trained by FedGAN (G3), with the `fedgo` "
    "distillation protocol.",
    "FedGOConfig.generated_size": "Samples in the generated distillation set (D2).",
    "FedGOConfig.byzantine": "FedGO App. F.8: this many clients (seeded, the same all run, "
    "listed in `prefl.json`) return a discriminator that outputs its maximum everywhere. "
    "Defences: `weighting_params.fedgo.clip`, `weight_cap`.",
    # GAN sections
    "GeneratorConfig.latent_dim": "Size of the generator's normal latent codes.",
    "GeneratorConfig.batch_size": "WGAN-GP batch size.",
    "GeneratorConfig.lr": "Adam's learning rate (generator and critic).",
    "GeneratorConfig.n_critic": "Critic steps per generator step (WGAN-GP).",
    "GeneratorConfig.gp_lambda": "Weight of WGAN-GP's gradient penalty.",
    "DiscriminatorConfig.name": "The discriminator network.",
    "DiscriminatorConfig.batch_size": "Discriminator training batch size.",
    "DiscriminatorConfig.lr": "Adam's learning rate.",
    # CPFL
    "CPFLConfig.cohorts": "Number of cohorts n (1: FedAvg with early stopping; "
    "`data.num_clients`: one-shot FedKD, every client a cohort).",
    "CPFLConfig.grouping": "`random` (seeded, near-equal sizes) or `class` (one cohort per "
    "dominant class; `cohorts` must equal the number of classes).",
    "CPFLConfig.window": "Rounds of the moving average of a cohort's mean validation loss.",
    "CPFLConfig.patience": "A cohort stops once its smoothed validation loss has not reached a "
    "new minimum for this many rounds.",
    "CPFLConfig.teacher": "A cohort's teacher: the model with the lowest smoothed loss "
    "(`best`) or its `last`.",
    "CPFLConfig.distill_when": "Distil once this share of the cohorts has converged (the rest "
    "at their best as of then).",
    "CPFLConfig.distill_at_hours": "Or distil at this simulated time (hours).",
    "CPFLConfig.cohort_eval_every": "Test accuracy of each cohort that trained, every N "
    "rounds (0: only the teachers at the end).",
    "CPFLConfig.teacher_test_size": "Evaluate the teachers and their ensemble on a stratified "
    "subset of this many test images (the student always on all); `null`: all.",
    "CPFLConfig.profiles": "Device profiles: a CSV `client_id,seconds_per_batch,"
    "bytes_per_second`, one row per client; `null`: a seeded synthetic population, "
    "log-uniform over 0.9-11.9 s per mini-batch and 130 KB/s-26 MB/s.",
    "CohortClientConfig.local_algorithm": "The client algorithm every cohort runs (`fedavg`, "
    "`fedprox`; not `scaffold`, whose server state cohorts do not keep).",
    "CohortClientConfig.local_params": "Its parameters, e.g. `{mu: 0.01}`.",
    "CohortClientConfig.val_fraction": "Each client with at least `min_val_samples` samples "
    "keeps this share apart and reports the received model's loss on it.",
    "CohortClientConfig.min_val_samples": "Smallest client that keeps a validation split.",
    "CohortDistillConfig.epochs": "Epochs of the student's distillation.",
    "CohortDistillConfig.batch_size": "Distillation batch size.",
    "CohortDistillConfig.lr": "Adam's learning rate.",
    "CohortDistillConfig.beta1": "Adam's beta1.",
    "CohortDistillConfig.weights": "The teachers' weights `p_ic` in the L1 target "
    "`sum_i p_ic z_ic`: `label` (`N_ic / sum_j N_jc`, the authors' code), `size` (`N_i / N`, "
    "the paper's text), `uniform` (1/n), or `fedgo` (beyond the paper: FedGO's discriminator "
    "odds per sample, a cohort's weight the sum of its clients' `n_k Phi_k(x)`; runs FedGO's "
    "pre-FL stage with `strategy.generator` and `strategy.discriminator`, the generator "
    "trained on the public set).",
    "CohortDistillConfig.disc_mode": "With `weights: fedgo`: how discriminator logits become "
    "odds, as FedGO's `disc_mode`.",
    "CohortDistillConfig.outputs": "Distil `logits` or `log_probs` (log-softmax outputs, the "
    "authors' GN-LeNet).",
    "CohortDistillConfig.teacher_batch_size": "Batch of the teachers' inference.",
    # one-shot
    "CoBoostingConfig.student_init": "The student starts from the server's seeded "
    "initialisation (`fresh`, the paper) or the clients' average (`average`, one architecture "
    "only).",
    "CoBoostingConfig.nz": "Latent size of the DENSE / Co-Boosting generator.",
    "CoBoostingConfig.ngf": "Width of that generator (images with H and W multiples of 4).",
    "SynthesisSettings.batch_size": "Synthetic batch size.",
    "CoBoostingFedGOConfig.combine": "The ensemble weighs client k on sample x by FedGO's odds "
    "weight `n_k Phi_k(x) / sum_i n_i Phi_i(x)` alone (`odds`) or times Co-Boosting's "
    "learned `w_k` (`odds_learned`).",
    "CoBoostingFedGOConfig.disc_mode": "How discriminator logits become odds, as FedGO's "
    "`disc_mode`.",
}
"""Descriptions of keys that have no attribute docstring, by ``Class.field``.

A class's entry serves its subclasses too. The generator refuses an entry that names no field.
"""

INTRO = """\
An experiment is one YAML file. `conf/base.yaml` lists every core key with its default (a test
keeps it equal to the dataclasses below); other files start from it with `base: base.yaml` and
change what differs. Overrides on the command line are `dotted.key=value`, the value parsed as
YAML (`./run.sh conf/fedprox.yaml data.alpha=0.05 strategy.mu=0.001`). A strategy's own keys
sit beside `strategy.name`; their defaults are its `Config` class (`strategies/<name>.py`).

`conf/` has one file per strategy and per paper setting: `conf/paper/<peer>-cifar10-a0.1.yaml`
is each Table-3 peer of the FedGO paper with its App. E.2 values on FedGO's CIFAR-10 setting,
`conf/paper/fedgo-*.yaml` FedGO with the paper's settings (Sec. 4, App. E.2), and
`conf/bench/` the presets of the CPU benchmarks. Paper-scale presets take hours on a GPU
(`benchmarks/paper_cost.py` estimates a preset's cost on the machine at hand).

Validation names the key, the value and where it came from, and stops before anything runs
(`./run.sh` and `prepare` exit with status 2; the ServerApp runs the same checks):

```
fedgo-flwr: invalid configuration: override 'data.alpha=-1': data.alpha = -1.0: must be > 0
```
"""

RULES = """\
## What every key must satisfy

Besides each key's own checks below, the schema (`fedgo_flwr/experiment/schema.py`) and the YAML
reader (`fedgo_flwr/experiment/config.py`) refuse, naming the key; `REFUSED` in
`tests/unit/test_config.py` lists every case:

- **Keys and types.** A key no section has (the error suggests the closest one); a value of
  the wrong type (an `int` is accepted for a `float`).
- **Numbers.** `.inf` and `.nan` in any float key; an integer beyond ±{max_int} unless the
  key states another limit; an integer literal of more than 100 digits. YAML reads `1e-3` as
  text, not a number: write a dot and a signed exponent (`1.0e-3`, `1.0e+6`), as the error
  says.
- **Files.** An empty file (or only comments: it would run the defaults); a key given twice
  in one mapping (YAML would keep the last); a file that is not UTF-8 text; nesting deeper
  than 50 levels; more than 100,000 values once YAML aliases are expanded.
- **Pre-flight** (`preflight` in `fedgo_flwr/app/cli.py`: the machine and the files). The data
  must be there (`imagefolder`'s `train/` folder; CIFAR's torchvision folder under `data.path`
  unless `data.download`); every `path` of the strategy's parameters must be an existing file;
  `device: cuda:N` needs CUDA device N on this machine (`mps`: Apple's MPS); FedDF and FedGO
  on server data need `data.server_fraction > 0`. A strategy adds its own checks of the whole
  experiment in its `check_config` and `preflight` class methods (for example, `weight_cap`
  must be feasible for the clients sampled per round).
"""


# ------------------------------------------------------------------------------------------
# Finding the sections
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Section:
    """One configuration dataclass: where it sits in YAML and who reads it."""

    cls: type
    prefix: str
    readers: list[str]

    @property
    def anchor(self) -> str:
        return self.cls.__qualname__.lower()

    @property
    def own_fields(self) -> list[dataclasses.Field]:
        own = self.cls.__dict__.get("__annotations__", {})
        return [
            f
            for f in dataclasses.fields(self.cls)
            if f.name in own and f"{self.cls.__qualname__}.{f.name}" not in HIDDEN
        ]


def _section_type(tp: Any) -> type | None:
    """The dataclass of a section field (``X`` or ``list[X]``), else ``None``."""
    if typing.get_origin(tp) is list:
        (tp,) = typing.get_args(tp)
    return tp if dataclasses.is_dataclass(tp) else None


def strategy_names() -> list[str]:
    available = strategies.available()
    return [n for n in STRATEGY_ORDER if n in available] + sorted(
        n for n in available if n not in STRATEGY_ORDER
    )


def find_sections() -> tuple[dict[type, Section], dict[type, Section]]:
    """The core sections and the strategy sections, each in the order they are documented."""
    core: dict[type, Section] = {}
    strat: dict[type, Section] = {}

    def walk(cls: type, prefix: str, reader: str, into: dict[type, Section]) -> None:
        for klass in reversed(cls.__mro__):
            if dataclasses.is_dataclass(klass):
                section = into.setdefault(klass, Section(klass, prefix, []))
                if reader not in section.readers:
                    section.readers.append(reader)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = _section_type(hints[f.name])
            if sub is not None and sub is not StrategyConfig:
                list_marker = "[]" if typing.get_origin(hints[f.name]) is list else ""
                walk(sub, f"{prefix}{f.name}{list_marker}.", reader, into)

    walk(ExperimentConfig, "", "every experiment", core)
    core[StrategyConfig] = Section(StrategyConfig, "strategy.", ["every experiment"])
    for name in strategy_names():
        walk(strategies.strategy_class(name).Config, "strategy.", name, strat)
    return core, strat


# ------------------------------------------------------------------------------------------
# What the code says about a key
# ------------------------------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of ``cls``: a string literal right below a field."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def class_doc(cls: type) -> str:
    """The class docstring, or ``""`` where it is only the generated signature."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc)


_UNRESOLVED = "\x00"


class _Checks:
    """The checks in a section's ``check`` method, by dotted key."""

    def __init__(self, section: Section) -> None:
        self.section = section
        self.globals = vars(sys.modules[section.cls.__module__])
        self.locals: dict[str, ast.expr] = {}

    def messages(self) -> Iterator[tuple[str, str]]:
        fn = self.section.cls.__dict__.get("check")
        if fn is None:
            return
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.locals[target.id] = node.value
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("require", "choice", "fail") or not node.args:
                continue
            prefix = self._checker_prefix(node.func.value)
            field = node.args[0]
            if prefix is None or not isinstance(field, ast.Constant):
                continue
            key = re.sub(r"\[[^\]]*\]", "[]", f"{prefix}{field.value}")
            if node.func.attr == "choice" and len(node.args) > 1:
                allowed = self._value(node.args[1])
                if isinstance(allowed, Mapping):
                    allowed = list(allowed)
                if isinstance(allowed, (list, tuple)):
                    yield key, "one of " + ", ".join(f"`{a}`" for a in allowed)
            else:
                index = 2 if node.func.attr == "require" else 1
                if len(node.args) > index:
                    text = self._message(node.args[index])
                    if text:
                        yield key, text

    def _checker_prefix(self, node: ast.expr) -> str | None:
        """The dotted prefix of the checker a call is made on (``c`` or ``c.at(...)``)."""
        if isinstance(node, ast.Name) and node.id == "c":
            return self.section.prefix
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "at"
            and node.args
        ):
            text = self._text(node.args[0])
            return None if _UNRESOLVED in text else text
        return None

    def _value(self, node: ast.expr) -> Any:
        """The value of an expression of module constants (no ``self``), else ``None``."""
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self._value(self.locals[node.id])
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if not names <= set(self.globals) | {"str", "len", "sorted", "list", "tuple"}:
            return None
        try:
            return eval(compile(ast.Expression(node), "<check>", "eval"), dict(self.globals))
        except Exception:  # an expression that needs the value checked
            return None

    def _text(self, node: ast.expr) -> str:
        """A message expression as text; what cannot be known statically is ``_UNRESOLVED``."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(self._text(v) for v in node.values)
        if isinstance(node, ast.FormattedValue):
            return self._text(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._text(node.left) + self._text(node.right)
        if isinstance(node, ast.Attribute) and ast.unparse(node) == "c.prefix":
            return self.section.prefix
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self._text(self.locals[node.id])
        value = self._value(node)
        if isinstance(value, (list, tuple)):
            return ", ".join(map(str, value))
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return str(value)
        return _UNRESOLVED

    def _message(self, node: ast.expr) -> str:
        """A problem text, less the parts that depend on the value checked."""
        text = self._text(node)
        text = re.sub(r" \([^()]*\x00[^()]*\)", "", text)
        parts = [p for p in text.split("; ") if _UNRESOLVED not in p]
        return "; ".join(parts)


# ------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------


def rst_to_markdown(text: str) -> str:
    """Docstring markup as Markdown: literals, roles, bullets."""
    text = re.sub(r":[a-z]+:`~?([^`<]+?)(?:\s*<[^>]+>)?`", r"`\1`", text)
    text = text.replace("``", "`")
    text = re.sub(r"^(\s*)\* ", r"\1- ", text, flags=re.M)
    return text


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return f"list of {type_name(arg)}"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def section_changes(value: Any, sub: type) -> str:
    """The defaults a field's own ``default_factory`` changes in section ``sub``, as YAML."""
    if not isinstance(value, sub):
        return ""
    plain = sub()
    changed = [
        f"`{f.name}: {yaml_value(getattr(value, f.name))}`"
        for f in dataclasses.fields(sub)
        if getattr(value, f.name) != getattr(plain, f.name)
    ]
    return ", ".join(changed)


def note_for(cls: type, name: str) -> str | None:
    for klass in cls.__mro__:
        note = NOTES.get(f"{klass.__qualname__}.{name}")
        if note is not None:
            return note.replace("{strategies}", ", ".join(f"`{n}`" for n in strategy_names()))
    return None


def wrap(text: str, first: str, width: int = 100) -> list[str]:
    return textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )


class Renderer:
    def __init__(self) -> None:
        self.core, self.strat = find_sections()
        self.anchors = {s.cls: s.anchor for s in [*self.core.values(), *self.strat.values()]}
        self.undocumented: list[str] = []
        self.checks: dict[tuple[type, str], list[str]] = {}
        for section in [*self.core.values(), *self.strat.values()]:
            for key, text in _Checks(section).messages():
                found = self.checks.setdefault((section.cls, key), [])
                if text not in found:
                    found.append(text)

    def checks_of(self, cls: type, key: str) -> list[str]:
        """What the checks of ``cls`` and its bases (and, for core keys, of every core
        section: ``ExperimentConfig`` checks keys across sections) say about ``key``."""
        owners = [k for k in cls.__mro__ if dataclasses.is_dataclass(k)]
        if not key.startswith("strategy."):
            owners += list(self.core)
        found: list[str] = []
        for owner in owners:
            for text in self.checks.get((owner, key), []):
                if text not in found:
                    found.append(text)
        return [t for t in found if not any(o != t and o.startswith(t) for o in found)]

    def field_line(self, section: Section, f: dataclasses.Field) -> list[str]:
        cls = section.cls
        key = f"{section.prefix}{f.name}"
        tp = typing.get_type_hints(cls)[f.name]
        sub = _section_type(tp)
        if sub is None:
            facts = [type_name(tp)]
        else:
            link = f"[{sub.__qualname__}](#{self.anchors[sub]})"
            facts = [f"list of {link}" if typing.get_origin(tp) is list else f"section {link}"]
            changed = section_changes(default_of(f), sub)
            if changed:
                facts.append(f"here {changed}")
        default = default_of(f)
        if sub is None and default is not dataclasses.MISSING:
            facts.append(f"default `{yaml_value(default)}`")
        limit = f.metadata.get("max")
        if limit is not None and limit != MAX_INT:
            facts.append(f"at most {limit}")
        facts += self.checks_of(cls, key)
        description = attribute_docs(cls).get(f.name) or note_for(cls, f.name)
        inherited = [
            k
            for k in cls.__mro__[1:]
            if dataclasses.is_dataclass(k) and f.name in k.__dict__.get("__annotations__", {})
        ]
        if sub is not None:
            pass
        elif inherited:
            base = inherited[0]
            link = f"[{base.__qualname__}](#{self.anchors.get(base, base.__qualname__.lower())})"
            description = f"{description or ''} This strategy's default; see {link}."
        elif description is None and f"``{f.name}``" not in (cls.__doc__ or ""):
            self.undocumented.append(f"{cls.__qualname__}.{f.name} ({key})")
        text = f"`{key}` ({'; '.join(facts)})"
        if description:
            text += ": " + rst_to_markdown(description.strip())
        return wrap(text, "- ")

    def section(self, section: Section) -> list[str]:
        cls = section.cls
        fields = section.own_fields
        if not fields:
            return []
        where = Path(inspect.getsourcefile(cls)).resolve().relative_to(ROOT).as_posix()
        keys = f"`{section.prefix}*`" if section.prefix else "top-level keys"
        lines = [f'<a id="{section.anchor}"></a>', ""]
        lines += [f"### {cls.__qualname__} ({keys})", ""]
        lines += [f"Declared in `{where}`; read by {', '.join(section.readers)}.", ""]
        doc = class_doc(cls)
        if doc:
            lines += [rst_to_markdown(doc), ""]
        for f in fields:
            lines += self.field_line(section, f)
        own = {f"{section.prefix}{f.name}" for f in fields}
        also = [
            (key, text)
            for (owner, key), texts in self.checks.items()
            if owner is cls and key.startswith(section.prefix) and key not in own
            for text in texts
            if key.startswith("strategy.")
        ]
        if also:
            lines += ["", "It also checks keys of its bases:", ""]
            for key, text in also:
                lines += wrap(f"`{key}`: {text}", "- ")
        return [*lines, ""]

    def overview(self) -> list[str]:
        lines = [
            "| `strategy.name` | client algorithm | `Config` | its parameter sections |",
            "|---|---|---|---|",
        ]
        for name in strategy_names():
            cls = strategies.strategy_class(name)
            parts = [
                f"[{k.__qualname__}](#{self.anchors[k]})"
                for k, s in self.strat.items()
                if name in s.readers and s.own_fields
            ]
            config = cls.Config.__qualname__
            row = f"| `{name}` | `{cls.client_algorithm}` | `{config}` | {', '.join(parts)} |"
            lines.append(row)
        return lines

    def weightings(self) -> list[str]:
        lines = [
            "`strategy.weighting` picks one of these (`fedgo_flwr/weighting/methods.py`); "
            "`strategy.weighting_params.<method>` sets its parameters, and what is not given "
            "takes the default below. Every method's pseudo-label accuracy is recorded each "
            "round (`pl_acc_<method>`), the variants' too (`pl_acc_<method>_<variant>`).",
            "",
            "| method | needs | parameters (defaults) | diagnostic variants | after |",
            "|---|---|---|---|---|",
        ]
        for m in WEIGHTING_METHODS.values():
            needs = ", ".join(f"`{r}`" for r in m.requires) or "-"
            params = ", ".join(f"`{k}: {yaml_value(v)}`" for k, v in m.defaults.items()) or "-"
            variants = ", ".join(f"`{v}`" for v in m.variants) or "-"
            lines.append(f"| `{m.name}` | {needs} | {params} | {variants} | {m.reference} |")
        return lines

    def render(self) -> str:
        lines = [
            "# Configuration",
            "",
            f"<!-- Generated by `{COMMAND}` from the configuration dataclasses"
            " (docs/gen_configuration.py); edit those, not this file. -->",
            "",
            INTRO,
            "## Core keys",
            "",
            "What every experiment has, whatever the strategy (`fedgo_flwr/experiment/config.py`).",
            "",
        ]
        for section in self.core.values():
            lines += self.section(section)
        lines += [
            "## Strategy parameters",
            "",
            "Each strategy reads the fields of its `Config` class, its base classes and their "
            "nested sections, all under `strategy.`. A section below is documented once, with "
            "the strategies that read it.",
            "",
            *self.overview(),
            "",
        ]
        for section in self.strat.values():
            lines += self.section(section)
        lines += ["## Weighting methods", "", *self.weightings(), ""]
        lines += [RULES.format(max_int=f"{MAX_INT:,}")]
        return "\n".join(lines).rstrip() + "\n"


def stale_notes() -> list[str]:
    """Entries of :data:`NOTES` that name no field of their class."""
    core, strat = find_sections()
    fields = {
        f"{s.cls.__qualname__}.{f.name}"
        for s in [*core.values(), *strat.values()]
        for f in dataclasses.fields(s.cls)
    }
    return sorted(set(NOTES) - fields)


def generate() -> tuple[str, list[str]]:
    """The Markdown text and the keys that have no description."""
    stale = stale_notes()
    if stale:
        raise SystemExit(f"NOTES names fields that do not exist: {', '.join(stale)}")
    renderer = Renderer()
    return renderer.render(), renderer.undocumented


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {TARGET.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text, undocumented = generate()
    if undocumented:
        print("keys without a description: " + ", ".join(undocumented), file=sys.stderr)
    if args.write:
        TARGET.write_text(text)
    else:
        sys.stdout.write(text)
    return 1 if undocumented else 0


if __name__ == "__main__":
    raise SystemExit(main())
