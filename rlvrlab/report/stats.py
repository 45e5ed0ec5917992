"""Interval estimates for multi-seed results (EVAL_STATS_UX.md §2). Pure numpy; every function takes its RNG, so a
report made with the same seed gives identical numbers.

Shapes: a training metric is one value per seed, x [S]; an evaluation metric is one value per seed and problem,
x [S, P] (problems aligned by id across groups, so comparisons can pair them).

- seed_interval(x [S]): percentile bootstrap over seeds of the mean (rliable's stratified bootstrap with one task).
- two_level_interval(x [S, P]): resamples seeds and problems independently (a crossed design): the uncertainty of
  "which training seeds" and of "which questions" both enter.
- difference(a, b): mean(a) - mean(b) with its interval; problems are resampled jointly (paired), seeds
  independently per group; p-value from the bootstrap distribution (two-sided, percentile inversion).
- holm(p): Holm's step-down adjustment across a table's comparisons.
- probability_of_improvement(a, b): P(X > Y) + 0.5 P(X = Y) over seed-level scores (rliable's Mann-Whitney form).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

REPS = 10_000
LEVEL = 0.95
MIN_SEEDS = 3  # fewer seeds: no interval, the table flags the group


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class Comparison:
    delta: float
    low: float
    high: float
    p: float
    prob_improvement: float


def _percentiles(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _weights(rng: np.random.Generator, n: int, reps: int) -> np.ndarray:
    """[reps, n] resampling counts: row r says how often each of n items is drawn (n draws with replacement)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=reps).astype(np.float64)


def seed_means(x: np.ndarray) -> np.ndarray:
    """[S] or [S, P] -> [S]: each seed's score (its mean over problems)."""
    return x if x.ndim == 1 else x.mean(axis=1)


def _replicates(x: np.ndarray, rng: np.random.Generator, reps: int,
                problem_weights: Optional[np.ndarray] = None) -> np.ndarray:
    """[reps] bootstrap means of x [S] or [S, P]: seeds resampled; problems by problem_weights [reps, P] (or fresh
    ones when None), which lets a comparison share them between two groups."""
    seeds = x.shape[0]
    seed_w = _weights(rng, seeds, reps)  # [reps, S]
    if x.ndim == 1:
        return seed_w @ x / seeds
    problems = x.shape[1]
    problem_w = _weights(rng, problems, reps) if problem_weights is None else problem_weights  # [reps, P]
    per_seed = problem_w @ x.T / problems  # [reps, S]: each seed's mean over the resampled problems
    return (seed_w * per_seed).sum(axis=1) / seeds


def seed_interval(x: np.ndarray, rng: np.random.Generator, reps: int = REPS) -> Interval:
    """Mean over seeds of the seed scores, percentile bootstrap over seeds only."""
    scores = seed_means(np.asarray(x, dtype=np.float64))
    low, high = _percentiles(_replicates(scores, rng, reps))
    return Interval(float(scores.mean()), low, high)


def two_level_interval(x: np.ndarray, rng: np.random.Generator, reps: int = REPS) -> Interval:
    """x [S, P]: mean over seeds of the mean over problems; seeds and problems resampled independently."""
    x = np.asarray(x, dtype=np.float64)
    low, high = _percentiles(_replicates(x, rng, reps))
    return Interval(float(x.mean()), low, high)


def difference(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, reps: int = REPS) -> Comparison:
    """mean(a) - mean(b). a [Sa] / b [Sb] (training metrics) or a [Sa, P] / b [Sb, P] with the same problems in the
    same order: problems resampled jointly (paired), seeds independently per group."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != b.ndim or (a.ndim == 2 and a.shape[1] != b.shape[1]):
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}: the same problems are needed")
    shared = _weights(rng, a.shape[1], reps) if a.ndim == 2 else None
    deltas = _replicates(a, rng, reps, shared) - _replicates(b, rng, reps, shared)
    low, high = _percentiles(deltas)
    below, above = int((deltas <= 0).sum()), int((deltas >= 0).sum())
    p = min(1.0, 2 * (1 + min(below, above)) / (1 + reps))
    return Comparison(float(a.mean() - b.mean()), low, high, p, probability_of_improvement(a, b))


def probability_of_improvement(a: np.ndarray, b: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y) for X a seed score of a and Y one of b (rliable, one task)."""
    x, y = seed_means(np.asarray(a, dtype=np.float64)), seed_means(np.asarray(b, dtype=np.float64))
    greater = (x[:, None] > y[None, :]).mean()
    ties = (x[:, None] == y[None, :]).mean()
    return float(greater + 0.5 * ties)


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order."""
    m = len(p_values)
    order = np.argsort(p_values, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted.tolist()


def curve_band(x: np.ndarray, rng: np.random.Generator, reps: int = 2000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [S, T] (a metric per seed and step): mean over seeds per step and a percentile-bootstrap band over seeds."""
    x = np.asarray(x, dtype=np.float64)
    seeds = x.shape[0]
    replicates = _weights(rng, seeds, reps) @ x / seeds  # [reps, T]
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail], axis=0)
    return x.mean(axis=0), low, high
