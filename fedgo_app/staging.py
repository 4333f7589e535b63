"""The app's files, linked into a folder of their own for ``flwr run`` (``run.sh``).

``flwr run DIR`` bundles DIR into a Flower app (FAB), but Flower (1.41, 1.42) first walks and
resolves *every* file under DIR (``flwr.cli.utils.collect_files``) and applies ``.gitignore`` and
``fab-exclude`` only afterwards. In a checkout whose ``.venv/`` lives inside it that is some
50,000 files and about 6 s of every ``run.sh`` start-up. :func:`stage_app` walks the tree
once, skipping the folders ``.gitignore`` excludes as a whole, and hard-links (or copies)
the rest into a new folder; ``flwr run`` on that folder builds the same FAB (same files, same
bytes, same hash: ``tests/unit/test_staging.py``,
``tests/e2e/test_run_sh.py`` on this repository).

``python -m fedgo_app.staging DEST [APP_DIR]`` does the same from a shell (``APP_DIR``
defaults to the current folder), e.g. ``flwr run "$(python -m fedgo_app.staging /tmp/app)"
<federation>`` in a deployment.

A folder is skipped only if every path below it is excluded: a pattern matches the folder and
a probe file inside it, and ``.gitignore`` has no ``!`` pattern (which could bring a file
back).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pathspec

ALWAYS_SKIPPED = (".git/",)
"""Folders never part of an app (git's own store; Flower's FAB rules exclude it too)."""


def prunable(root: Path) -> pathspec.PathSpec:
    """The patterns whose matching folders :func:`stage_app` may skip as a whole.

    ``.gitignore``'s (compiled as Flower compiles them), unless one of them is a ``!``
    pattern. Not ``fab-exclude``'s: Flower refuses a ``fab-exclude`` pattern that matches no
    file, so those files must reach it.
    """
    gitignore = root / ".gitignore"
    lines = gitignore.read_text(errors="replace").splitlines() if gitignore.is_file() else []
    ignore = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    patterns = list(ALWAYS_SKIPPED)
    if not any(p.startswith("!") for p in ignore):
        patterns += ignore
    # As Flower's FAB builder compiles them (flwr.cli.utils.build_pathspec: gitwildmatch
    # patterns); not imported from there, whose imports (its CLI's web client) cost `prepare`
    # about a second.
    return pathspec.PathSpec.from_lines("gitwildmatch", patterns)


def stage_app(root: Path, dest: Path) -> int:
    """Link the files of the app at ``root`` into ``dest`` (created; must not exist).

    Symbolic links are left out, as Flower's own walk leaves them out. Returns the number of
    files staged.
    """
    root = root.resolve()
    spec = prunable(root)
    dest.mkdir(parents=True)
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel = Path(dirpath).relative_to(root)
        keep = []
        for d in dirnames:
            sub = (rel / d).as_posix()
            full = Path(dirpath) / d
            if full.is_symlink() or full.resolve() == dest.resolve():
                continue
            if spec.match_file(f"{sub}/.probe") and spec.match_file(f"{sub}/"):
                continue
            keep.append(d)
        dirnames[:] = keep
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            src = Path(dirpath) / name
            if src.is_symlink():
                continue
            target = dest / rel / name
            try:
                os.link(src, target)
            except OSError:
                shutil.copy2(src, target)
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    """``python -m fedgo_app.staging DEST [APP_DIR]``: stage, then print ``DEST``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m fedgo_app.staging DEST [APP_DIR]", file=sys.stderr)
        return 2
    dest = Path(args[0])
    if dest.exists():
        print(f"fedgo-flwr: {dest} exists; stage into a new folder", file=sys.stderr)
        return 2
    stage_app(Path(args[1]) if len(args) == 2 else Path.cwd(), dest)
    print(dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
