"""Seeds needed for a target precision (`--target-halfwidth`, a sweep's adaptive seeds): planning from an observed
spread with the report's own intervals."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from rlvrlab.stats.intervals import LEVEL, crossed_var_df, mean_squares, scipy_stats, t_ppf


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
    if var_b / p * scipy_stats().norm.ppf(0.5 + level / 2) ** 2 >= halfwidth ** 2:
        return None
    for n in range(2, max_seeds + 1):
        var, df = crossed_var_df(var_e + p * var_a, var_e + n * var_b, var_e, n, p)
        if t_ppf(0.5 + level / 2, df) * math.sqrt(float(var)) <= halfwidth:
            return n
    return None
