"""Comparisons of two groups of a report and their multiplicity (docs/report.md, "Numbers": why each, and what was
measured).

- paired (both groups ran the same seed list, so the same seed gives every arm the same initial weights, prompt
  order and sampling seeds): a paired t on the per-seed differences, for evaluations the crossed interval of the
  seed × problem differences; the exact sign-flip p over seeds goes to the CSV. Unpaired: Welch (problems still
  paired for evaluations).
- Every comparison carries its minimum detectable effect (80% power, noncentral t); `claim` gives it at the Holm
  level. equivalence_p: TOST at a declared margin. holm(p): Holm's step-down adjustment over one family. claim:
  whether a comparison is a claim (Holm p < 0.05, >= 5 seeds per group; a max-statistic also its sign-flip p)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rlvrlab.stats.intervals import (
    LEVEL,
    Moments,
    crossed_moments,
    scipy_stats,
    t_moments,
    t_ppf,
    welch_crossed_moments,
    welch_moments,
)

ALPHA = 0.05
POWER = 0.80
MIN_SEEDS_SIGNIFICANCE = 5  # no significance mark below 5 seeds per group (t and permutation tests are too weak)
MAX_EXACT_FLIPS = 16  # sign-flip p enumerates all 2^S flips up to here; beyond, 2^16 seeded random flips


@dataclass(frozen=True)
class Comparison:
    delta: float  # mean(a) - mean(b)
    low: float
    high: float
    se: float
    df: float
    p: float  # two-sided t p-value (paired t or Welch; crossed for evaluation metrics)
    p_signflip: Optional[float]  # exact sign-flip permutation p over seeds (paired only)
    mde: float  # minimum detectable |Δ| at 80% power, α = 0.05, given se and df
    paired: bool
    test: str  # "paired t" | "Welch" | "paired crossed" | "Welch crossed"
    n_a: int
    n_b: int
    prob_improvement: float

    @property
    def may_be_significant(self) -> bool:
        """Enough seeds per group for a significance mark (the interval and p are shown either way)."""
        return min(self.n_a, self.n_b) >= MIN_SEEDS_SIGNIFICANCE


def mde(se: float, df: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable |Δ|: the true difference that a two-sided level-alpha t-test with this standard error
    and df rejects with probability `power` (noncentral t: P(|T'| > t_crit) with T' ~ t(df, Δ/se))."""
    if not (se > 0 and df > 0) or not math.isfinite(se):
        return math.nan
    crit = t_ppf(1 - alpha / 2, df)
    sps = scipy_stats()

    def shortfall(nc: float) -> float:
        lower = sps.nct.cdf(-crit, df, nc)  # the wrong-sign tail: tiny, and NaN far out in scipy
        return sps.nct.sf(crit, df, nc) + (lower if math.isfinite(lower) else 0.0) - power

    high = crit + 3.0  # widen until the power at `high` exceeds the target (nct is unstable far out)
    while shortfall(high) < 0:
        high *= 1.5
    from scipy import optimize

    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-12) * se)


def equivalence_p(delta, se, df, margin: float):
    """TOST, two one-sided tests (Schuirmann 1987) of H0: |Δ| >= M against H1: |Δ| < M, on the comparison's own
    estimate, standard error and t df (paired t, Welch or crossed: the same t as its two-sided p):
    p = max(p_lower, p_upper), p_lower = P(T > (Δ̂ + M)/se) for H0: Δ <= -M, p_upper = P(T < (Δ̂ - M)/se) for
    H0: Δ >= M, T ~ t(df). It is an intersection-union test (Berger 1982): each one-sided test at α, no α/2, and p < α
    shows |Δ| < M at level α; at |Δ| = M its rejection rate is at most α, and α exactly when M/se is large
    (tests/report/test_equivalence.py). se = 0: 0 when |Δ̂| < M, else 1. Vectorised over array arguments."""
    delta, se, df = (np.asarray(v, dtype=np.float64) for v in (delta, se, df))
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    sps = scipy_stats()
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = sps.t.sf((delta + margin) / se, df)
        upper = sps.t.cdf((delta - margin) / se, df)
    p = np.where(se > 0, np.maximum(lower, upper), np.where(np.abs(delta) < margin, 0.0, 1.0))
    return float(p) if p.ndim == 0 else p


TIE_TOLERANCE = 1e-9  # |flipped sum| within this share of Σ|d| of the observed one is a tie (signflip_p)


