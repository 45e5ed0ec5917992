"""The statistics of a report, valid at the 3-10 seeds RLVR studies can afford (docs/report.md, "Numbers": a
percentile bootstrap over 3 seeds is [min, max] of the seeds and covers 75%, hence t-based intervals).
Pure numpy/scipy functions with typed results; no resampling, so a table is the same on every machine.

Shapes: a training metric is one value per seed, x [S]; an evaluation metric is one value per seed and problem,
x [S, P] (problems aligned by id across groups, so comparisons can pair them).

Intervals (95%, two-sided):
- t_interval(x [S]): Student-t on the per-seed scores (Student 1908): mean ± t_{.975, S-1} · sd/√S.
- crossed_interval(x [S, P]): a crossed seeds × problems design y_sp = μ + a_s + b_p + e_sp. The variance of the
  grand mean, σa²/S + σb²/P + σe²/(SP), is estimated from the two-way ANOVA mean squares as
  (MS_seeds + MS_problems - MS_resid)/(SP) (each component truncated at 0), with Satterthwaite (1946) degrees of
  freedom for the t quantile. When the problems dominate the df approach P-1; when the seeds dominate, S-1.
- curve_band(x [S, T]): the t-interval at every step.

Comparisons (`compare`):
- paired (both groups ran the same seed list; the same seed gives the same initial weights, prompt order and
  sampling seeds in every arm, tests/train/test_train_toy.py::test_same_seed_pairs_arms): training metrics: paired
  t on the per-seed differences; evaluation metrics: the crossed interval of the seed × problem differences (paired
  by seed and by problem). The exact sign-flip permutation p over seeds (Fisher 1935; all 2^S flips, S <= 16)
  goes to the CSV.
- unpaired (different seed lists): Welch (1947) on the per-seed scores; evaluation metrics pair the problems only
  (seed components of both groups + the variance of the per-problem difference of group means).
- Every comparison carries its minimum detectable effect: the |Δ| a two-sided α = 0.05 t-test with the same
  standard error and df detects with 80% power (noncentral t).
- holm(p): Holm's (1979) step-down adjustment over one family (every comparison of one `rlvrlab report` run).

Diversity (`rarefied_distinct`, `expected_distinct`): the expected number of distinct correct forms among m
correct responses (rarefaction, Hurlbert 1971; Sanders 1968) and among k samples, exact from the form counts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import special

LEVEL = 0.95
ALPHA = 0.05
POWER = 0.80
MIN_SEEDS = 2  # an interval needs 2 seeds (a spread); fewer: the table flags the group
MIN_SEEDS_SIGNIFICANCE = 5  # no significance mark below 5 seeds per group (t and permutation tests are too weak)
MAX_EXACT_FLIPS = 16  # sign-flip p enumerates all 2^S flips up to here; beyond, 2^16 seeded random flips


def t_ppf(q: float, df):
    """scipy.stats.t.ppf(q, df), the same floats. For 0 < q < 1 and finite df > 0 that is scipy.special.stdtrit(df, q)
    (scipy's t._ppf; ppf adds scale 1 and loc 0), which spares the processes that only need a t quantile the import of
    scipy.stats (~0.35 s: every sweep worker scores trials with t_interval); anything else goes to scipy.stats
    (tests/report/test_report_stats.py compares the two)."""
    d = np.asarray(df, dtype=np.float64)
    if 0.0 < q < 1.0 and d.size and bool(np.all((d > 0) & np.isfinite(d))):
        return special.stdtrit(d, q) * 1.0 + 0.0
    return _sps().t.ppf(q, df)


def _sps():
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
    method: str  # "t" (Student 1908) | "crossed" (variance components, Satterthwaite df)

    @property
    def halfwidth(self) -> float:
        return (self.high - self.low) / 2


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
        return 2 * _sps().t.sf(z, self.df)


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


def _satterthwaite(terms: list[tuple[np.ndarray, float]]) -> tuple[np.ndarray, np.ndarray]:
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
    """x [..., S, P], a crossed design y_sp = μ + a_s + b_p + e_sp (seeds × problems).

    Variance: Var(ȳ) = σa²/S + σb²/P + σe²/(SP). From the two-way ANOVA (E[MS_S] = σe² + Pσa², E[MS_P] = σe² + Sσb²,
    E[MS_E] = σe²) it is (A + B + E)/(SP) with the seed term A = max(MS_S - MS_E, 0), the problem term
    B = max(MS_P - MS_E, 0) (variance components truncated at 0) and the residual term E = MS_E.

    Degrees of freedom: Satterthwaite (1946) over the three terms (A and B each on their own Satterthwaite df, E on
    (S-1)(P-1)), then shrunk towards the seed df S-1 by the seed term's share w = A/(A+B+E):
    df = (S-1) + (df_satt - (S-1))(1 - w)². Plain Satterthwaite covers only 0.92-0.93 at 3 seeds when the seed
    term is comparable to the others (its df estimate is too large exactly when A is underestimated); the
    shrinkage brings every case the tests simulate to 0.935-0.975 (tests/report/test_report_stats.py, docs/report.md).
    With problems dominating, df -> Satterthwaite (about P-1); with seeds dominating, df -> S-1: the Student-t
    interval of the seed means."""
    x = np.asarray(x, dtype=np.float64)
    s, p = x.shape[-2:]
    ms = mean_squares(x)
    var, df = _crossed_var_df(ms.seeds, ms.problems, ms.resid, s, p)
    return Moments(x.mean(axis=(-2, -1)), np.sqrt(var), df)


def _crossed_var_df(ms_s, ms_p, ms_e, s: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Var(grand mean) and df of crossed_moments from the three mean squares."""
    ms_s, ms_p, ms_e = (np.asarray(v, dtype=np.float64) for v in (ms_s, ms_p, ms_e))
    resid_df = float((s - 1) * (p - 1))
    seed_term = np.maximum(ms_s - ms_e, 0.0)
    problem_term = np.maximum(ms_p - ms_e, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        seed_df = np.where(seed_term > 0, seed_term ** 2 / (ms_s ** 2 / (s - 1) + ms_e ** 2 / resid_df), 1.0)
        problem_df = np.where(problem_term > 0, problem_term ** 2 / (ms_p ** 2 / (p - 1) + ms_e ** 2 / resid_df), 1.0)
        total = seed_term + problem_term + ms_e
        satt = total ** 2 / (seed_term ** 2 / seed_df + problem_term ** 2 / problem_df + ms_e ** 2 / resid_df)
        share = np.where(total > 0, seed_term / total, 1.0)
    satt = np.where(np.isfinite(satt) & (total > 0), satt, float(s - 1))
    df = (s - 1) + (satt - (s - 1)) * (1 - share) ** 2
    return total / (s * p), df


def welch_crossed_moments(a: np.ndarray, b: np.ndarray) -> Moments:
    """a [..., Sa, P], b [..., Sb, P]: different seeds, the same problems. Var(Δ) = σa_A²/Sa + σa_B²/Sb + s²_D/P,
    D_p = ȳ_A·p - ȳ_B·p (it carries the problem-by-arm variance and both groups' residual noise); each group's seed
    component σ̂a² = max(MS_S - MS_E, 0)/P from its ANOVA. df: Satterthwaite over the three terms."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    p = a.shape[-1]
    terms = []
    for x in (a, b):
        ms = mean_squares(x)
        terms.append((np.maximum(ms.seeds - ms.resid, 0.0) / p / x.shape[-2], float(x.shape[-2] - 1)))
    d = a.mean(axis=-2) - b.mean(axis=-2)  # [..., P]
    terms.append((d.var(axis=-1, ddof=1) / p, float(p - 1)))
    var, df = _satterthwaite(terms)
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


# -------------------------------------------------------------------------------------------------- comparisons
def mde(se: float, df: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable |Δ|: the true difference that a two-sided level-alpha t-test with this standard error
    and df rejects with probability `power` (noncentral t: P(|T'| > t_crit) with T' ~ t(df, Δ/se))."""
    if not (se > 0 and df > 0) or not math.isfinite(se):
        return math.nan
    crit = t_ppf(1 - alpha / 2, df)
    sps = _sps()

    def shortfall(nc: float) -> float:
        lower = sps.nct.cdf(-crit, df, nc)  # the wrong-sign tail: tiny, and NaN far out in scipy
        return sps.nct.sf(crit, df, nc) + (lower if math.isfinite(lower) else 0.0) - power

    high = crit + 3.0  # widen until the power at `high` exceeds the target (nct is unstable far out)
    while shortfall(high) < 0:
        high *= 1.5
    from scipy import optimize

    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-12) * se)


