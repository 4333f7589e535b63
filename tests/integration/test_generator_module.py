"""FedGO's scenario G2 with any generator: ``strategy.generator.module`` (a user's factory).

The factories live in ``tests/generator_factories.py``. The refused configurations are in the
one table of them, :data:`tests/unit/test_config.py::REFUSED` (``generator-module-*``); here the
builder, the messages in detail, and tiny FedGO runs end to end (server and clients build the
same generator through :meth:`GeneratorConfig.build`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_RUN

from fedgo_app.cli import preflight
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.gan import build_generator, generator_from_config
from fedgo_flwr.gan.settings import GeneratorConfig
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
FILE = Path(__file__).resolve().parents[1] / "generator_factories.py"
MODULE = "generator_factories:factory"
TINY = [*TINY_RUN, "rounds=2"]
FEDGO = [
    "strategy.name=fedgo",
    "strategy.distill.epochs=2",
    "strategy.generator.steps=0",
    "strategy.discriminator.epochs=1",
    "data.alpha=1.0",
]


def config(*overrides: str):
    return load_experiment(ROOT / "conf/default.yaml", [*TINY, *FEDGO, *overrides])


def run(out: Path, *overrides: str) -> list[dict]:
    run_inprocess(config(f"output_dir={out}", *overrides))
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_factory_is_called_with_keywords_under_the_seed():
    gp = GeneratorConfig(module=MODULE, steps=0, latent_dim=5)
    state = torch.random.get_rng_state()
    g = gp.build((1, 8, 8), seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    assert (g.latent_dim, g.output_shape) == (5, (1, 8, 8))
    assert g(torch.randn(4, 5)).shape == (4, 1, 8, 8)
    assert same_state(g.state_dict(), gp.build((1, 8, 8), seed=3).state_dict())
    assert not same_state(g.state_dict(), gp.build((1, 8, 8), seed=4).state_dict())
    # The file form builds the same generator.
    by_file = GeneratorConfig(module=f"{FILE}:factory", steps=0, latent_dim=5)
    assert same_state(g.state_dict(), by_file.build((1, 8, 8), seed=3).state_dict())
    # Without a module: this project's generator of `name`, as before.
    own = generator_from_config(GeneratorConfig(width=4), (1, 8, 8), seed=3)
    ref = build_generator("dcgan", 100, (1, 8, 8), seed=3, width=4)
    assert same_state(own.state_dict(), ref.state_dict())


@pytest.mark.parametrize(
    ("module", "key", "fragments"),
    [
        (
            "no_such_module_for_fedgo:factory",
            "strategy.generator.module",
            ["cannot import 'no_such_module_for_fedgo'", "ModuleNotFoundError", "every client"],
        ),
        ("generator_factories:nope", "strategy.generator.module", ["has no attribute 'nope'"]),
        ("generator_factories:NOT_CALLABLE", "strategy.generator.module", ["not callable"]),
        ("generator_factories", "strategy.generator.module", ["must have the form"]),
        (
            "generator_factories:wrong_shape",
            "strategy.generator.module",
            ["has shape (2, 1, 16, 16)", "needs (2, 1, 8, 8)", "digits"],
        ),
        ("generator_factories:not_a_module", "strategy.generator.module", ["returned a str"]),
        ("generator_factories:broken", "strategy.generator.module", ["no weights here"]),
    ],
)
def test_a_bad_module_is_refused_naming_the_key(module, key, fragments):
    with pytest.raises(ConfigError) as info:
        preflight(config(f"strategy.generator.module={module}"))
    assert info.value.key == key
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("strategy", ["fedgo", "cpfl", "coboosting_fedgo"])
def test_every_strategy_with_a_generator_checks_the_module(strategy):
    overrides = [
        "rounds=1",
        "data.num_clients=4",
        f"strategy.name={strategy}",
        "strategy.generator.module=generator_factories:wrong_shape",
        "strategy.generator.steps=0",
    ]
    with pytest.raises(ConfigError, match="needs \\(2, 1, 8, 8\\)") as info:
        preflight(load_experiment(ROOT / "conf/default.yaml", overrides))
    assert info.value.key == "strategy.generator.module"
    overrides[3] = f"strategy.generator.module={MODULE}"
    preflight(load_experiment(ROOT / "conf/default.yaml", overrides))  # a right one passes


def test_a_module_is_not_trained():
    with pytest.raises(ConfigError, match="must be 0 with strategy.generator.module") as info:
        config(f"strategy.generator.module={MODULE}", "strategy.generator.steps=10")
    assert info.value.key == "strategy.generator.steps"


def test_a_state_file_that_does_not_fit_is_refused(tmp_path):
    bad = tmp_path / "dcgan.pt"
    torch.save(build_generator("dcgan", 100, (1, 8, 8), seed=0, width=4).state_dict(), bad)
    with pytest.raises(ConfigError, match="does not load into the generator") as info:
        preflight(config(f"strategy.generator.module={MODULE}", f"strategy.generator.path={bad}"))
    assert info.value.key == "strategy.generator.path"


def test_fedgo_runs_with_a_module_generator(tmp_path):
    """G2 + D1 with the factory's own weights, then G2 + D2 without server data from a state
    file: the clients build the module too (else no discriminator would load)."""
    rows = run(tmp_path / "own", f"strategy.generator.module={MODULE}")
    prefl = json.loads((tmp_path / "own" / "prefl.json").read_text())
    assert prefl["generator"] == {"source": "module (its own weights)", "module": MODULE}
    assert prefl["missing_discriminators"] == []
    assert np.isfinite(rows[-1]["test_loss"]) and "pl_acc_fedgo" in rows[-1]
    saved = torch.load(tmp_path / "own" / "generator.pt")
    expected = GeneratorConfig(module=MODULE, steps=0).build((1, 8, 8), seed=0).state_dict()
    assert saved.keys() == expected.keys()  # the factory's generator, not a dcgan

    weights = GeneratorConfig(module=MODULE, steps=0).build((1, 8, 8), seed=123).state_dict()
    torch.save(weights, tmp_path / "g.pt")
    rows = run(
        tmp_path / "file",
        f"strategy.generator.module={FILE}:factory",
        f"strategy.generator.path={tmp_path / 'g.pt'}",
        "data.server_fraction=0",
        "strategy.distill_data=generated",
        "strategy.generated_size=64",
    )
    prefl = json.loads((tmp_path / "file" / "prefl.json").read_text())
    assert prefl["generator"]["source"] == str(tmp_path / "g.pt")
    assert prefl["missing_discriminators"] == []
    assert same_state(torch.load(tmp_path / "file" / "generator.pt"), weights)
    assert rows[-1]["distill_steps"] == 2 and np.isfinite(rows[-1]["test_loss"])