def signflip_p(d: np.ndarray, rng_seed: int = 0) -> float:
    """Two-sided sign-flip permutation p of the mean of paired differences d [S] (Fisher 1935): the share of
    the 2^S sign patterns whose |sum| is at least the observed one. Exact for S <= MAX_EXACT_FLIPS; beyond,
    2^16 seeded random flips plus the observed pattern.

    Ties: a pattern whose exact |sum| equals the observed one (it flips a subset of d summing to 0, e.g. every
    pattern when Σd = 0) counts, but float sums of the same exact values differ by rounding. A pattern counts when
    |Σ ε_i d_i| >= |Σ d_i| - TIE_TOLERANCE · Σ|d_i|: the rounding of a float sum of S terms is at most
    (S-1)·2^-53·Σ|d_i| (Higham 2002, eq. 4.4), ~2e-15 of Σ|d| at S = 16, and of the d_i themselves (means over P
    problems) at most ~P·2^-53 relative; both are far below 1e-9, while distinct exact sums of scores on a grid of
    step 1/N (pass@1 over n samples and P problems: N = n·P <= 1e8) differ by at least 1/N >= 1e-9 · Σ|d| for
    Σ|d| <= 10. Checked against exact rational enumeration (tests/stats/test_signflip_ties.py)."""
    d = np.asarray(d, dtype=np.float64)
    s = len(d)
    if s <= MAX_EXACT_FLIPS:
        signs = 1.0 - 2.0 * ((np.arange(2 ** s)[:, None] >> np.arange(s)[None, :]) & 1)  # [2^S, S]
        extra = 0
    else:
        signs = np.random.default_rng(rng_seed).choice([-1.0, 1.0], size=(2 ** 16, s))
        extra = 1
    tolerance = TIE_TOLERANCE * float(np.abs(d).sum())
    hits = int((np.abs(signs @ d) >= abs(d.sum()) - tolerance).sum())
    return (hits + extra) / (len(signs) + extra)


def probability_of_improvement(a: np.ndarray, b: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y) for X a seed score of a and Y one of b (rliable, one task)."""
    x, y = seed_scores(a), seed_scores(b)
    return float((x[:, None] > y[None, :]).mean() + 0.5 * (x[:, None] == y[None, :]).mean())


def seed_scores(x: np.ndarray) -> np.ndarray:
    """[S] or [S, P] -> [S]: each seed's score (its mean over problems, ignoring undefined (NaN) problems)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        return x
    return np.nanmean(np.where(np.isnan(x).all(axis=1, keepdims=True), 0.0, x), axis=1)


def _comparison(m: Moments, a: np.ndarray, b: np.ndarray, *, paired: bool, test: str, flips: Optional[np.ndarray],
                level: float) -> Comparison:
    low, high = m.bounds(level)
    se, df = float(m.se), float(m.df)
    return Comparison(float(m.estimate), float(low), float(high), se, df, float(m.p()),
                      signflip_p(flips) if flips is not None else None, mde(se, df), paired, test,
                      a.shape[0], b.shape[0], probability_of_improvement(a, b))


def paired_t(a: np.ndarray, b: np.ndarray, level: float = LEVEL) -> Comparison:
    """a, b [S]: the same seeds in the same order. Paired t (Student 1908) on d = a - b, plus the sign-flip p."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return _comparison(t_moments(a - b), a, b, paired=True, test="paired t", flips=a - b, level=level)


def welch(a: np.ndarray, b: np.ndarray, level: float = LEVEL) -> Comparison:
    """a [Sa], b [Sb]: Welch's (1947) unequal-variance t."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return _comparison(welch_moments(a, b), a, b, paired=False, test="Welch", flips=None, level=level)


def paired_crossed(a: np.ndarray, b: np.ndarray, level: float = LEVEL) -> Comparison:
    """a, b [S, P], the same seeds and problems: the crossed interval of d[s, p] = a - b (paired by seed and by
    problem); the sign-flip p is over the seeds' mean differences (the benchmark's problems held fixed)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = a - b
    return _comparison(crossed_moments(d), a, b, paired=True, test="paired crossed", flips=d.mean(axis=1),
                       level=level)


def welch_crossed(a: np.ndarray, b: np.ndarray, level: float = LEVEL) -> Comparison:
    """a [Sa, P], b [Sb, P]: different seeds, the same problems (see welch_crossed_moments)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return _comparison(welch_crossed_moments(a, b), a, b, paired=False, test="Welch crossed", flips=None,
                       level=level)