def signflip_p(d: np.ndarray, rng_seed: int = 0) -> float:
    """Two-sided sign-flip permutation p of the mean of paired differences d [S] (Fisher 1935): the share of
    the 2^S sign patterns whose |mean| is at least the observed one. Exact for S <= MAX_EXACT_FLIPS; beyond,
    2^16 seeded random flips plus the observed pattern."""
    d = np.asarray(d, dtype=np.float64)
    s = len(d)
    if s <= MAX_EXACT_FLIPS:
        signs = 1.0 - 2.0 * ((np.arange(2 ** s)[:, None] >> np.arange(s)[None, :]) & 1)  # [2^S, S]
        extra = 0
    else:
        signs = np.random.default_rng(rng_seed).choice([-1.0, 1.0], size=(2 ** 16, s))
        extra = 1
    observed = abs(d.sum())
    hits = int((np.abs(signs @ d) >= observed * (1 - 1e-12)).sum())
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


# ------------------------------------------------------------------------------------------------ seeds needed
def seeds_for_halfwidth(sd: float, halfwidth: float, *, level: float = LEVEL, max_seeds: int = 10_000) -> int:
    """The smallest S >= 2 with t_{(1+level)/2, S-1} · sd/√S <= halfwidth (planning from an observed sd)."""
    if not halfwidth > 0:
        raise ValueError(f"halfwidth must be > 0, got {halfwidth}")
    if not math.isfinite(sd):
        return max_seeds
    for s in range(2, max_seeds + 1):
        if t_ppf(0.5 + level / 2, s - 1) * sd / math.sqrt(s) <= halfwidth:
            return s
    return max_seeds


