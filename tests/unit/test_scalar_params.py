"""Client algorithms declared by scalar parameters (``fedgo_flwr/protocol/scalars.py``): the
built ``Config`` checks its bounds on both sides, names the key, and documents itself."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

import clients
import strategies
from fedgo_flwr.config.schema import ConfigError, build_section
from fedgo_flwr.protocol import declaration
from fedgo_flwr.protocol.scalars import SCALAR_ALGORITHMS, Param, parameters
from strategies import load_experiment

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize(
    "override, problem",
    [
        ("strategy.mu=-0.5", "strategy.mu = -0.5: must be >= 0"),
        ("strategy.mu=bad", "strategy.mu = 'bad'"),
    ],
)
def test_fedprox_mu_is_checked_naming_the_key(override, problem):
    with pytest.raises(ConfigError, match=problem):
        load_experiment(CONF / "fedprox.yaml", [override])


@pytest.mark.parametrize(
    "override, problem",
    [
        ("strategy.variance_weight=-1", "must be >= 0"),
        ("strategy.gamma=0", "strategy.gamma = 0.0: must be > 0"),
        ("strategy.t=0", "must be > 0"),
        ("strategy.bandwidth=medain", "choose one of median, fixed \\(did you mean 'median'"),
    ],
)
def test_feduv_parameters_are_checked_naming_the_key(override, problem):
    with pytest.raises(ConfigError, match=problem):
        load_experiment(None, ["strategy.name=feduv", override])


def test_the_declared_parameters_reach_both_sides():
    cfg = load_experiment(None, ["strategy.name=feduv", "strategy.gamma=0.25", "strategy.t=3"])
    params = cfg.strategy.params
    assert (params.gamma, params.t, params.bandwidth) == (0.25, 3.0, "median")
    assert isinstance(params, declaration("feduv").Config)  # the strategy's extends the client's
    assert clients.client_class("feduv").Config is declaration("feduv").Config
    assert strategies.strategy_class("fedprox").Config().mu == 0.01
    # a client builds (and checks) what it is sent as the server does
    got = build_section(declaration("feduv").Config, {"gamma": None}, "strategy.")
    assert got.gamma is None and got.variance_weight == 2.5
    with pytest.raises(ConfigError, match="strategy.gamma = -1.0: must be > 0"):
        build_section(declaration("feduv").Config, {"gamma": -1.0}, "strategy.")
    # FedUV's replies carry its two metrics
    assert {"uv_var", "uv_unif"} <= set(declaration("feduv").reply().metrics)


def test_a_built_config_is_a_plain_dataclass():
    cls = declaration("fedprox").Config
    assert cls.__module__ == "fedgo_flwr.protocol.scalars" and cls.__name__ == "FedProxConfig"
    assert pickle.loads(pickle.dumps(cls(mu=0.5))) == cls(mu=0.5)
    assert [f.name for f in dataclasses.fields(declaration("feduv").Config)] == [
        "variance_weight",
        "uniformity_weight",
        "gamma",
        "bandwidth",
        "t",
        "detach_bandwidth",
    ]
    assert set(SCALAR_ALGORITHMS) == {"fedprox", "feduv"}


def test_params_are_scalars_with_a_bound_that_says_itself():
    with pytest.raises(TypeError, match="bool, int, float or str, not list"):
        parameters("BadConfig", "no", xs=Param([1], "a list"))
    with pytest.raises(TypeError, match="not NoneType"):
        parameters("BadConfig", "no", x=Param(None, "no type"))
    cls = parameters("OkConfig", "fine", n=Param(3, "a count", at_least=1), on=Param(True, "a"))
    assert build_section(cls, {"n": 5}, "s.").n == 5
    with pytest.raises(ConfigError, match="s.n = 0: must be >= 1"):
        build_section(cls, {"n": 0}, "s.")
    assert [f.metadata["rule"] for f in dataclasses.fields(cls)] == ["must be >= 1", None]
