"""Config loading, overrides and validation: a bad value stops with key, value and source.

:data:`REFUSED` is the one table of every configuration that is refused, by the schema, by the
YAML loader or by the pre-flight check (``prepare``, run by ``run.sh`` and the ServerApp).
"""

from __future__ import annotations

import math
import pickle
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from fedgo_app.cli import main as cli_main
from fedgo_app.cli import preflight
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError, ExperimentConfig
from fedgo_flwr.config.names import DATASETS
from fedgo_flwr.config.schema import Checker, build_section
from fedgo_flwr.datafree import PlainBoost
from strategies import load_experiment, resolve, strategy_class
from strategies.coboosting import CoBoostingConfig

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
AGGREGATION = {
    "aggregation": {
        "rule": "consensus",
        "trim_fraction": 0.2,
        "clip_norm": None,
        "clip_factor": 10.0,
        "clip_keep": 3,
        "consensus_clip": 2.0,
        "radial_clip": 8.0,
        "upload_bound": 10.0,
        "discriminator_bound": 25.0,
        "teacher_array_bound": 50.0,
        "update_bound": 50.0,
        "weighted": False,
    }
}
"""The shared ``strategy.aggregation`` section at its defaults (every strategy has it)."""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_shipped_config_is_valid():
    files = sorted(CONF.rglob("*.yaml"))
    assert files, "conf/ holds no YAML files"
    for path in files:
        cfg = load_experiment(path)
        assert cfg.rounds >= 1, path


PAPER = CONF / "paper"
NOT_NAMED_FOR_A_STRATEGY = {"base.yaml", "default.yaml", "cifar10-jpg.yaml"}


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(CONF.glob("*.yaml")) if p.name not in NOT_NAMED_FOR_A_STRATEGY],
    ids=lambda p: p.name,
)
def test_every_strategy_file_runs_the_strategy_it_is_named_for(path):
    """conf/<strategy>[-<variant>].yaml runs <strategy>; the others say what they run in their
    first comment lines (checked below)."""
    assert load_experiment(path).strategy.name == path.stem.split("-")[0]


@pytest.mark.parametrize("name", sorted(NOT_NAMED_FOR_A_STRATEGY - {"base.yaml"}))
def test_the_other_files_name_their_strategy_in_their_header(name):
    header = (CONF / name).read_text().split("\nbase:")[0].lower()
    assert load_experiment(CONF / name).strategy.name in header


def test_a_paper_preset_without_its_data_stops_before_the_run_naming_data_path(tmp_path):
    cfg = load_experiment(PAPER / "fedgo-cifar10-a0.1.yaml", [f"data.path={tmp_path}"])
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert err.value.key == "data.path" and "download" in err.value.problem


@pytest.mark.parametrize("path", sorted(PAPER.glob("*.yaml")), ids=lambda p: p.name)
def test_paper_presets_say_what_they_run_and_pass_the_preflight(path, tmp_path):
    """conf/paper/<strategy>-<dataset>-a<alpha>.yaml runs that strategy on that setting; the
    pre-flight check passes with the CIFAR folders in place (no download)."""
    for name in ("cifar10", "cifar100"):
        (tmp_path / DATASETS[name].folder).mkdir()
    cfg = load_experiment(path, [f"data.path={tmp_path}"])
    preflight(cfg)
    strategy, dataset, alpha = re.fullmatch(
        r"([a-z_]+)(?:-d2|-g3)?-(cifar10|cifar100)-a([0-9.]+)", path.stem
    ).groups()
    assert cfg.strategy.name == strategy
    assert (cfg.data.dataset, cfg.data.alpha) == (dataset, float(alpha))
    assert (cfg.name, cfg.output_dir) == (path.stem, None)  # outputs/<name>/<date-time>
    if "-d2-" in path.stem or "-g3-" in path.stem:
        assert cfg.strategy.params.distill_data == "generated"


def test_fedgo_paper_presets_carry_the_papers_settings():
    """FedGO, ICML 2025, Sec. 4 and App. E.2, in every conf/paper/fedgo*.yaml."""

    def check(section, **expected):
        assert {k: getattr(section, k) for k in expected} == expected, name

    names = {p.stem for p in PAPER.glob("fedgo*.yaml")}
    assert {"fedgo-cifar10-a0.1", "fedgo-cifar10-a0.05", "fedgo-cifar100-a0.1"} <= names
    for name in sorted(names):
        cfg = load_experiment(PAPER / f"{name}.yaml")
        p = cfg.strategy.params
        check(cfg, rounds=100, fraction=0.4)
        g3 = "-g3-" in name  # App. F.5 / Table 9: data-free, 100 clients, FedGAN (T' 5, 3 epochs)
        if g3:
            check(cfg.data, num_clients=100, server_fraction=0, augment=True, alpha=0.05)
        else:
            check(cfg.data, num_clients=20, server_fraction=0.5, augment=True)
        check(cfg.model, name="resnet18")
        check(cfg.train, optimizer="adam", lr=1e-3, batch_size=64, local_epochs=30, weight_decay=0)
        check(p.distill, protocol="fedgo", epochs=10, lr=1e-3, batch_size=64, decay_rounds=100)
        assert p.distill.lr_decay, name  # cosine annealing until round T = 100
        # G1: WGAN-GP on the server's half, trained here (no file, no module); G3: FedGAN
        steps = 0 if g3 else 100_000
        check(p.generator, name="resnet", steps=steps, lr=2e-4, n_critic=5, gp_lambda=10)
        check(p.generator, batch_size=64, path=None, module=None)
        check(p.generator, federated_rounds=5 if g3 else 0)
        if g3:
            check(p.generator, local_epochs=3)
        check(p.discriminator, name="cnn4", epochs=30, lr=2e-4, batch_size=64)
        check(p.discriminator, loss="double_sigmoid")  # the output is two sigmoids (App. E.2)
        assert p.weighting == "fedgo", name
        assert p.weighting_params["fedgo"]["disc_mode"] == "double_sigmoid", name