def seeds_for_halfwidth_crossed(x: np.ndarray, halfwidth: float, *, level: float = LEVEL,
                                max_seeds: int = 1000) -> Optional[int]:
    """x [S, P]: the smallest S' >= 2 whose crossed interval (crossed_moments) would have half-width <= halfwidth
    on the same problems, from the variance components of x (σa² = (MS_S - MS_E)/P, σb² = (MS_P - MS_E)/S,
    σe² = MS_E, each >= 0) and their expected mean squares at S'. None when the problems alone are wider
    (more seeds cannot help: the problem term σb²/P does not shrink)."""
    if not halfwidth > 0:
        raise ValueError(f"halfwidth must be > 0, got {halfwidth}")
    x = np.asarray(x, dtype=np.float64)
    s, p = x.shape
    ms = mean_squares(x)
    var_a = max(float(ms.seeds - ms.resid), 0.0) / p
    var_b = max(float(ms.problems - ms.resid), 0.0) / s
    var_e = float(ms.resid)
    if var_b / p * _sps().norm.ppf(0.5 + level / 2) ** 2 >= halfwidth ** 2:
        return None
    for n in range(2, max_seeds + 1):
        var, df = _crossed_var_df(var_e + p * var_a, var_e + n * var_b, var_e, n, p)
        if t_ppf(0.5 + level / 2, df) * math.sqrt(float(var)) <= halfwidth:
            return n
    return None


# --------------------------------------------------------------------------------------------------- diversity
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
