"""Intervals of a report (95%, two-sided; pure numpy/scipy, no resampling, so a table is the same on every machine).

Shapes: a training metric is one value per seed, x [S]; an evaluation metric is one value per seed and problem,
x [S, P]. The Moments functions work on any leading (Monte Carlo) axes, which the tests use.

- t_interval(x [S]): Student-t on the per-seed scores (Student 1908): mean ± t_{.975, S-1} · sd/√S.
- crossed_interval(x [S, P]): a crossed seeds × problems design y_sp = μ + a_s + b_p + e_sp (crossed_moments).
- curve_band(x [S, T]): the t-interval at every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

LEVEL = 0.95
MIN_SEEDS = 2  # an interval needs 2 seeds (a spread); fewer: the table flags the group


def t_ppf(q: float, df):
    """scipy.stats.t.ppf(q, df), the same floats. For 0 < q < 1 and finite df > 0 that is scipy.special.stdtrit(df, q)
    (scipy's t._ppf; ppf adds scale 1 and loc 0), which spares the processes that only need a t quantile the import of
    scipy.stats (~0.35 s: every sweep worker scores trials with t_interval); anything else goes to scipy.stats
    (tests/stats/test_intervals_and_tests.py compares the two)."""
    d = np.asarray(df, dtype=np.float64)
    if 0.0 < q < 1.0 and d.size and bool(np.all((d > 0) & np.isfinite(d))):
        return special.stdtrit(d, q) * 1.0 + 0.0
    return scipy_stats().t.ppf(q, df)


def scipy_stats():
    """scipy.stats, imported where a function needs more than t_ppf."""
    from scipy import stats as sps

    return sps


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    se: float  # standard error of the mean
    df: float  # degrees of freedom of the t quantile
    n_seeds: int
    method: str  # "t" (Student 1908) | "crossed" (variance components, Satterthwaite df) | "stein" (sweep.seeds)

    @property
    def halfwidth(self) -> float:
        return (self.high - self.low) / 2


def _nan_interval(mean: float, n: int, method: str) -> Interval:
    return Interval(mean, math.nan, math.nan, math.nan, math.nan, n, method)


# ------------------------------------------------------------------------- moments (vectorised over leading axes)
@dataclass(frozen=True)
class Moments:
    """Estimate, standard error and t degrees of freedom; arrays over any leading (Monte Carlo) axes, or floats."""

    estimate: np.ndarray
    se: np.ndarray
    df: np.ndarray

    def bounds(self, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
        half = t_ppf(0.5 + level / 2, self.df) * self.se
        return self.estimate - half, self.estimate + half

    def p(self) -> np.ndarray:
        """Two-sided t p-value of estimate = 0 (1 when estimate and se are both 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.abs(self.estimate) / self.se
        z = np.where(self.se > 0, z, np.where(self.estimate == 0, 0.0, np.inf))
        return 2 * scipy_stats().t.sf(z, self.df)


def t_moments(x: np.ndarray) -> Moments:
    """x [..., S]: mean, sd/√S, S-1 (Student 1908)."""
    x = np.asarray(x, dtype=np.float64)
    s = x.shape[-1]
    return Moments(x.mean(axis=-1), x.std(axis=-1, ddof=1) / math.sqrt(s), np.full(x.shape[:-1], float(s - 1)))


def welch_moments(a: np.ndarray, b: np.ndarray) -> Moments:
    """a [..., Sa], b [..., Sb]: Welch (1947): se² = va/Sa + vb/Sb, Welch-Satterthwaite df."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = a.shape[-1], b.shape[-1]
    va, vb = a.var(axis=-1, ddof=1) / na, b.var(axis=-1, ddof=1) / nb
    var = va + vb
    with np.errstate(divide="ignore", invalid="ignore"):
        df = var ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    df = np.where(var > 0, df, float(na + nb - 2))
    return Moments(a.mean(axis=-1) - b.mean(axis=-1), np.sqrt(var), df)


Term = tuple[np.ndarray, "float | np.ndarray"]  # a mean square (or a sum of them) and its degrees of freedom


def satterthwaite(terms: Sequence[Term]) -> tuple[np.ndarray, np.ndarray]:
    """Σ terms and their Satterthwaite (1946) df: (Σ t)² / Σ t²/df_t; terms are (value, df) with value >= 0."""
    total = np.asarray(sum(t for t, _ in terms), dtype=np.float64)
    denominator = sum(t ** 2 / d for t, d in terms)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(denominator > 0, total ** 2 / denominator, float(terms[0][1]))
    return total, df


@dataclass(frozen=True)
class MeanSquares:
    seeds: np.ndarray  # P · Σ_s (ȳ_s - ȳ)² / (S-1)
    problems: np.ndarray  # S · Σ_p (ȳ_p - ȳ)² / (P-1)
    resid: np.ndarray  # Σ (y - ȳ_s - ȳ_p + ȳ)² / ((S-1)(P-1))


def mean_squares(x: np.ndarray) -> MeanSquares:
    """Two-way ANOVA without replication of x [..., S, P] (S >= 2, P >= 2)."""
    x = np.asarray(x, dtype=np.float64)
    s, p = x.shape[-2:]
    grand = x.mean(axis=(-2, -1), keepdims=True)
    seed_means, problem_means = x.mean(axis=-1, keepdims=True), x.mean(axis=-2, keepdims=True)
    ms_s = p * ((seed_means - grand) ** 2).sum(axis=(-2, -1)) / (s - 1)
    ms_p = s * ((problem_means - grand) ** 2).sum(axis=(-2, -1)) / (p - 1)
    ms_e = ((x - seed_means - problem_means + grand) ** 2).sum(axis=(-2, -1)) / ((s - 1) * (p - 1))
    return MeanSquares(ms_s, ms_p, ms_e)


def crossed_moments(x: np.ndarray) -> Moments:
    """x [..., S, P], a crossed design y_sp = μ + a_s + b_p + e_sp (seeds × problems, both random draws).

    Variance: Var(ȳ) = σa²/S + σb²/P + σe²/(SP) = (K + B)/(SP) with K = E[MS_S] = σe² + Pσa², P times the variance of a
    seed mean, and B = Sσb² (two-way ANOVA: E[MS_P] = σe² + Sσb², E[MS_E] = σe²). Estimates: K̂ = MS_S, unbiased, on
    the seeds' own S-1 df (it is P times the sample variance of the seed means, a scaled χ²_{S-1}); B̂ = max(MS_P -
    MS_E, 0). With B̂ = 0 the interval is the Student-t interval of the seed means, exact for the problems drawn.

    Degrees of freedom: Satterthwaite (1946) over the two terms, B̂ on its Satterthwaite df
    B̂²/(MS_P²/(P-1) + MS_E²/((S-1)(P-1))); then shrunk towards S-1 by the seed term's share w = K̂/(K̂ + B̂):
    df = (S-1) + (df_satt - (S-1))(1 - w)² (a Satterthwaite df estimated from the data is too large exactly when K̂
    is underestimated). With problems dominating, df -> about P-1; with seeds (or the residual) dominating, S-1.

    The error it controls: unconditional 95% coverage over repeated experiments (new seeds and, for a single arm,
    new problems), not coverage conditional on MS_S <= MS_E; measured, and why not the alternatives: docs/report.md,
    "Numbers" (tests/stats/test_stats_montecarlo.py)."""
    x = np.asarray(x, dtype=np.float64)
    s, p = x.shape[-2:]
    ms = mean_squares(x)
    var, df = crossed_var_df(ms.seeds, ms.problems, ms.resid, s, p)
    return Moments(x.mean(axis=(-2, -1)), np.sqrt(var), df)


def difference_term(plus: Term, minus: Sequence[Term]) -> tuple[np.ndarray, np.ndarray]:
    """max(m_+ - Σ m_-, 0) of mean squares (value, df) and its Satterthwaite df (value² / Σ m²/df over every mean square
    in it; 1 where the value is 0, where it adds nothing to a Satterthwaite sum)."""
    value = np.maximum(plus[0] - sum(m for m, _ in minus), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = value ** 2 / (plus[0] ** 2 / plus[1] + sum(m ** 2 / d for m, d in minus))
    return value, np.where(value > 0, df, 1.0)


def crossed_var_df(ms_s, ms_p, ms_e, s: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Var(grand mean) and df of crossed_moments from the three mean squares."""
    ms_s, ms_p, ms_e = (np.asarray(v, dtype=np.float64) for v in (ms_s, ms_p, ms_e))
    seed_term = ms_s  # K̂ = MS_S, unbiased for K = σe² + Pσa² (no floor, no truncation)
    problem_term, problem_df = difference_term((ms_p, float(p - 1)), [(ms_e, float((s - 1) * (p - 1)))])
    total, satt = satterthwaite([(seed_term, float(s - 1)), (problem_term, problem_df)])
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, seed_term / total, 1.0)
    satt = np.where(np.isfinite(satt) & (total > 0), satt, float(s - 1))
    return total / (s * p), (s - 1) + (satt - (s - 1)) * (1 - share) ** 2


