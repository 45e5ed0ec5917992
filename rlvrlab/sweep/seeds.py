"""Adaptive seeds (`seeds: {initial: 5, max: 20, halfwidth: 0.02}`): Stein's (1945) two-stage rule, whose 95%
interval is exact for normally distributed seed values (C. Stein, "A two-sample test for a linear hypothesis whose
power is independent of the variance", Ann. Math. Statist. 16:243-258, 1945).

Stage one runs seeds 0..n0-1 and takes their SD s0. Stage two grows the trial, once, to

    N = min(max, max(n0, ceil((t_{.975, n0-1} · s0 / h)²)))      (`wanted`: the smallest such N, checked in floats)

seeds 0..N-1, and the trial's interval is  X̄_N ± t_{.975, n0-1} · s0/√N  (`stein_interval`), whose half-width is
at most h whenever N < max. It is exact because N is a function of s0 alone, which for normal values is
independent of the mean (docs/report.md, "Adaptive seeds"); the plain mean of all N seeds (Stein weights stage
two to make the width exactly h) keeps that coverage, and the `max` cap only lets the half-width exceed h.

Why this rule rather than the rounds it replaced (grow, look at the spread again, report the ordinary
t-interval, which covered 0.90-0.92): docs/sweeps.md, "Adaptive seeds". `initial` < 5 is refused (t_{.975, 3} = 3.18
makes N ~2.6x the known-SD count).

The rule reads the spread of stage one only, never a mean; the seed list grows deterministically (0..N-1), so two
trials that end with the same count ran the same seeds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

from rlvrlab.stats import LEVEL, Interval, stein_interval as stein_interval_of, t_interval, t_ppf

RULE = "stein1945"  # part of an adaptive study's fingerprint: a study of another rule is another study
MIN_INITIAL = 5  # stage-one seeds; fewer make t_{.975, n0-1}, hence N, too large (3.18 at n0 = 4)


@dataclasses.dataclass(frozen=True)
class AdaptiveSeeds:
    """`seeds: {initial: 5, max: 20, halfwidth: 0.02}`: a trial runs seeds 0..initial-1, then (once) grows to the
    N seeds Stein's rule asks for from their spread (`wanted`), at most `max`."""

    initial: int
    max: int
    halfwidth: float
    rule: str = RULE


def _stage_one(values: Mapping[int, float], initial: int) -> Optional[np.ndarray]:
    """Seeds 0..initial-1's values, or None while any of them is missing."""
    if any(s not in values for s in range(initial)):
        return None
    return np.asarray([values[s] for s in range(initial)], dtype=float)


def wanted(values: Mapping[int, float], adaptive: AdaptiveSeeds) -> Optional[int]:
    """Stein's N before the `max` cap: the smallest N >= initial with t_{.975, n0-1} · s0/√N <= halfwidth, from the
    values of seeds 0..initial-1 (`values`: seed -> value). None while stage one is incomplete, or when its spread
    is not finite (a NaN or infinite value) or N is beyond any float."""
    first = _stage_one(values, adaptive.initial)
    if first is None:
        return None
    spread = float(t_ppf(0.5 + LEVEL / 2, adaptive.initial - 1)) * float(np.std(first, ddof=1))
    ratio = (spread / adaptive.halfwidth) ** 2
    if not math.isfinite(ratio) or ratio > 1e15:
        return None
    n = max(adaptive.initial, math.ceil(ratio))
    while n > adaptive.initial and spread / math.sqrt(n - 1) <= adaptive.halfwidth:  # float rounding of ratio
        n -= 1
    while spread / math.sqrt(n) > adaptive.halfwidth:
        n += 1
    return n


def seed_count(values: Mapping[int, float], adaptive: AdaptiveSeeds) -> int:
    """The seeds a trial runs in all: `initial` until stage one is done, then Stein's N capped at `max` (`max` when
    the spread is not finite)."""
    if _stage_one(values, adaptive.initial) is None:
        return adaptive.initial
    n = wanted(values, adaptive)
    return adaptive.max if n is None else min(n, adaptive.max)


def stein_interval(values: Mapping[int, float], initial: int) -> Interval:
    """X̄ over every seed of `values` (seed -> value) ± t_{.975, n0-1} · s0/√N, s0 the SD of seeds 0..initial-1
    (method "stein"; df n0-1). Exact 95% for normal values when N was chosen from s0 alone (module docstring)."""
    first = _stage_one(values, initial)
    if first is None:
        raise ValueError(f"the Stein interval needs seeds 0..{initial - 1}; got seeds {sorted(values)}")
    rest = [v for s, v in values.items() if not 0 <= s < initial]
    return stein_interval_of(np.concatenate([first, np.asarray(rest, dtype=float)]), initial)  # the report's own


def trial_interval(values: Mapping[int, float] | Sequence[float], adaptive: Optional[AdaptiveSeeds]) -> Interval:
    """A trial's 95% interval over its seeds: Stein's for an adaptive trial whose stage one is done (`values` then
    maps seed -> value), the report's Student-t interval (rlvrlab.stats.t_interval) otherwise (a fixed seed
    list, or an adaptive trial still in stage one)."""
    if isinstance(values, Mapping):
        if adaptive is not None and _stage_one(values, adaptive.initial) is not None:
            return stein_interval(values, adaptive.initial)
        values = list(values.values())
    elif adaptive is not None:
        raise TypeError("an adaptive trial's values must map seed -> value (its stage one is seeds 0..initial-1)")
    return t_interval(np.asarray(values, dtype=float))