PEER_SETTINGS = {  # FedGO, ICML 2025, App. E.2: the values each Table-3 peer ran with
    "fedprox": {"mu": 0.001},
    "feddisco": {"a": 0.5, "b": 0.1},
    "feduv": {"variance_weight": 2.5, "uniformity_weight": 0.5},
    "fedtgp": {"lam": 0.001, "tgp_epochs": 1000, "tgp_batch_size": 10, "tgp_lr": 0.005},
    "fedgkd_plus": {"buffer_length": 5, "temperature": 3.0, "gamma": 0.001, "kd_scale": "paper"},
    "feddf": {"weighting": "uniform"},
    "dafkd": {"weighting": "domain", "distill_data": "generated"},
    "central": {"epochs_per_round": 1},
    "scaffold": {"global_lr": 1.0},
}


@pytest.mark.parametrize("name", sorted(PEER_SETTINGS))
def test_peer_paper_presets_carry_fedgos_settings(name):
    cfg = load_experiment(PAPER / f"{name}-cifar10-a0.1.yaml")
    p = cfg.strategy.params
    assert {k: getattr(p, k) for k in PEER_SETTINGS[name]} == PEER_SETTINGS[name]
    assert (cfg.rounds, cfg.fraction, cfg.data.num_clients, cfg.data.server_fraction) == (
        100,
        0.4,
        20,
        0.5,
    )
    assert (cfg.model.name, cfg.train.optimizer, cfg.train.lr, cfg.train.local_epochs) == (
        "resnet18",
        "adam",
        1e-3,
        30,
    )
    if hasattr(p, "distill"):  # the KD rows share FedGO's server protocol
        d = p.distill
        assert (d.protocol, d.epochs, d.lr, d.batch_size, d.decay_rounds) == (
            "fedgo",
            10,
            1e-3,
            64,
            100,
        )


def test_the_longest_folder_name_is_a_name_and_control_characters_are_not():
    assert load_experiment(CONF / "default.yaml", ["name=" + "n" * 255]).name == "n" * 255
    with pytest.raises(ConfigError, match=r"name = 'a\\tb': holds the control character"):
        load_experiment(CONF / "default.yaml", ['name="a\\tb"', "output_dir=/tmp/x"])


def test_base_chain_and_overrides(tmp_path):
    base = write(tmp_path, "rounds: 3\ndata: {alpha: 0.5, num_clients: 4}\n", "base.yaml")
    child = write(
        tmp_path, f"base: {base.name}\ndata: {{alpha: 0.2}}\nstrategy: {{name: fedprox}}\n"
    )
    cfg = load_experiment(child, ["seed=3", "strategy.mu=0.1", "data.num_clients=5"])
    assert (cfg.rounds, cfg.seed) == (3, 3)
    assert (cfg.data.alpha, cfg.data.num_clients) == (0.2, 5)
    assert cfg.strategy.name == "fedprox" and cfg.strategy.raw_params == {"mu": 0.1, **AGGREGATION}


def test_swapping_strategy_is_one_override():
    cfg = load_experiment(CONF / "default.yaml", "strategy.name=scaffold data.alpha=0.05 seed=3")
    assert cfg.strategy.name == "scaffold"
    assert cfg.strategy.raw_params == {  # defaults filled in
        "global_lr": 1.0,
        "weighted": False,
        "max_control_delta_norm": 1e6,
        **AGGREGATION,
    }
    assert cfg.data.alpha == 0.05


def test_roundtrip_through_json():
    cfg = load_experiment(CONF / "fedprox.yaml")
    again = ExperimentConfig.from_json(cfg.to_json())
    # the core config leaves them untyped
    assert again.strategy.params == {"mu": 0.01, **AGGREGATION}
    assert again.to_dict() == cfg.to_dict()
    assert resolve(again) == cfg


# ------------------------------------------------------------------------------------------
# THE table of refused configurations. Every refused case goes here: `prepare` exits with
# `code` and one message naming `key` (and the file or override it came from) and containing
# `fragment`; loading plus the pre-flight check raise a ConfigError for exactly `key`.
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """One refused configuration.

    ``text``: the YAML file's content (``{conf}`` stands for the shipped ``conf/`` folder and
    ``{tmp}`` for an empty temporary folder); ``None`` uses ``conf/<conf>`` (``nope.yaml``: a
    file that does not exist). ``overrides``: given on the command line (``{tmp}`` filled in
    too). ``where``: the message names the ``override``, the ``file``, or ``""`` (not checked).
    """

    key: str
    fragment: str
    overrides: tuple[str, ...] = ()
    text: str | bytes | None = None
    conf: str = "default.yaml"
    where: str = "override"
    code: int = 2


