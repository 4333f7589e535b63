"""The two named seed sets of a sweep, and what a table built on them may claim.

- **Tuning seeds** (:data:`TUNING_SEEDS`): every choice of a variant, a setting or a budget is
  made on these. They are 0, 1 and 2, the seeds every benchmark in ``benchmarks/`` has used so
  far (``benchmarks/results``), so the project's existing choices were all made on them.
- **Report seeds** (:data:`REPORT_SEEDS`): used only to report a choice already made, never to
  make one. They are 100-104: no earlier run used them (``benchmarks/`` and its results use 0-9,
  tests a few others below 100, and 123/124 in unit tests of model initialisation).

A seed names a whole run (partition, client sampling, initial model, training), so runs of two
variants on one seed are paired: they see the same clients' data.
"""

from __future__ import annotations

from dataclasses import dataclass

TUNING_SEEDS: tuple[int, ...] = (0, 1, 2)
REPORT_SEEDS: tuple[int, ...] = (100, 101, 102, 103, 104)
SEED_SETS: dict[str, tuple[int, ...]] = {"tuning": TUNING_SEEDS, "report": REPORT_SEEDS}

TUNING_NOTE = "tuning seeds: not for claims"


@dataclass(frozen=True)
class SeedSet:
    """The seeds of one sweep and the set they belong to.

    ``name``: ``"tuning"``, ``"report"`` (all of them in that set, possibly a subset of it) or
    ``"custom"``. A custom list that holds any tuning seed counts as tuning.
    """

    name: str
    seeds: tuple[int, ...]

    @property
    def for_claims(self) -> bool:
        """Whether a table of these seeds may back a claim: report seeds only."""
        return self.name == "report"

    @property
    def note(self) -> str:
        """The sentence a table's header carries about its seeds."""
        listed = ", ".join(str(s) for s in self.seeds)
        if self.name == "tuning":
            return (
                f"{TUNING_NOTE} (seeds {listed}: variants, settings and budgets are chosen on them)"
            )
        if self.name == "report":
            return f"report seeds ({listed}): never used for a choice"
        return f"custom seeds ({listed}): neither named set, so not for claims"


def parse_seeds(text: str) -> SeedSet:
    """``"tuning"``, ``"report"`` or a comma-separated list of seeds (``"0,1,2"``); raises
    :class:`ValueError` for anything else."""
    text = text.strip()
    if text in SEED_SETS:
        return SeedSet(text, SEED_SETS[text])
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(
            f"--seeds {text!r}: give 'tuning' {TUNING_SEEDS}, 'report' {REPORT_SEEDS} "
            "or a comma-separated list of integers"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds {text!r}: give distinct seeds >= 0")
    return classify(seeds)


def classify(seeds: tuple[int, ...]) -> SeedSet:
    """The set a list of seeds belongs to: tuning if any seed is a tuning seed, report if all
    are report seeds, else custom."""
    if set(seeds) & set(TUNING_SEEDS):
        return SeedSet("tuning", seeds)
    if set(seeds) <= set(REPORT_SEEDS):
        return SeedSet("report", seeds)
    return SeedSet("custom", seeds)
