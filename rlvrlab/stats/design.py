"""Planning a study from a pilot (`rlvrlab plan`): the variance components of a seeds × problems table, the MDE of
a design (seeds S × samples per problem n × problems P), and the smallest design that reaches a target MDE.

Model of one arm's score, or of a paired difference of two arms on the same seeds and problems (y_sp: the mean of n
sampled 0/1 verdicts of seed s on problem p):

    y_sp = μ + a_s + b_p + c_sp + e_sp,   Var(a) = σ²_seed, Var(b) = σ²_problem, Var(c) = σ²_seed×problem,
    Var(e_sp) = q_sp(1 - q_sp)/n, its mean over cells β/n (β: the per-sample Bernoulli variance).

A seed's mean over P problems varies over seeds with V(n, P) = σ²_seed + (σ²_seed×problem + β/n)/P, and the mean
difference of S seeds has Var = V(n, P)/S + σ²_problem/P: the report's paired crossed comparison of an evaluation
(stats.crossed_moments: the problems a draw from the benchmark's population); with per-seed values only (a
training metric) it is V/S, the paired t by seed. The MDE of a design is the |Δ| a two-sided test at the Holm
first-step level α/M detects with power 0.8: λ(S)·√Var, λ from the noncentral t on S - 1 df (stats.mde), not the
normal approximation (the crossed comparison's Satterthwaite df is >= S - 1, so it is exact for the paired t and
slightly conservative for the crossed one; tests/stats/test_design.py simulates both). Estimates are the two-way
ANOVA's (stats.mean_squares): σ²_seed = (MS_S - MS_E)/P, σ²_problem = (MS_P - MS_E)/S, σ²_seed×problem = MS_E - β̂/n,
each floored at 0, with β̂ = mean q̂(1 - q̂)·n/(n - 1) (unbiased: E[q̂(1 - q̂)] = q(1 - q)(n - 1)/n); for a
difference of two arms β is the sum of theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rlvrlab.stats.comparisons import ALPHA, POWER, mde
from rlvrlab.stats.intervals import mean_squares

MAX_SEEDS = 1000


@dataclass(frozen=True)
class Components:
    """Variance components of a per-(seed, problem) score (or a paired difference); a pilot without per-problem
    values has only `seed` (the variance of a per-seed score) and problem terms 0 (nan for `problem`)."""

    seed: float
    problem: float
    seed_problem: float
    bernoulli: float  # per-sample variance β: one sampled verdict's, summed over the arms of a difference

    def per_seed_var(self, samples: Optional[int], problems: Optional[int]) -> float:
        """V(n, P): the variance over seeds of a seed's mean score over P problems of n samples each."""
        if problems is None:
            return self.seed
        sampling = self.bernoulli / samples if samples else 0.0
        return self.seed + (self.seed_problem + sampling) / problems

    def mean_var(self, seeds: int, samples: Optional[int], problems: Optional[int]) -> float:
        """Var of the mean over S seeds (and P problems): V(n, P)/S + σ²_problem/P."""
        between = self.problem / problems if problems is not None and math.isfinite(self.problem) else 0.0
        return self.per_seed_var(samples, problems) / seeds + between


@dataclass(frozen=True)
class Design:
    seeds: int
    samples: Optional[int]  # None: the pilot's (no per-problem values to plan them from)
    problems: Optional[int]
    mde: float  # at the level it was computed for


def bernoulli_variance(rates: np.ndarray, samples: int):
    """β̂ of rates [..., S, P]: the per-sample Bernoulli variance, unbiased from pass rates of `samples` draws each."""
    rates = np.asarray(rates, dtype=np.float64)
    if samples < 2:
        raise ValueError(f"the per-sample variance needs >= 2 samples per problem, got {samples}")
    return _plain(np.mean(rates * (1.0 - rates), axis=(-2, -1)) * samples / (samples - 1))