BIG = "9" * 5000  # more digits than Python turns into an int
DEEP = "[" * 50_000  # deeper than any recursive parser goes
NOT_FINITE = "must be a finite number"
FACTORIES = "{conf}/../tests/generator_factories.py"  # generator factories, the file form
ALIAS_BOMB = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
)  # 10^9 values in 1 kB

REFUSED = {
    # -- values out of range: each error names its own key ----------------------------------
    "alpha-0": Refused("data.alpha", "must be > 0", ("data.alpha=0",)),
    "alpha-neg": Refused("data.alpha", "must be > 0", ("data.alpha=-1",)),
    "fraction": Refused("fraction", "(0, 1]", ("fraction=1.5",)),
    "min-clients": Refused("min_clients", "<= data.num_clients", ("min_clients=50",)),
    "num-clients-0": Refused("data.num_clients", "must be >= 1", ("data.num_clients=0",)),
    "gp-lambda": Refused(
        "strategy.generator.gp_lambda",
        "must be >= 0",
        ("strategy.generator.gp_lambda=-1",),
        conf="fedgo.yaml",
    ),
    "disc-batch": Refused(
        "strategy.discriminator.batch_size",
        "must be >= 1",
        ("strategy.discriminator.batch_size=0",),
        conf="fedgo.yaml",
    ),
    "temperature": Refused(
        "strategy.distill.temperature",
        "must be > 0",
        ("strategy.distill.temperature=-1",),
        conf="fedgo.yaml",
    ),
    "mu-in-file": Refused(
        "strategy.mu",
        "strategy.mu = -1.0: must be >= 0",
        text="strategy: {name: fedprox, mu: -1}\n",
        where="file",
    ),
    "alpha-in-file": Refused(
        "data.alpha",
        "data.alpha = -0.5",
        text="base: {conf}/base.yaml\ndata:\n  alpha: -0.5\n",
        where="file",
    ),
    "gp-lambda-in-file": Refused(
        "strategy.generator.gp_lambda",
        "must be >= 0",
        text="base: {conf}/fedgo.yaml\nstrategy: {generator: {gp_lambda: -1}}\n",
        where="file",
    ),
    # -- names and types --------------------------------------------------------------------
    # names that cannot be a folder: each refused at the check, naming its key (issue 49)
    "name-too-long": Refused("name", "at most 255 bytes", ("name=" + "n" * 300,)),
    "name-256": Refused("name", "at most 255 bytes", ("name=" + "n" * 256,)),
    "name-dot-dot": Refused("name", "plain folder name", ("name='..'",)),
    "name-slash": Refused("name", "plain folder name", ("name=a/b",)),
    "name-newline": Refused(
        "name", "control character '\\n'", ('name="a\\nb"', "output_dir={tmp}")
    ),
    "output-dir-newline": Refused(
        "output_dir", "control character '\\n'", ('output_dir="{tmp}/a\\nb"',)
    ),
    "output-dir-nul": Refused(
        "output_dir", "control character '\\x00'", ('output_dir="{tmp}/a\\0b"',)
    ),
    "output-dir-escape": Refused(
        "output_dir", "control character '\\x1b'", ('output_dir="{tmp}/a\\eb"',)
    ),
    "output-dir-long-part": Refused(
        "output_dir", "component of 300 bytes", ("output_dir={tmp}/" + "d" * 300,)
    ),
    "strategy-name": Refused("strategy.name", "unknown", ("strategy.name=fedfoo",)),
    "dataset": Refused("data.dataset", "unknown", ("data.dataset=mnist3",)),
    "model": Refused("model.name", "unknown", ("model.name=resnet7",)),
    "client-model": Refused(
        "model.client_models[1]", "unknown", ("model.client_models=[cnn, resnet7]",)
    ),
    "client-models-str": Refused(
        "model.client_models", "must be a list", ("model.client_models=cnn",)
    ),
    "client-model-int": Refused(
        "model.client_models[0]", "must be str", ("model.client_models=[3]",)
    ),
    "client-models-long": Refused(
        "model.client_models",
        "more than data.num_clients (2)",
        ("data.num_clients=2", "model.client_models=[cnn, cnn, cnn]"),
    ),
    "client-models-fedavg": Refused(
        "model.client_models", "fedavg", ("model.client_models=[cnn, mlp]",)
    ),
    "client-models-fedgkd-plus": Refused(
        "model.client_models",
        "fedgkd_plus",
        ("strategy.name=fedgkd_plus", "model.client_models=[mlp]"),
    ),
    "optimizer": Refused("train.optimizer", "unknown", ("train.optimizer=rmsprop",)),
    "device-name": Refused("device", "auto, cpu", ("device=gpu0",)),
    "device-digits": Refused("device", "auto, cpu", (f"device=cuda:{BIG}",)),
    "rounds-str": Refused("rounds", "must be int", ("rounds=ten",)),
    "typo": Refused("data.alph", "did you mean 'data.alpha'", ("data.alph=0.1",)),
    "other-param": Refused("strategy.muu", "not a parameter of fedavg", ("strategy.muu=0.1",)),
    # -- numbers: no inf or NaN in any float key, no absurd integers ---------------------------
    "lr-inf": Refused("train.lr", NOT_FINITE, ("train.lr=.inf",)),
    "lr-nan": Refused("train.lr", NOT_FINITE, ("train.lr=.nan",)),
    "alpha-inf": Refused("data.alpha", NOT_FINITE, ("data.alpha=.inf",)),
    "timeout-inf": Refused("round_timeout", NOT_FINITE, ("round_timeout=.inf",)),
    "timeout-huge": Refused("round_timeout", "must be <= ", ("round_timeout=1.0e+12",)),
    "gpus-inf": Refused("resources.client_gpus", NOT_FINITE, ("resources.client_gpus=.inf",)),
    "server-cpus-waiting": Refused(
        "resources.server_cpus_waiting", "must be >= 1", ("resources.server_cpus_waiting=0",)
    ),
    "precision": Refused("resources.precision", "fp32, bf16", ("resources.precision=fp16",)),
    "local-workers-zero": Refused(
        "resources.local_workers", "auto or an integer >= 1", ("resources.local_workers=0",)
    ),
    "local-workers-word": Refused(
        "resources.local_workers", "auto or an integer >= 1", ("resources.local_workers=many",)
    ),
    "deterministic-int": Refused(
        "resources.deterministic", "must be bool", ("resources.deterministic=1",)
    ),
    "decay-nan": Refused("train.weight_decay", NOT_FINITE, ("train.weight_decay=.nan",)),
    "fault-seconds-nan": Refused(
        "faults[0].seconds", NOT_FINITE, ("faults=[{kind: hang, seconds: .nan}]",)
    ),
    "mu-inf": Refused("strategy.mu", NOT_FINITE, ("strategy.mu=.inf",), conf="fedprox.yaml"),
    "distill-lr-inf": Refused(
        "strategy.distill.lr", NOT_FINITE, ("strategy.distill.lr=.inf",), conf="feddf.yaml"
    ),
    "gp-lambda-nan": Refused(
        "strategy.generator.gp_lambda",
        NOT_FINITE,
        ("strategy.generator.gp_lambda=.nan",),
        conf="fedgo.yaml",
    ),
    "weighting-param-inf": Refused(
        "strategy.weighting_params.entropy",
        "finite",
        ("strategy.weighting_params={entropy: {temperature: .inf}}",),
        conf="feddf.yaml",
    ),
    "float-1e400": Refused("train.lr", NOT_FINITE, ("train.lr=1.0e+400",)),
    "float-digits": Refused("train.lr", "too many digits", ("train.lr=" + "9" * 400,)),
    "float-as-text": Refused("train.lr", "signed exponent", ("train.lr=1e-3",)),
    "float-in-file": Refused("data.alpha", NOT_FINITE, text="data: {alpha: .inf}\n", where="file"),
    "clients-1e10": Refused("data.num_clients", "must be <= ", ("data.num_clients=10000000000",)),
    "rounds-1e21": Refused("rounds", "must be <= ", ("rounds=1000000000000000000000",)),
    "epochs-huge": Refused("train.local_epochs", "must be <= ", ("train.local_epochs=10000000",)),
    "steps-huge": Refused(
        "strategy.generator.steps",
        "must be <= ",
        ("strategy.generator.steps=10000000",),
        conf="fedgo.yaml",
    ),
    "seed-huge": Refused("seed", "must be <= ", (f"seed={2**64}",)),
    "digits-override": Refused("rounds", "too many digits", (f"rounds={BIG}",)),
    "digits-in-file": Refused("rounds", "too many digits", text=f"rounds: {BIG}\n", where="file"),
    # -- files that are not a configuration ---------------------------------------------------
    "missing-file": Refused("config", "file not found", conf="nope.yaml", where=""),
    "bad-yaml": Refused("config", "not valid YAML", text="rounds: [1,\n", where=""),
    "bad-yaml-line": Refused(
        "config",
        "not valid YAML at line 2, column 4 ('x: [1'): mapping values are not allowed here",
        text="rounds: 3\n  x: [1\n",
        where="file",
    ),
    "missing-base": Refused("base", "file not found", text="base: nothere.yaml\n", where="file"),
    "binary": Refused("config", "not a UTF-8 text file", text=bytes(range(256)) * 8, where=""),
    "deep-file": Refused("config", "nested too deeply", text=f"rounds: {DEEP}\n", where=""),
    "deep-override": Refused("rounds", "nested too deeply", (f"rounds={DEEP}",)),
    "deep-60": Refused(
        "config", "nested too deeply", text=f"rounds: {'[' * 60}{']' * 60}\n", where=""
    ),
    "alias-bomb": Refused("config", "too large", text=ALIAS_BOMB, where=""),
    "empty": Refused("config", "empty", text="", where=""),
    "only-comments": Refused("config", "empty", text="# nothing here\n\n", where=""),
    "duplicate": Refused("rounds", "duplicate key", text="rounds: 3\nrounds: 5\n", where="file"),
    "duplicate-nested": Refused(
        "data.alpha", "duplicate key", text="data:\n  alpha: 1\n  alpha: 2\n", where="file"
    ),
    "duplicate-override": Refused("data.alpha", "duplicate key", ("data={alpha: 1, alpha: 2}",)),
    "circular-base": Refused("base", "circular", text="base: exp.yaml\n", where=""),
    "override-syntax": Refused("override", "expected dotted.key=value", ("rounds",), where=""),
    # -- pre-flight: files, the machine, and what the strategy needs ---------------------------
    "imagefolder": Refused(
        "data.path", "no train/ folder", ("data.dataset=imagefolder", "data.path={tmp}")
    ),
    "cifar-missing": Refused(
        "data.path",
        "cifar-10-batches-py",
        ("data.dataset=cifar10", "data.path={tmp}", "data.download=false"),
    ),
    "generator-path": Refused(
        "strategy.generator.path",
        "not found",
        ("strategy.generator.path={tmp}/g.pt",),
        conf="fedgo.yaml",
    ),
    # strategy.generator.module: G2 with the user's factory (tests/generator_factories.py)
    "generator-module-import": Refused(
        "strategy.generator.module",
        "cannot import 'no_such_module_for_fedgo': ModuleNotFoundError",
        (
            "strategy.generator.module=no_such_module_for_fedgo:factory",
            "strategy.generator.steps=0",
        ),
        conf="fedgo.yaml",
    ),
    "generator-module-attribute": Refused(
        "strategy.generator.module",
        "has no attribute 'nope'",
        (f"strategy.generator.module={FACTORIES}:nope", "strategy.generator.steps=0"),
        conf="fedgo.yaml",
    ),
    "generator-module-not-callable": Refused(
        "strategy.generator.module",
        "is not callable",
        (f"strategy.generator.module={FACTORIES}:NOT_CALLABLE", "strategy.generator.steps=0"),
        conf="fedgo.yaml",
    ),
    "generator-module-shape": Refused(
        "strategy.generator.module",
        "has shape (2, 1, 16, 16); the classifier's input needs (2, 1, 8, 8)",
        (f"strategy.generator.module={FACTORIES}:wrong_shape", "strategy.generator.steps=0"),
        conf="fedgo.yaml",
    ),
    "generator-module-trained": Refused(
        "strategy.generator.steps",
        "must be 0 with strategy.generator.module",
        (f"strategy.generator.module={FACTORIES}:factory",),
        conf="fedgo.yaml",
        where="file",  # conf/fedgo.yaml sets steps: 300
    ),
    "discriminator-path": Refused(
        "strategy.discriminator.path",
        "not found",
        ("strategy.discriminator.path={tmp}/d.pt",),
        conf="fedgo.yaml",
    ),
    "feddf-no-server-data": Refused(
        "data.server_fraction", "feddf", ("strategy.name=feddf", "data.server_fraction=0")
    ),
    "fedgo-no-server-data": Refused(
        "data.server_fraction", "fedgo", ("data.server_fraction=0",), conf="fedgo.yaml"
    ),
    "fedgo-d2-no-server-data-no-generator": Refused(
        "strategy.generator.path",
        "no server data to train the generator",
        ("data.server_fraction=0", "strategy.distill_data=generated"),
        conf="fedgo.yaml",
        where="",  # the key is not set: its default is the problem
    ),
    "fedgo-d2-no-server-data-feddf-protocol": Refused(
        "strategy.distill.protocol",
        "fedgo protocol",
        (
            "data.server_fraction=0",
            "strategy.distill_data=generated",
            "strategy.generator.steps=0",
            "strategy.distill.protocol=feddf",
            "strategy.val_fraction=0.1",
        ),
        conf="fedgo.yaml",
    ),
    "fedgo-byzantine-negative": Refused(
        "strategy.byzantine", ">= 0", ("strategy.byzantine=-1",), conf="fedgo.yaml"
    ),
    "fedgo-byzantine-too-many": Refused(
        "strategy.byzantine",
        "at most data.num_clients",
        ("strategy.byzantine=99",),
        conf="fedgo.yaml",
    ),
    "fedgo-clip-negative": Refused(
        "strategy.weighting_params.fedgo",
        "clip must be a finite number > 0",
        ("strategy.weighting_params={fedgo: {clip: -1}}",),
        conf="fedgo.yaml",
        where="",  # merged into conf/fedgo.yaml's own weighting_params.fedgo
    ),
    "disc-reference-unknown": Refused(
        "strategy.discriminator.reference",
        "generator",
        ("strategy.discriminator.reference=noise",),
        conf="fedgo.yaml",
    ),
    "disc-mixture-1": Refused(
        "strategy.discriminator.mixture",
        "(0, 1)",
        ("strategy.discriminator.mixture=1.0",),
        conf="fedgo.yaml",
    ),
    "disc-reference-size-negative": Refused(
        "strategy.discriminator.reference_size",
        ">= 0",
        ("strategy.discriminator.reference_size=-5",),
        conf="fedgo.yaml",
    ),
    "disc-label-smoothing": Refused(
        "strategy.discriminator.label_smoothing",
        "[0, 0.5)",
        ("strategy.discriminator.label_smoothing=0.5",),
        conf="fedgo.yaml",
    ),
    "disc-patience-negative": Refused(
        "strategy.discriminator.patience",
        ">= 0",
        ("strategy.discriminator.patience=-1",),
        conf="fedgo.yaml",
    ),
    "disc-holdout-1": Refused(
        "strategy.discriminator.holdout",
        "(0, 1)",
        ("strategy.discriminator.holdout=1",),
        conf="fedgo.yaml",
    ),
    "disc-server-reference-no-server-data": Refused(
        "strategy.discriminator.reference",
        "data.server_fraction 0 leaves none",
        (
            "data.server_fraction=0",
            "strategy.distill_data=generated",
            "strategy.generator.steps=0",
            "strategy.discriminator.reference=server",
        ),
        conf="fedgo.yaml",
    ),
    "fedgo-temperature-0": Refused(
        "strategy.weighting_params.fedgo",
        "temperature must be a finite number > 0",
        ("strategy.weighting_params={fedgo: {temperature: 0}}",),
        conf="fedgo.yaml",
        where="",
    ),
    "coboosting-fedgo-server-reference": Refused(
        "strategy.discriminator.reference",
        "one-shot",
        ("strategy.name=coboosting_fedgo", "strategy.discriminator.reference=mixture"),
        conf="coboosting.yaml",
    ),
    "g3-rounds-negative": Refused(
        "strategy.generator.federated_rounds",
        ">= 0",
        ("strategy.generator.federated_rounds=-1",),
        conf="fedgo.yaml",
    ),
    "g3-local-epochs-0": Refused(
        "strategy.generator.local_epochs",
        ">= 1",
        ("strategy.generator.local_epochs=0",),
        conf="fedgo.yaml",
    ),
    "g3-with-server-steps": Refused(
        "strategy.generator.steps",
        "FedGAN at the clients",
        ("strategy.generator.federated_rounds=5",),
        conf="fedgo.yaml",
        where="",  # steps is conf/fedgo.yaml's
    ),
    "g3-with-path": Refused(
        "strategy.generator.path",
        "must be unset with strategy.generator.federated_rounds",
        (
            "strategy.generator.federated_rounds=5",
            "strategy.generator.steps=0",
            "strategy.generator.path=g.pt",
        ),
        conf="fedgo.yaml",
    ),
    "g3-one-shot": Refused(
        "strategy.generator.federated_rounds",
        "one-shot",
        (
            "strategy.name=coboosting_fedgo",
            "strategy.generator.federated_rounds=2",
            "strategy.generator.steps=0",
        ),
        conf="coboosting.yaml",
    ),
    # -- the Table-3 peers (issue 16) ----------------------------------------------------------
    "feduv-bandwidth": Refused(
        "strategy.bandwidth", "unknown", ("strategy.bandwidth=mean",), conf="feduv.yaml"
    ),
    "feduv-negative-weight": Refused(
        "strategy.variance_weight", ">= 0", ("strategy.variance_weight=-1",), conf="feduv.yaml"
    ),
    "feddisco-metric": Refused(
        "strategy.metric", "unknown", ("strategy.metric=js",), conf="feddisco.yaml"
    ),
    "feddisco-a-negative": Refused(
        "strategy.a", ">= 0", ("strategy.a=-0.5",), conf="feddisco.yaml"
    ),
    "fedgkd-buffer-0": Refused(
        "strategy.buffer_length", "[1, 100]", ("strategy.buffer_length=0",), conf="fedgkd.yaml"
    ),
    "fedgkd-scale": Refused(
        "strategy.kd_scale", "unknown", ("strategy.kd_scale=both",), conf="fedgkd.yaml"
    ),
    "fedgkd-val-loss-votes": Refused(
        "strategy.vote_weights",
        "labelled validation split",
        ("strategy.teacher=all", "strategy.vote_weights=val_loss"),
        conf="fedgkd.yaml",
    ),
    "fedgkd-plus-val-loss-without-split": Refused(
        "strategy.val_fraction",
        "labelled validation split",
        ("strategy.teacher=all", "strategy.vote_weights=val_loss"),
        conf="fedgkd_plus.yaml",
        where="",
    ),
    "fedgkd-in-cpfl": Refused(
        "strategy.local_algorithm",
        "server-side state",
        ("strategy.local_algorithm=fedgkd",),
        conf="cpfl.yaml",
    ),
    "fedtgp-epochs-negative": Refused(
        "strategy.tgp_epochs", ">= 0", ("strategy.tgp_epochs=-1",), conf="fedtgp.yaml"
    ),
    "fedtgp-distance": Refused(
        "strategy.distance", "unknown", ("strategy.distance=cosine",), conf="fedtgp.yaml"
    ),
    "dafkd-distill-data": Refused(
        "strategy.distill_data", "unknown", ("strategy.distill_data=public",), conf="dafkd.yaml"
    ),
    "dafkd-gp-norm": Refused(
        "strategy.gp_norm", "unknown", ("strategy.gp_norm=pixel",), conf="dafkd.yaml"
    ),
    "dafkd-generator": Refused(
        "strategy.generator.name", "unknown", ("strategy.generator.name=gan",), conf="dafkd.yaml"
    ),
    "dafkd-federated-generator": Refused(
        "strategy.generator.federated_rounds",
        "trained with the clients' models",
        ("strategy.generator.federated_rounds=2",),
        conf="dafkd.yaml",
    ),
    "dafkd-validation-on-generated": Refused(
        "strategy.val_fraction", "generated", ("strategy.val_fraction=0.1",), conf="dafkd.yaml"
    ),
    "dafkd-server-data-missing": Refused(
        "data.server_fraction",
        "must be > 0",
        ("strategy.distill_data=server", "data.server_fraction=0"),
        conf="dafkd.yaml",
    ),
    "feddf-distill-size-0": Refused(
        "strategy.distill_size", ">= 1", ("strategy.distill_size=0",), conf="feddf.yaml"
    ),
    "feddf-public-with-validation": Refused(
        "strategy.val_fraction",
        "no labels",
        ("data.public_path={tmp}", "strategy.val_fraction=0.1"),
        conf="feddf.yaml",
    ),
    "fedgo-d2-public": Refused(
        "data.public_path",
        "generated data",
        ("data.public_path={tmp}", "strategy.distill_data=generated"),
        conf="fedgo.yaml",
    ),
    "central-epochs-0": Refused(
        "strategy.epochs_per_round", ">= 1", ("strategy.epochs_per_round=0",), conf="central.yaml"
    ),
    "cuda-missing": Refused("device", "CUDA device", ("device=cuda:999",)),
    # -- data.partition and its keys (the split is drawn by the pre-flight check) ---------------
    "partition-name": Refused("data.partition", "unknown", ("data.partition=dir",)),
    "sigma-negative": Refused(
        "data.quantity_sigma",
        "must be >= 0",
        ("data.partition=dirichlet_prior", "data.quantity_sigma=-0.5"),
    ),
    "sigma-other-scheme": Refused(
        "data.quantity_sigma", "only data.partition: dirichlet_prior", ("data.quantity_sigma=0.5",)
    ),
    "classes-missing": Refused(
        "data.classes_per_client", "needs it", ("data.partition=classes",), where=""
    ),
    "classes-0": Refused(
        "data.classes_per_client",
        "must be >= 1",
        ("data.partition=classes", "data.classes_per_client=0"),
    ),
    "classes-other-scheme": Refused(
        "data.classes_per_client", "only used by", ("data.classes_per_client=2",)
    ),
    "classes-too-many": Refused(
        "data.classes_per_client",
        "more than the 10 classes",
        ("data.partition=classes", "data.classes_per_client=11"),
    ),
    "classes-too-few": Refused(
        "data.classes_per_client",
        "some class would have no client",
        ("data.partition=classes", "data.classes_per_client=1", "data.num_clients=5"),
    ),
    "prior-min-size": Refused(
        "data.min_client_size",
        "could not draw LogNormal(sigma=3.0) client amounts",
        ("data.partition=dirichlet_prior", "data.quantity_sigma=3", "data.min_client_size=20"),
    ),
}