def compare(a: np.ndarray, b: np.ndarray, *, paired: bool, level: float = LEVEL) -> Comparison:
    """The report's comparison of a with b: [S] (training) or [S, P] (evaluation) inputs; `paired` when both ran
    the same seed list in the same order. Matrices with undefined (NaN) entries (diversity, rarefaction) are
    compared per seed: paired, each seed's mean difference over the problems defined in both arms."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != b.ndim or (a.ndim == 2 and a.shape[1] != b.shape[1]):
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}: the same problems are needed")
    if paired and a.shape[0] != b.shape[0]:
        raise ValueError(f"a paired comparison needs the same seeds, got {a.shape[0]} and {b.shape[0]}")
    if a.ndim == 1:
        return paired_t(a, b, level) if paired else welch(a, b, level)
    if np.isnan(a).any() or np.isnan(b).any():
        if not paired:
            return welch(seed_scores(a), seed_scores(b), level)
        d = seed_scores(a - b)
        return _comparison(t_moments(d), a, b, paired=True, test="paired t (problems paired)", flips=d, level=level)
    if a.shape[1] < 2:
        return compare(a[:, 0], b[:, 0], paired=paired, level=level)
    return paired_crossed(a, b, level) if paired else welch_crossed(a, b, level)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values, in the input order."""
    m = len(p_values)
    order = np.argsort(p_values, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted.tolist()


def selected(p: float, candidates: int) -> float:
    """p of a comparison whose group was picked as the best of `candidates` cells (Bonferroni over the cells it was
    selected from: the smallest of N p-values needs N·p)."""
    return min(1.0, p * candidates)


def holm_level(family_size: int, selected_from: Optional[int] = None, alpha: float = ALPHA) -> float:
    """The level at which Holm (1979) is sure to test a comparison of a family of m: its first step, alpha/m (a later
    step's alpha/(m - k + 1) applies only once k - 1 other comparisons were rejected, which depends on their data).
    A selected cell's p is multiplied by N before Holm (`selected`), so its level is alpha/(m·N)."""
    return alpha / (family_size * (selected_from or 1))


def signflip_seeds(level: float) -> int:
    """The fewest seeds S whose exact sign-flip p can be below `level`: its smallest value is 2/2^S (the observed
    signs and their mirror image), so S > log2(2/level): 6 at 0.05 (2/2^5 = 0.0625), 9 at 0.005."""
    return int(math.floor(math.log2(2.0 / level))) + 1


@dataclass(frozen=True)
class Claim:
    """A comparison judged by the report's rule for a claim, in its Holm family."""

    level: float  # Holm first-step level alpha/(m·N) (holm_level), the level of the MDE
    mde: float  # the |Δ| the claim detects with 80% power at `level` (t; inf when the rule cannot be met)
    claim: bool
    note: str  # why a max-statistic cannot be a claim ("" otherwise)


def claim(result: Comparison, p_holm: float, level: float, *, max_statistic: bool = False) -> Claim:
    """A claim needs Holm p < ALPHA and >= MIN_SEEDS_SIGNIFICANCE seeds per group. A max-statistic (a per-run maximum
    or minimum: skewed, docs/report.md "Skewed data") also needs its exact sign-flip p (Fisher 1935) below ALPHA:
    paired seeds, and at least signflip_seeds(ALPHA) = 6 of them. The paired t alone rejects 0.16-0.18 of mean-zero
    skewed differences at 5-10 seeds; the sign-flip makes such a claim impossible at 5 and cuts it to 0.11-0.16 at
    6-10 (tests/stats/test_stats_montecarlo.py). It is a distribution-free check, not the family's error control:
    where it is exact (arms exchangeable within a seed, so the differences are symmetric) the t is conservative and
    its Holm p already controls the family; required at the Holm level 0.05/m it would need 2/2^S < 0.05/m (11 seeds
    for a family of 36) without restoring the level under skew either (no test can: Bahadur & Savage 1956).

    The MDE is the t's at `level` (80% power): with it as the true difference, the comparison is rejected by Holm
    with probability >= 0.80 whatever the other comparisons are (0.79-0.80 simulated with every other comparison
    null). For a max-statistic it is a lower bound (the sign-flip must reject too), and inf below 6 seeds."""
    detectable = mde(result.se, result.df, alpha=level)
    enough = p_holm < ALPHA and result.may_be_significant
    if not max_statistic:
        return Claim(level, detectable, enough, "")
    if result.p_signflip is None:
        return Claim(level, math.inf, False, "no sign-flip p (unpaired): no claim on a max-statistic")
    needed = signflip_seeds(ALPHA)
    if min(result.n_a, result.n_b) < needed:
        return Claim(level, math.inf, False, f"sign-flip needs ≥ {needed} seeds")
    return Claim(level, detectable, enough and result.p_signflip < ALPHA, "")