def welch_crossed_moments(a: np.ndarray, b: np.ndarray) -> Moments:
    """a [..., Sa, P], b [..., Sb, P]: different seeds, the same problems. Δ = ȳ_A - ȳ_B has
    Var(Δ) = K_A/(P·Sa) + K_B/(P·Sb) + Var_p(b_A - b_B)/P, with K = E[MS_S] = σe² + Pσa² of each group (P times the
    variance of its seed means) and the problem-by-arm variance Var_p(b_A - b_B). Estimates: K̂ = MS_S of each group's
    ANOVA (unbiased, as in crossed_moments), on the group's S-1 df; the problem term from
    D_p = ȳ_A·p - ȳ_B·p, whose variance over problems is Var_p(b_A - b_B) + σe_A²/Sa + σe_B²/Sb:
    max(s²_D - MS_E,A/Sa - MS_E,B/Sb, 0)/P on its Satterthwaite df. df: Satterthwaite over the three terms.
    Simulated (5 and 6 seeds, 102 problems, Pσa² = σe² in each group; tests/stats/test_stats_montecarlo.py): type-I
    error 0.049, coverage 0.951 (4,000 draws)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    p = a.shape[-1]
    terms: list[Term] = []
    residuals: list[Term] = []
    for x in (a, b):
        s = x.shape[-2]
        ms = mean_squares(x)
        terms.append((ms.seeds / (p * s), float(s - 1)))
        residuals.append((ms.resid / (p * s), float((s - 1) * (p - 1))))
    d = a.mean(axis=-2) - b.mean(axis=-2)  # [..., P]
    terms.append(difference_term((d.var(axis=-1, ddof=1) / p, float(p - 1)), residuals))
    var, df = satterthwaite(terms)
    return Moments(a.mean(axis=(-2, -1)) - b.mean(axis=(-2, -1)), np.sqrt(var), df)


# --------------------------------------------------------------------------------------------------- intervals
def _interval(m: Moments, n: int, method: str, level: float) -> Interval:
    low, high = m.bounds(level)
    return Interval(float(m.estimate), float(low), float(high), float(m.se), float(m.df), n, method)


def t_interval(x: Sequence[float] | np.ndarray, level: float = LEVEL) -> Interval:
    """x [S] per-seed scores: mean ± t_{(1+level)/2, S-1} · sd/√S (Student 1908). NaN bounds for one seed."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return _nan_interval(float(x.mean()), len(x), "t")
    return _interval(t_moments(x), len(x), "t", level)


def crossed_interval(x: np.ndarray, level: float = LEVEL) -> Interval:
    """x [S, P]: mean over seeds and problems with the variance-components t-interval of crossed_moments."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] < 2:
        return _nan_interval(float(x.mean()), x.shape[0], "crossed")
    if x.shape[1] < 2:
        return _interval(t_moments(x[:, 0]), x.shape[0], "t", level)
    return _interval(crossed_moments(x), x.shape[0], "crossed", level)


def interval(x: np.ndarray, level: float = LEVEL) -> Interval:
    """The report's interval for x [S] (Student t) or x [S, P] (crossed)."""
    x = np.asarray(x, dtype=np.float64)
    return t_interval(x, level) if x.ndim == 1 else crossed_interval(x, level)


def curve_band(x: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [S, T] (a metric per seed and step): mean per step and the Student-t band over seeds (NaN for 1 seed)."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] < 2:
        nan = np.full(x.shape[1:], np.nan)
        return x.mean(axis=0), nan, nan
    low, high = t_moments(x.T).bounds(level)
    return x.mean(axis=0), low, high