def _materialise(case: Refused, tmp_path: Path) -> tuple[Path, list[str]]:
    """The config file and the overrides of ``case``, placeholders filled in."""
    folder = tmp_path / "folder"
    folder.mkdir(exist_ok=True)

    def fill(s: str) -> str:
        return s.replace("{conf}", str(CONF)).replace("{tmp}", str(folder))

    path = tmp_path / "exp.yaml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    elif case.text is not None:
        path.write_text(fill(case.text))
    elif case.conf == "nope.yaml":
        path = tmp_path / "nope.yaml"
    else:
        path = CONF / case.conf
    return path, [fill(o) for o in case.overrides]


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_refused(case: Refused, tmp_path, capsys):
    path, overrides = _materialise(case, tmp_path)
    with pytest.raises(ConfigError) as info:
        preflight(load_experiment(path, overrides))
    err = info.value
    message = str(err)
    assert err.key == case.key, message
    assert case.fragment in message
    assert "\n" not in message, message  # one line
    typed = dict(o.partition("=")[::2] for o in overrides)
    if typed.get(case.key, "null") not in ("null", "~", ""):  # the value typed is echoed
        assert f"{case.key} = None" not in message, message
    assert len(message) < 1000  # a 5000-digit value is not printed whole
    if case.where == "override":
        assert any(f"override '{o[:40]}" in message for o in overrides), message
    elif case.where == "file":
        assert str(path) in message
    # The same through `prepare` (what run.sh calls): the exit code and one line, no traceback.
    run_toml = tmp_path / "run.toml"
    code = cli_main(["prepare", str(path), *overrides, "--run-toml", str(run_toml)])
    assert code == case.code
    stderr = capsys.readouterr().err
    assert case.key in stderr and case.fragment in stderr
    assert "Traceback" not in stderr
    assert not run_toml.exists()


