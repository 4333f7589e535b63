"""The documentation: the configuration reference is generated, and every link resolves."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def load_generator():
    """``docs.gen_configuration``, imported as ``python -m docs.gen_configuration`` runs it
    (``docs`` is no installed package: the repository's root goes on the path)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("docs.gen_configuration")


def test_configuration_reference_is_the_generators_output():
    gen = load_generator()
    text, _ = gen.generate()
    committed = (DOCS / "configuration.md").read_text()
    assert committed == text, (
        f"docs/configuration.md differs from the config dataclasses: run `{gen.COMMAND}`"
    )


def test_every_config_key_is_described():
    gen = load_generator()
    _, undocumented = gen.generate()
    assert not undocumented, (
        "keys without a description (give the field an attribute docstring, or name it in the "
        f"class docstring): {undocumented}"
    )


def test_a_key_is_described_in_its_dataclass_only():
    """The page's text of a key is the attribute docstring of the field (or its base's): the
    page's hand-written prose (docs/configuration_text.py) describes no key."""
    gen = load_generator()
    import docs.configuration_text as prose

    assert sorted(n for n in vars(prose) if n.isupper()) == ["INTRO", "RULES"]
    from fedgo_flwr.experiment.config import DataConfig
    from strategies.fedgo import FedGOConfig

    assert (
        gen.description_of(DataConfig, "num_clients")
        == gen.attribute_docs(DataConfig)["num_clients"]
    )
    # FedGO redeclares FedDF's weighting with its own default and its own docstring; a
    # redeclaration without one (default `domain`) is described by FedDF's docstring
    assert gen.description_of(FedGOConfig, "weighting") == "FedGO's odds weights by default."
    text, _ = gen.generate()
    lines = {
        " ".join(x.split()) for x in text.split("\n- ") if x.startswith("`strategy.weighting` ")
    }
    by_default = {x.split("default `")[1].split("`")[0]: x.split("): ")[1] for x in lines}
    assert by_default["fedgo"].startswith("FedGO's odds weights by default.")
    assert by_default["domain"].startswith("How the ensemble weighs each client on each sample")


def test_readme_stays_an_overview():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move details to docs/"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"
    text = "\n".join(lines)
    assert "./run.sh --tests" in text and "\n./run.sh            #" in text


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def test_relative_links_of_the_docs_resolve():
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken = []
    for page in pages:
        for target, _ in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to missing files: {broken}"


def test_no_key_is_described_twice():
    """A field with an attribute docstring is not described in its class docstring too (the
    ``` ``key``: text ``` form), which the page would show twice."""
    gen = load_generator()
    core, strat = gen.find_sections()
    twice = [
        f"{s.cls.__qualname__}.{f.name}"
        for s in [*core.values(), *strat.values()]
        for f in s.own_fields
        if f.name in gen.attribute_docs(s.cls) and f"``{f.name}``:" in gen.class_doc(s.cls)
    ]
    assert not twice, f"described in the attribute docstring and the class docstring: {twice}"
