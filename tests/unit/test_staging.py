"""run.sh's staged app folder bundles into the same FAB as the folder itself."""

from __future__ import annotations

import os
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

from fedgo_app.staging import stage_app

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _tree(root: Path, gitignore: str) -> None:
    files = {
        "pyproject.toml": PYPROJECT,
        ".gitignore": gitignore,
        "fedgo_flwr/__init__.py": "x = 1\n",
        "fedgo_flwr/deep/er/mod.py": "y = 2\n",
        "conf/a.yaml": "a: 1\n",
        "benchmarks/x.py": "excluded by fab-exclude\n",
        ".venv/lib/site.py": "ignored\n",
        "outputs/run/summary.json": "{}\n",
        "keep/outputs.py": "not the outputs folder\n",
        "cache.pyc": "ignored file\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    os.symlink(root / "conf", root / "conf-link")  # left out by Flower's walk and by ours


def _names(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_the_staged_folder_gives_the_same_fab_and_skips_ignored_folders(tmp_path):
    app = tmp_path / "app"
    _tree(app, ".venv\noutputs/\n*.pyc\n")
    staged = tmp_path / "staged"
    stage_app(app, staged)
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)
    names = _names(staged)
    assert not any(n.startswith((".venv/", "outputs/")) for n in names), names
    assert "benchmarks/x.py" in names  # fab-exclude's: Flower refuses a pattern matching none
    assert {"keep/outputs.py", "cache.pyc", "fedgo_flwr/deep/er/mod.py"} <= names
    assert not (staged / "conf-link").exists()


def test_a_negated_gitignore_pattern_keeps_ignored_folders_walked(tmp_path):
    """``!`` could bring a file below an ignored folder back: nothing .gitignore names is
    skipped then, and the FAB is still the same."""
    app = tmp_path / "app"
    _tree(app, ".venv\noutputs/\n!outputs/run/summary.json\n")
    staged = tmp_path / "staged"
    stage_app(app, staged)
    assert "outputs/run/summary.json" in _names(staged)
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)


def test_the_command_stages_the_given_folder_and_prints_the_destination(tmp_path, capsys):
    from fedgo_app.staging import main

    app = tmp_path / "app"
    _tree(app, ".venv\n")
    assert main([str(tmp_path / "staged"), str(app)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "staged")
    assert "conf/a.yaml" in _names(tmp_path / "staged")
    assert main([]) == 2
    assert main([str(tmp_path / "staged"), str(app)]) == 2  # never into an existing folder
    assert "exists" in capsys.readouterr().err