@dataclass
class _Section:
    x: float = 0.0
    y: float = field(default=0.0, metadata={"nonfinite": True})
    n: int = field(default=0, metadata={"max": 10})

    def check(self, c: Checker) -> None:
        c.require("x", not self.x < 0, "must not be < 0")  # NaN-blind on purpose


def test_schema_numbers_and_field_overrides():
    assert build_section(_Section, {"y": math.inf, "n": 10}).y == math.inf  # opted in
    with pytest.raises(ConfigError, match=r"^s.x = nan: must be a finite number"):
        build_section(_Section, {"x": math.nan}, "s.")
    with pytest.raises(ConfigError, match=r"^s.n = 11: must be <= 10$"):
        build_section(_Section, {"n": 11}, "s.")
    with pytest.raises(ConfigError, match=r"^s.x = nan: must not be < 0$"):
        Checker(prefix="s.", obj=_Section(x=math.nan)).require("x", True, "must not be < 0")


def test_preflight_refuses_a_cuda_index_past_the_last_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = load_experiment(CONF / "default.yaml", ["device=cuda:3"])
    with pytest.raises(ConfigError, match=r"device = 'cuda:3': no CUDA device 3 .*has 2"):
        preflight(cfg)
    preflight(load_experiment(CONF / "default.yaml", ["device=cuda:1"]))  # exists: accepted


