"""Counts of distinct correct solution forms that do not fall mechanically as accuracy rises: the expected number
of distinct correct forms among m correct responses (rarefaction, Hurlbert 1971; Sanders 1968) and among k samples,
exact from the per-form counts."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Optional

import numpy as np


def _log_comb(n: np.ndarray | int, k: int) -> np.ndarray:
    from scipy.special import gammaln

    n = np.asarray(n, dtype=np.float64)
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def _expected_distinct(counts: Sequence[int], total: int, draws: int) -> float:
    """E[distinct forms] when `draws` of `total` items (counts[f] of form f, the rest of no form) are drawn
    without replacement: Σ_f 1 - C(total - n_f, draws) / C(total, draws)."""
    sizes = np.asarray([c for c in counts if c > 0], dtype=np.float64)
    if draws > total or draws < 0:
        raise ValueError(f"cannot draw {draws} of {total}")
    rest = total - sizes
    missing = np.where(rest >= draws, np.exp(_log_comb(np.maximum(rest, draws), draws) - _log_comb(total, draws)), 0.0)
    return float((1.0 - missing).sum())


def rarefied_distinct(form_counts: Sequence[int], m: int) -> Optional[float]:
    """Expected number of distinct correct forms among m of the c correct responses (rarefaction, Hurlbert 1971),
    c = sum(form_counts); None when c < m. Unlike distinct/c it does not fall mechanically as c grows."""
    c = int(sum(form_counts))
    if c < m:
        return None
    return _expected_distinct(form_counts, c, m)


def expected_distinct(form_counts: Sequence[int], n: int, k: int) -> float:
    """Expected number of distinct correct forms among k of the n samples (correct or not): the unconditional
    diversity that a user drawing k samples sees."""
    return _expected_distinct(form_counts, n, k)


def distinct_combinations(form_counts: Sequence[int], m: int) -> float:
    """Brute force of rarefied_distinct (for tests): the mean number of distinct forms over all m-subsets."""
    items = [f for f, c in enumerate(form_counts) for _ in range(c)]
    subsets = list(itertools.combinations(items, m))
    return float(np.mean([len(set(s)) for s in subsets]))
