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
    from fedgo_flwr.config.experiment import DataConfig
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
REFERENCE = re.compile(r"^\[([^\]]+)\]:\s*([^#\s]+)(#\S*)?", re.MULTILINE)
"""A reference-style link's definition, ``[label]: target``."""


BENCHMARKS = ROOT / "benchmarks"
STUDIES = BENCHMARKS / "studies"
INDEX = BENCHMARKS / "README.md"
"""The benchmarks' index: how the scripts run, and one row per study page of ``STUDIES``."""


def doc_pages() -> list[Path]:
    """The hand-written Markdown pages: README, docs/, the benchmarks' index and study pages."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), INDEX, *sorted(STUDIES.glob("*.md"))]


def test_relative_links_of_the_docs_resolve():
    broken = []
    for page in doc_pages():
        text = page.read_text()
        targets = LINK.findall(text) + [(t, a) for _, t, a in REFERENCE.findall(text)]
        for target, _ in targets:
            if re.match(r"[a-z]+:", target):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to missing files: {broken}"


def linked_files(page: Path) -> set[Path]:
    """The local files a Markdown page links to, resolved."""
    return {(page.parent / target).resolve() for target, _ in LINK.findall(page.read_text())}


def test_every_study_page_is_in_the_index_and_links_back():
    pages = sorted(STUDIES.iterdir())
    assert len(pages) >= 10, "the study pages are gone"
    assert all(p.suffix == ".md" for p in pages), [p.name for p in pages]
    in_index = linked_files(INDEX)
    assert not [p.name for p in pages if p.resolve() not in in_index], "pages not in the index"
    assert not [p.name for p in pages if INDEX.resolve() not in linked_files(p)], (
        "study pages without a link back to the index"
    )


CITATION = re.compile(
    r'benchmarks/(studies/[\w-]+\.md|README\.md)`{0,2}\)?(?:,\s*|\s*\()?(?:"([^"]+)")?'
)
"""A benchmark page named in the code or the docs, and the quoted section title after it if any:
``benchmarks/studies/trust.md``, "The adversary profile" (in a docstring, a YAML comment, or
the target of a Markdown link)."""
CITED_LINK = re.compile(r'\]\(([^)#\s]+)(?:#[^)\s]*)?\)(?:,\s*|\s*\()"([^"]+)"')
"""A relative Markdown link and the quoted section title after it: [page.md](page.md), "Title"."""


def section_starts(page: Path) -> list[str]:
    """What a quoted section title may begin: a heading, a list item or a paragraph (its first
    line, bold markers left out, spaces collapsed)."""
    lines = page.read_text().splitlines()
    return [
        " ".join(line.lstrip("#- ").replace("**", "").split())
        for i, line in enumerate(lines)
        if line.startswith(("#", "- ")) or (line and (i == 0 or not lines[i - 1].strip()))
    ]


def test_every_cited_benchmark_page_and_section_exists():
    """Code, configs and docs cite the benchmarks by page and section title; each cited page
    exists and has a heading, list item or paragraph that begins with the cited title."""
    cited: list[tuple[str, Path, str]] = []
    files = [ROOT / ".gitignore", *doc_pages()]
    folders = ("fedgo_flwr", "fedgo_app", "strategies", "clients", "benchmarks", "conf", "tests")
    for folder in folders:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".yaml"}]
    for path in files:
        if path == Path(__file__).resolve():
            continue
        # one line: line breaks, and the comment leaders of wrapped YAML and Python comments, out
        text = " ".join(re.sub(r"\n[ \t]*#[ \t]*", " ", path.read_text()).split())
        where = str(path.relative_to(ROOT))
        cited += [(where, BENCHMARKS / page, title) for page, title in CITATION.findall(text)]
        if path.suffix == ".md":
            for target, title in CITED_LINK.findall(text):
                page = (path.parent / target).resolve()
                if page == INDEX.resolve() or page.parent == STUDIES.resolve():
                    cited.append((where, page, title))
    assert len(cited) >= 20, "the citation patterns find too little"
    missing = [(w, str(p.relative_to(ROOT))) for w, p, _ in cited if not p.is_file()]
    assert not missing, f"cited benchmark pages that do not exist: {missing}"
    unknown = [
        (where, page.name, title)
        for where, page, title in cited
        if title and not any(s.startswith(title) for s in section_starts(page))
    ]
    assert not unknown, f"cited sections that their page does not have: {unknown}"


NUMBER = r"[+-]?\d+(?:\.\d+)?"
INTERVAL = re.compile(rf"({NUMBER})(x?)(?: points)? \[({NUMBER}), ({NUMBER})\]")
"""A figure and its interval: ``+5.71 [+3.37, +8.06]``, ``-0.3 points [-0.7, +0.8]``, or a
ratio ``1.18x [0.21, 6.70]``."""
OVERSTATED = re.compile(r"\b(beats?|better|worse|outperforms?)\b", re.IGNORECASE)


def _claim_rows() -> list[str]:
    """The rows of the tables in README's "What the measurements say" (headers left out)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## What the measurements say", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    return [
        line
        for i, line in enumerate(lines)
        if line.startswith("|")
        and not line.startswith("|---")
        and not (i + 1 < len(lines) and lines[i + 1].startswith("|---"))
    ]


def test_readme_claims_link_their_tables_and_say_what_their_intervals_allow():
    text = (ROOT / "README.md").read_text()
    labels = {label for label, _, _ in REFERENCE.findall(text)}
    rows = _claim_rows()
    assert len(rows) >= 5
    for row in rows:
        linked = LINK.search(row) or any(f"][{label}]" in row for label in labels)
        assert linked, f"a claim without a link to its table: {row}"
        for _value, ratio, low, high in INTERVAL.findall(row):
            if ratio:  # a ratio: an interval that holds 1 says neither faster nor slower
                if float(low) <= 1 <= float(high):
                    assert not re.search(r"\b(faster|slower)\b", row, re.IGNORECASE), row
            elif float(low) <= 0 <= float(high):
                assert "no detectable difference" in row and not OVERSTATED.search(row), row


def test_the_claim_checks_catch_an_overstated_row():
    """The patterns of the test above match the rows they must refuse."""
    row = "| X beats Y | 100-104 | +2.2 points [-8.0, +12.3], p = 0.45 |"
    ((value, ratio, low, high),) = INTERVAL.findall(row)
    assert (value, ratio, low, high) == ("+2.2", "", "-8.0", "+12.3") and OVERSTATED.search(row)
    ((_, ratio, low, high),) = INTERVAL.findall("| 1.18x [0.21, 6.70] faster |")
    assert ratio == "x" and float(low) <= 1 <= float(high)


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


def test_every_paper_number_cited_is_defined():
    """The code and notes cite papers as "paper 001"; docs/papers.md says which paper each is."""
    defined = set(re.findall(r"^\| (\d{3}) \|", (ROOT / "docs/papers.md").read_text(), re.M))
    cited: dict[str, str] = {}
    folders = ("fedgo_flwr", "fedgo_app", "strategies", "clients", "benchmarks", "conf", "docs")
    for folder in (*folders, "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".yaml"} and path.is_file():
                for number in re.findall(r"[Pp]aper (00\d)\b", path.read_text()):
                    cited.setdefault(number, str(path.relative_to(ROOT)))
    assert cited, "no paper cited by number: the pattern is wrong"
    missing = {n: where for n, where in cited.items() if n not in defined}
    assert not missing, f"paper numbers cited but not in docs/papers.md: {missing}"
