"""Confirmation on fresh seeds (issue 48 item 1; docs/sweeps.md, "Confirmation on fresh seeds"): after a sweep's
search picks the best cell, that cell and the baseline run again on N seeds disjoint from every search seed, and the
paired t interval over those seeds is the one to quote: chosen independently of any search outcome, they cover the
selected cell's true difference with probability >= 95%, where the search-phase estimate is biased up (the winner's
curse). Shrinkage = search estimate - confirmation estimate: that bias measured on this sweep (noisy)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.stats.comparisons import Comparison, compare
from rlvrlab.stats.intervals import LEVEL, MIN_SEEDS


@dataclass(frozen=True)
class Confirmation:
    """The selected cell against the baseline, on the search seeds and on fresh confirmation seeds, side by side."""

    search: Comparison  # paired over the search seeds: naive (the cell was selected on these values)
    confirmation: Comparison  # paired over the confirmation seeds: the interval to quote
    search_seeds: tuple[int, ...]
    confirmation_seeds: tuple[int, ...]

    @property
    def shrinkage(self) -> float:
        """Search estimate - confirmation estimate (positive: the search overstated the winner)."""
        return self.search.delta - self.confirmation.delta


def fresh_seeds(search_seeds: Iterable[int], n: int) -> tuple[int, ...]:
    """N confirmation seeds disjoint from every search seed: the N integers above the largest one (0.. without any).

    Fine because a seed only indexes random streams (initial weights, prompt order, sampling): distinct integers give
    unrelated streams whatever their size, and this choice depends on the search seed list alone, never on a search
    outcome, so the confirmation runs are independent of the selection. Deterministic: a rerun confirms on the same
    seeds."""
    seeds = [int(s) for s in search_seeds]
    _check_count(n)
    start = max(seeds, default=-1) + 1
    return tuple(range(start, start + n))


def _check_count(n: int) -> None:
    """A confirmation interval needs a spread: at least MIN_SEEDS (2) seeds."""
    if n < MIN_SEEDS:
        raise RlvrlabError(f"confirm needs at least {MIN_SEEDS} seeds, got {n}: set confirm.seeds to 2 or more "
                           f"(3-10 is typical)")


def check_seeds(search_seeds: Iterable[int], confirmation_seeds: Sequence[int]) -> None:
    """One-line errors when the confirmation seeds are fewer than 2, repeat one another or reuse a search seed (a
    reused seed replays the search run's random streams, so it is not a fresh, independent draw)."""
    _check_count(len(confirmation_seeds))
    if len(set(confirmation_seeds)) != len(confirmation_seeds):
        raise RlvrlabError(f"confirmation seeds {list(confirmation_seeds)} repeat a seed: give distinct seeds "
                           f"(or leave them to fresh_seeds)")
    overlap = sorted(set(int(s) for s in search_seeds) & set(int(s) for s in confirmation_seeds))
    if overlap:
        raise RlvrlabError(f"confirmation seeds {overlap} were search seeds: confirm on seeds disjoint from every "
                           f"search seed (e.g. those above the largest, fresh_seeds)")


def _paired(cell, baseline, seeds: Sequence[int], phase: str, level: float) -> Comparison:
    cell, baseline = np.asarray(cell, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if cell.shape != baseline.shape or cell.shape[0] != len(seeds):
        raise RlvrlabError(f"{phase} values of shapes {cell.shape} (cell) and {baseline.shape} (baseline) do not "
                           f"match its {len(seeds)} seeds: give one value per seed (or per seed and problem), "
                           f"the same seeds in the same order for both")
    return compare(cell, baseline, paired=True, level=level)


def confirm(search_cell, search_baseline, confirmation_cell, confirmation_baseline, *,
            search_seeds: Sequence[int], confirmation_seeds: Sequence[int], level: float = LEVEL) -> Confirmation:
    """The selected cell minus the baseline in both phases from per-seed values ([S] training metrics, or [S, P]
    evaluation metrics: the report's paired comparison, stats.compare) in the order of their seed lists. The search
    comparison is the naive one (shown for the shrinkage); the confirmation comparison is valid (module docstring)."""
    check_seeds(search_seeds, confirmation_seeds)
    search = _paired(search_cell, search_baseline, search_seeds, "search", level)
    confirmation = _paired(confirmation_cell, confirmation_baseline, confirmation_seeds, "confirmation", level)
    return Confirmation(search, confirmation, tuple(int(s) for s in search_seeds),
                        tuple(int(s) for s in confirmation_seeds))