def test_preflight_accepts_what_exists(tmp_path):
    from torchvision import datasets

    assert DATASETS["cifar10"].folder == datasets.CIFAR10.base_folder
    assert DATASETS["cifar100"].folder == datasets.CIFAR100.base_folder
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "g.pt").write_bytes(b"")
    (tmp_path / "d.pt").write_bytes(b"")
    overrides = [
        f"strategy.generator.path={tmp_path / 'g.pt'}",
        f"strategy.discriminator.path={tmp_path / 'd.pt'}",
        "data.dataset=cifar10",
        f"data.path={tmp_path}",
    ]
    preflight(load_experiment(CONF / "fedgo.yaml", overrides))
    preflight(load_experiment(CONF / "default.yaml", ["data.server_fraction=0"]))  # FedAvg: fine


def test_the_server_app_runs_the_preflight(tmp_path):
    cfg = load_experiment(
        CONF / "fedgo.yaml",
        [f"strategy.generator.path={tmp_path / 'missing.pt'}", f"output_dir={tmp_path / 'out'}"],
    )
    with pytest.raises(ConfigError, match="strategy.generator.path"):
        run_inprocess(cfg)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_finite_and_bounded_numbers_are_still_accepted():
    overrides = ["train.lr=1.0e-6", "round_timeout=86400", "seed=4294967295", "rounds=1000000"]
    cfg = load_experiment(CONF / "default.yaml", overrides)
    assert (cfg.seed, cfg.rounds, cfg.round_timeout) == (4294967295, 1_000_000, 86400.0)


