"""Intervals and comparisons of an adaptive-seed study (`seeds: {initial: n0, max, halfwidth}`, rlvrlab.sweep.seeds):
Stein's (1945) two-stage rule, exact under normality for every metric of the study, not only the objective the seed
count was chosen from. A trial runs seeds 0..n0-1 (stage one), then grows once to seeds 0..N-1, N chosen from the
stage-one SD of the objective. Its values are x [N] in seed order: x[:n0] is stage one.

- stein_moments(x, n0): X̄_N, s0/√N, n0-1 df, s0 = SD(x[:n0]); the interval X̄_N ± t_{.975, n0-1} · s0/√N.
- paired_stein(a, b, n0): a [Na], b [Nb] two trials of one study (seeds 0..Na-1, 0..Nb-1): the differences
  d_s = a_s - b_s on the M = min(Na, Nb) common seeds, Δ = d̄_M ± t_{.975, n0-1} · s0(d)/√M, s0(d) = SD(d[:n0]).

Why both are exact for any metric (the stage-one covariance is independent of the stage-one means, and N and M
are functions of it alone), and how the plain t and Welch fail here (simulated in tests/report/test_stein_report.py):
docs/report.md, "Adaptive seeds"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from rlvrlab.stats.comparisons import Comparison, mde, probability_of_improvement, signflip_p
from rlvrlab.stats.intervals import LEVEL, Interval, Moments

STEIN = "stein"  # an Interval's method
PAIRED_STEIN = "paired Stein"  # a Comparison's test


def stein_moments(x, n0: int, n=None) -> Moments:
    """x [..., S]: per-seed values in seed order, seeds 0..S-1, x[..., :n0] stage one. The mean of the first n seeds
    (n [...] an array over the leading axes for Monte Carlo; default all S), se = s0/√n with s0 the SD of
    x[..., :n0], df = n0-1 (Stein 1945; exact under normality when n depends on stage one only: module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    s = x.shape[-1]
    if n0 < 2 or s < n0:
        raise ValueError(f"the Stein interval needs the {n0} stage-one seeds (n0 >= 2); got {s} values")
    count = np.full(x.shape[:-1], s) if n is None else np.asarray(n)
    if np.any(count < n0) or np.any(count > s):
        raise ValueError(f"the seeds used must be between n0 = {n0} and the {s} given")
    used = np.arange(s) < count[..., None]
    mean = np.where(used, x, 0.0).sum(axis=-1) / count
    se = x[..., :n0].std(axis=-1, ddof=1) / np.sqrt(count)
    return Moments(mean, se, np.full(x.shape[:-1], float(n0 - 1)))


def stein_interval(x: Sequence[float] | np.ndarray, n0: int, level: float = LEVEL) -> Interval:
    """x [N]: one trial's values of seeds 0..N-1 in seed order (N >= n0): X̄_N ± t_{(1+level)/2, n0-1} · s0/√N,
    s0 the SD of seeds 0..n0-1 (method "stein")."""
    x = np.asarray(x, dtype=np.float64)
    m = stein_moments(x, n0)
    low, high = m.bounds(level)
    return Interval(float(m.estimate), float(low), float(high), float(m.se), float(m.df), len(x), STEIN)


def paired_stein_moments(a, b, n0: int, m=None) -> Moments:
    """a, b [..., S]: two trials' values on seeds 0..S-1 in seed order; the Stein moments of d = a - b over the
    first m seeds (m [...] for Monte Carlo; default S): d̄_m, s0(d)/√m with s0(d) the SD of d over seeds 0..n0-1,
    df n0-1."""
    return stein_moments(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64), n0, m)


def paired_stein(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, n0: int,
                 level: float = LEVEL) -> Comparison:
    """a [Na], b [Nb]: two trials of one adaptive study, seeds 0..Na-1 and 0..Nb-1 in seed order (Na, Nb >= n0).
    Paired on the M = min(Na, Nb) common seeds: Δ = mean of d_s = a_s - b_s, se = s0(d)/√M, df n0-1 (test "paired
    Stein"); the exact sign-flip p and P(improvement) over the same M seeds; the MDE from se and df as for every
    comparison. n_a, n_b are Na and Nb (min(n_a, n_b) = M, the seeds the claim rule counts)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    common = min(len(a), len(b))
    if common < n0:
        raise ValueError(f"a paired Stein comparison needs both trials' {n0} stage-one seeds; got {len(a)} and "
                         f"{len(b)}")
    x, y = a[:common], b[:common]
    mom = paired_stein_moments(x, y, n0)
    low, high = mom.bounds(level)
    se, df = float(mom.se), float(mom.df)
    return Comparison(float(mom.estimate), float(low), float(high), se, df, float(mom.p()), signflip_p(x - y),
                      mde(se, df), True, PAIRED_STEIN, len(a), len(b), probability_of_improvement(x, y))


def stage_one_size(text: Optional[str]) -> Optional[int]:
    """n0 from a study's `seeds.adaptive` param ("initial=5 max=20 halfwidth=0.02", rlvrlab.sweep.study); None for
    a study without adaptive seeds (no param)."""
    if text is None:
        return None
    fields = dict(part.partition("=")[::2] for part in text.split())
    try:
        n0 = int(fields["initial"])
    except (KeyError, ValueError):
        raise ValueError(f"seeds.adaptive {text!r}: expected 'initial=N max=M halfwidth=H'") from None
    if n0 < 2:
        raise ValueError(f"seeds.adaptive {text!r}: a stage one of {n0} seeds has no spread")
    return n0


def stein_seeds(seeds: Sequence[int], n0: int) -> bool:
    """Whether a group's seed list is a two-stage trial's: exactly 0..N-1 with N >= n0 (a missing seed, such as a
    failed run, breaks the argument: which seeds remain would no longer depend on stage one alone)."""
    return len(seeds) >= n0 and list(seeds) == list(range(len(seeds)))