def components(x: np.ndarray, bernoulli, samples: int) -> Components:
    """The components of x [..., S, P] (S, P >= 2): one arm's pass rates, or a paired difference's, over seeds ×
    problems, each the mean of `samples` draws whose per-sample variance is `bernoulli` (bernoulli_variance).
    Leading axes (simulated pilots) give arrays in the fields."""
    x = np.asarray(x, dtype=np.float64)
    s, p = x.shape[-2:]
    if s < 2 or p < 2:
        raise ValueError(f"variance components need >= 2 seeds and >= 2 problems, got {s} × {p}")
    ms = mean_squares(x)
    return Components(seed=_plain(np.maximum(ms.seeds - ms.resid, 0.0) / p),
                      problem=_plain(np.maximum(ms.problems - ms.resid, 0.0) / s),
                      seed_problem=_plain(np.maximum(ms.resid - np.asarray(bernoulli) / samples, 0.0)),
                      bernoulli=_plain(np.asarray(bernoulli, dtype=np.float64)))


def _plain(value: np.ndarray):
    """A 0-d result as a float, an array as itself."""
    return float(value) if np.ndim(value) == 0 else value


def seeds_only(scores: np.ndarray) -> Components:
    """A pilot with per-seed scores only (x [S], or [pairs, S] pooled): the variance of a per-seed score."""
    scores = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    return Components(seed=float(np.mean(scores.var(axis=-1, ddof=1))), problem=math.nan, seed_problem=0.0,
                      bernoulli=0.0)


def pooled(parts: list[Components]) -> Components:
    """The mean of several pairs' (or groups') components: the plan for a typical comparison of the family (none:
    every component nan)."""
    if not parts:
        return Components(math.nan, math.nan, math.nan, math.nan)
    return Components(*(float(np.mean([getattr(c, name) for c in parts]))
                        for name in ("seed", "problem", "seed_problem", "bernoulli")))


def noncentrality(seeds: int, level: float, power: float = POWER) -> float:
    """λ(S): the standardised |Δ|/(sd/√S) a two-sided paired t on S - 1 df at `level` detects with `power`."""
    return mde(1.0, seeds - 1, alpha=level, power=power)


def design_mde(parts: Components, seeds: int, samples: Optional[int], problems: Optional[int], *,
               comparisons: int = 1, alpha: float = ALPHA, power: float = POWER) -> float:
    """The MDE of S seeds × n samples × P problems at the Holm first-step level alpha/comparisons."""
    if seeds < 2:
        return math.inf
    return noncentrality(seeds, alpha / comparisons, power) * math.sqrt(parts.mean_var(seeds, samples, problems))


def problems_needed(parts: Components, seeds: int, samples: int, target: float, level: float,
                    power: float = POWER) -> Optional[int]:
    """The fewest problems P with MDE(S, n, P) <= target (None when the seed term alone is too wide):
    P >= ((σ²_seed×problem + β/n)/S + σ²_problem) / ((target/λ)² - σ²_seed/S)."""
    room = (target / noncentrality(seeds, level, power)) ** 2 - parts.seed / seeds
    if room <= 0:
        return None
    between = parts.problem if math.isfinite(parts.problem) else 0.0
    return max(1, math.ceil(((parts.seed_problem + parts.bernoulli / samples) / seeds + between) / room
                            * (1 - 1e-12)))


def smallest_design(parts: Components, target: float, *, comparisons: int = 1, samples: Optional[int] = None,
                    problems: Optional[int] = None, alpha: float = ALPHA, power: float = POWER,
                    max_seeds: int = MAX_SEEDS) -> Optional[Design]:
    """The cheapest design with MDE <= target: the fewest seeds S (training runs cost most) with at most `samples`
    per problem and `problems` problems, then at that S the fewest samples n·P evaluated (ties: fewer problems).
    None when even max_seeds seeds do not reach it."""
    if not target > 0:
        raise ValueError(f"the target MDE must be > 0, got {target}")
    level = alpha / comparisons
    seeds = next((s for s in range(2, max_seeds + 1)
                  if design_mde(parts, s, samples, problems, alpha=level, power=power) <= target), None)
    if seeds is None:
        return None
    if problems is None or samples is None:
        return Design(seeds, samples, problems, design_mde(parts, seeds, samples, problems, alpha=level, power=power))
    options = []
    for n in sorted({*(2 ** k for k in range(int(math.log2(samples)) + 1)), samples}):
        needed = problems_needed(parts, seeds, n, target, level, power)
        if needed is not None and needed <= problems:
            options.append((n * needed, needed, n))
    _, p, n = min(options, default=(0, problems, samples))
    return Design(seeds, n, p, design_mde(parts, seeds, n, p, alpha=level, power=power))