def test_yaml_anchors_and_merge_keys_still_work(tmp_path):
    path = write(
        tmp_path,
        "data: {<<: &d {alpha: 0.3, num_clients: 5}, alpha: 0.2}\n"  # an explicit key wins
        "train: {lr: &lr 0.01}\nstrategy: {name: fedprox, mu: *lr}\n",
    )
    cfg = load_experiment(path)
    assert (cfg.data.alpha, cfg.data.num_clients) == (0.2, 5)
    assert cfg.train.lr == cfg.strategy.params.mu == 0.01


def test_cli_prepare_writes_run_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDGO_WORKDIR", str(tmp_path))  # its run folder: outputs/default/...
    run_toml = tmp_path / "run.toml"
    code = cli_main(["prepare", str(CONF / "default.yaml"), "seed=4", "--run-toml", str(run_toml)])
    assert code == 0
    out = capsys.readouterr().out.strip()
    assert "num-supernodes=20" in out and "client-resources-num-cpus=1" in out
    run = tomllib.loads(run_toml.read_text())
    assert load_experiment(run["config"], run["overrides"]).seed == 4


def test_swapping_strategy_drops_other_strategies_params(caplog):
    cfg = load_experiment(CONF / "fedgo.yaml", ["strategy.name=fedavg"])
    assert cfg.strategy.name == "fedavg" and cfg.strategy.raw_params == AGGREGATION
    assert "strategy.distill ignored" in caplog.text
    overrides = ["strategy.name=feddf", "strategy.weighting=entropy"]
    cfg = load_experiment(CONF / "fedgo.yaml", overrides)
    assert cfg.strategy.params.distill.epochs == 5  # shared parameters are kept
    assert "generator" not in cfg.strategy.raw_params


