"""Code named by the server's config runs on a client only if the node's operator allowed it
(``fedgo_flwr/runtime/trust.py``): node config ``allow-code``, else ``$FEDGO_ALLOW_CODE``.

``strategy.generator.module`` (FedGO's G2 with a user's generator factory) is imported by every
client from what the server's message names. A node that has not allowed it refuses the
message with an error reply naming the module and the node config key, and imports nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.gan.external import load_generator_factory
from fedgo_flwr.gan.settings import GeneratorConfig
from fedgo_flwr.runtime.trust import (
    ALLOW_CODE_ENV,
    CodeNotAllowed,
    CodePolicy,
    check_import,
    code_policy,
    node_code_policy,
)
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
MODULE = "generator_factories:factory"
TINY = [
    "rounds=1",
    "data.num_clients=3",
    "data.train_subset=400",
    "data.test_subset=120",
    "fraction=1.0",
    "train.local_epochs=1",
]
FEDGO = [
    "strategy.name=fedgo",
    "strategy.distill.epochs=1",
    "strategy.distill.max_steps=4",
    "strategy.generator.steps=0",
    "strategy.discriminator.epochs=1",
    "data.alpha=1.0",
    f"strategy.generator.module={MODULE}",
]


def planted(tmp_path: Path, name: str = "planted_gen") -> tuple[Path, Path]:
    """A generator factory file that leaves a marker file when it is imported."""
    marker = tmp_path / f"{name}.imported"
    source = tmp_path / f"{name}.py"
    source.write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from generator_factories import factory\n"
    )
    return source, marker


def test_a_refused_module_is_not_imported_and_the_error_names_module_and_key(tmp_path):
    source, marker = planted(tmp_path)
    with node_code_policy({"allow-code": False}), pytest.raises(CodeNotAllowed) as info:
        load_generator_factory(f"{source}:factory")
    assert not marker.exists()  # refused before anything of it ran
    text = str(info.value)
    assert text.startswith(f"strategy.generator.module: this node does not import '{source}'")
    assert "allow-code=true" in text and f'allow-code="{tmp_path}"' in text
    assert ALLOW_CODE_ENV in text
    # A node that allows the file's folder imports it.
    with node_code_policy({"allow-code": str(tmp_path)}):
        assert callable(load_generator_factory(f"{source}:factory"))
    assert marker.exists()


def test_the_check_of_a_client_config_section_refuses_too():
    """A client parses the server's ``strategy.generator`` section (``check`` imports the
    module): the refusal is not turned into a ConfigError about an unimportable module."""
    with node_code_policy({}), pytest.raises(CodeNotAllowed, match="generator_factories"):
        GeneratorConfig(module="generator_factories:factory", steps=0).build((1, 8, 8))


@pytest.mark.parametrize(
    ("value", "allowed", "refused"),
    [
        (True, ["x", "a.b"], []),
        ("true", ["x"], []),
        (1, ["x"], []),
        ("yes", ["x"], []),
        (False, [], ["x"]),
        ("false", [], ["x"]),
        ("", [], ["x"]),
        (0, [], ["x"]),
        (
            "generator_factories, lab.models",
            ["generator_factories", "lab.models", "lab.models.gan"],
            ["lab", "lab.modelsx", "generator_factoriesx", "os", "/tmp/x.py"],
        ),
        ("/opt/gens", ["/opt/gens/a.py", "/opt/gens/sub/b.py"], ["/opt/other.py", "opt"]),
    ],
)
def test_allow_code_values(value, allowed, refused):
    policy = CodePolicy.parse(value, "node config allow-code")
    assert all(policy.permits(t) for t in allowed)
    assert not any(policy.permits(t) for t in refused)


def test_a_malformed_allow_code_is_refused_naming_the_entry():
    with pytest.raises(ValueError, match="'my-gens' is neither a dotted module name nor a path"):
        CodePolicy.parse("ok.module,my-gens", "node config allow-code")


def test_the_node_config_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(ALLOW_CODE_ENV, "1")
    with node_code_policy({}):
        check_import("anything", "k")  # simulated nodes: the environment
    with node_code_policy({"allow-code": None}):
        check_import("anything", "k")
    with node_code_policy({"allow-code": False}), pytest.raises(CodeNotAllowed):
        check_import("anything", "k")
    monkeypatch.delenv(ALLOW_CODE_ENV)
    with node_code_policy({}), pytest.raises(CodeNotAllowed, match="FEDGO_ALLOW_CODE = false"):
        check_import("anything", "k")
    with code_policy(None):  # the server and the tools: no limit
        check_import("anything", "k")
    check_import("anything", "k")


def fedgo_run(tmp_path: Path, node_config: dict) -> tuple[list[dict], list[str]]:
    """A tiny FedGO run (G2 with the factory) in-process; its rows and the clients' errors."""
    errors: list[str] = []
    original = InProcessGrid.stream

    def stream(self, messages, *, timeout=None):
        for reply in original(self, messages, timeout=timeout):
            if reply.has_error():
                errors.append(reply.error.reason)
            yield reply

    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, *FEDGO, f"output_dir={tmp_path}"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(InProcessGrid, "stream", stream)
        mp.delenv(ALLOW_CODE_ENV, raising=False)
        run_inprocess(cfg, node_config=node_config)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return rows, errors


def test_clients_refuse_the_generator_module_without_the_node_permission(tmp_path):
    rows, errors = fedgo_run(tmp_path / "refused", {"allow-code": False})
    # The discriminator round and the training round: every client refused every message.
    assert len(errors) == 2 * 3, errors
    for reason in errors:
        assert reason.startswith(
            "CodeNotAllowed: strategy.generator.module: this node does not import "
            "'generator_factories'"
        ), reason
        assert "node config allow-code" in reason and 'allow-code="generator_factories"' in reason
    assert rows[-1]["clients_replied"] == 0

    # Allowed by the module's package (or allow-code=true, run_inprocess's default): it runs.
    rows, errors = fedgo_run(tmp_path / "allowed", {"allow-code": "generator_factories"})
    assert errors == [] and rows[-1]["clients_replied"] == 3
    prefl = json.loads((tmp_path / "allowed" / "prefl.json").read_text())
    assert prefl["missing_discriminators"] == []