BASELINE_SYNTHESIS = {
    "dense": {"source": "generator", "hardness": 0.0, "adv_mask": True, "adv_temperature": 3.0},
    "fadi": {"source": "pixels", "lr": 0.05, "hardness": 0.0, "bn_weight": 1.0, "tv_weight": 1e-3},
}
"""Each data-free baseline's synthesis defaults (``strategies/dense.py``, ``fadi.py``)."""


@pytest.mark.parametrize("name", sorted(BASELINE_SYNTHESIS))
def test_a_data_free_baselines_config_keeps_its_defaults_under_a_yaml_section(name):
    """DENSE's and F-ADI's ``Config`` come from one declaration
    (:func:`strategies.coboosting.baseline_config`): Co-Boosting's parameters with the boost
    off and the baseline's synthesis defaults, which a YAML ``synthesis`` section
    (``conf/coboosting.yaml`` sets its batch size and steps) keeps for every key it does not
    set; the parameters survive a pickle (the class is found where the module assigns it)."""
    cfg = load_experiment(CONF / "coboosting.yaml", [f"strategy.name={name}"])
    p = cfg.strategy.params
    assert type(p) is strategy_class(name).Config and isinstance(p, CoBoostingConfig)
    assert type(p.boost) is PlainBoost and (p.boost.reweight, p.boost.diversify) == (False, False)
    assert (p.synthesis.batch_size, p.synthesis.steps, p.boost.batch_size) == (64, 10, 64)
    for key, value in BASELINE_SYNTHESIS[name].items():
        assert getattr(p.synthesis, key) == value, key
    assert pickle.loads(pickle.dumps(p)) == p
