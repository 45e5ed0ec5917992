"""The A × B interaction of a grid on paired seeds, with seeds as blocks: does B's effect depend on A's level?

For levels a_0 (reference), a_1, ... and b_0 (reference), b_1, ..., every seed s gives the contrast
c_ij,s = y(a_i,b_j) - y(a_i,b_0) - y(a_0,b_j) + y(a_0,b_0) (i, j ≥ 1): B's effect at a_i minus B's effect at a_0, the
seed's own effect cancelling. Each (i, j) is a paired t over the seeds (one-sample t of c_ij, S-1 df), and the
family of (I-1)(J-1) contrasts is Holm-adjusted: the probability that any contrast is declared nonzero when no
interaction exists is at most 0.05. power() is the analytic power of one contrast (noncentral t).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.stats.comparisons import ALPHA, holm
from rlvrlab.stats.intervals import LEVEL, scipy_stats, t_ppf


@dataclass(frozen=True)
class Contrast:
    """One interaction contrast c_ij (levels as indices into the grid's axes, 0 the reference)."""

    i: int
    j: int
    estimate: float
    low: float
    high: float
    se: float
    df: float
    p: float
    p_holm: float
    n_seeds: int

    @property
    def significant(self) -> bool:
        return self.p_holm < ALPHA


def contrasts(y: np.ndarray) -> np.ndarray:
    """Per-seed interaction contrasts [..., S, I-1, J-1] of a grid y [..., S, I, J] (module docstring)."""
    y = np.asarray(y, dtype=np.float64)
    return y[..., 1:, 1:] - y[..., 1:, :1] - y[..., :1, 1:] + y[..., :1, :1]


def t_tests(c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, se, two-sided p) of one-sample t-tests over axis -2 of c [..., S, M] (vectorised for Monte Carlo)."""
    s = c.shape[-2]
    mean = c.mean(axis=-2)
    se = c.std(axis=-2, ddof=1) / math.sqrt(s)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, mean / np.where(se > 0, se, 1.0), np.where(mean == 0, 0.0, np.inf))
    return mean, se, 2 * scipy_stats().t.sf(np.abs(t), s - 1)


def holm_rejects(p: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Holm's step-down rejections of p [..., M] (vectorised): reject the k-th smallest while every p up to it is
    below alpha / (M - rank)."""
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1)
    passed = np.cumprod(ranked < alpha / (m - np.arange(m)), axis=-1).astype(bool)
    out = np.zeros_like(passed)
    np.put_along_axis(out, order, passed, axis=-1)
    return out


def interaction(y: np.ndarray, level: float = LEVEL) -> list[Contrast]:
    """Every contrast of a grid y [S, I, J] (I, J ≥ 2 levels, the first the reference; S ≥ 2 seeds shared by every
    cell) with its t-interval, p and Holm p over the family of (I-1)(J-1)."""
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 3 or y.shape[0] < 2 or y.shape[1] < 2 or y.shape[2] < 2:
        raise ValueError(f"interaction needs a grid [seeds >= 2, levels of A >= 2, levels of B >= 2]; got {y.shape}")
    s, i_levels, j_levels = y.shape
    c = contrasts(y).reshape(s, -1)
    mean, se, p = t_tests(c)
    q = t_ppf(1 - (1 - level) / 2, s - 1)
    adjusted = holm([float(x) for x in p])
    return [Contrast(1 + k // (j_levels - 1), 1 + k % (j_levels - 1), float(mean[k]), float(mean[k] - q * se[k]),
                     float(mean[k] + q * se[k]), float(se[k]), float(s - 1), float(p[k]), adjusted[k], s)
            for k in range(c.shape[1])]


@dataclass(frozen=True)
class Grid:
    """One complete A × B grid: y [S, I, J] on the seeds all its cells ran, levels in order (the first the
    reference), in one stratum of the other keys ("key=value; ...", "" when there are none)."""

    stratum: str
    a_levels: tuple[str, ...]
    b_levels: tuple[str, ...]
    seeds: tuple[int, ...]
    y: np.ndarray
    cells: tuple[tuple[str, ...], ...]  # the cells' labels [I][J]


def level_key(value: str) -> tuple:
    """Numeric levels by value, then the others by name."""
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def grids(config: Mapping[str, Mapping[str, str]], seeds: Mapping[str, Sequence[int]],
          scores: Mapping[str, np.ndarray], keys: tuple[str, str], others: Sequence[str],
          reference: Optional[str] = None) -> tuple[list[Grid], list[str]]:
    """The complete A × B grids of cells (label -> config, seeds, per-seed scores in that seed order), one per
    combination of the `others` keys' values, each on the seeds common to its cells; reference levels: the
    `reference` cell's, else the smallest. Also the strata left out and why (a missing cell, < 2 common seeds)."""
    for key in keys:
        if any(key not in c for c in config.values()):
            known = sorted(set.intersection(*(set(c) for c in config.values())))
            raise RlvrlabError(f"--interaction key {key!r} is not a config key of every group; keys: "
                               f"{', '.join(known) or 'none'}")
    levels = [sorted({c[k] for c in config.values()}, key=level_key) for k in keys]
    if reference is not None:
        levels = [[config[reference][k]] + [v for v in lv if v != config[reference][k]] for k, lv in zip(keys, levels)]
    strata: dict[str, dict[tuple[str, str], str]] = {}
    for label, c in config.items():
        strata.setdefault("; ".join(f"{k}={c.get(k, '')}" for k in others), {})[(c[keys[0]], c[keys[1]])] = label
    found, skipped = [], []
    for stratum, cells in strata.items():
        where = stratum or "the grid"
        if len(cells) != len(levels[0]) * len(levels[1]) or min(map(len, levels)) < 2:
            skipped.append(f"{where}: {len(cells)} of {len(levels[0]) * len(levels[1])} cells (needs >= 2 x 2)")
            continue
        labels = [[cells[(a, b)] for b in levels[1]] for a in levels[0]]
        common = [s for s in seeds[labels[0][0]] if all(s in seeds[x] for row in labels for x in row)]
        if len(common) < 2:
            skipped.append(f"{where}: {len(common)} seeds common to its cells (needs 2)")
            continue
        y = np.array([[[scores[x][list(seeds[x]).index(s)] for x in row] for row in labels] for s in common])
        found.append(Grid(stratum, tuple(levels[0]), tuple(levels[1]), tuple(common), y,
                          tuple(tuple(row) for row in labels)))
    return found, skipped


def power(delta: float, sd: float, seeds: int, alpha: float = ALPHA) -> float:
    """Analytic power of one contrast's two-sided t-test at level alpha: P(|T'| > t_{1-α/2, S-1}) with T'
    noncentral t on S-1 df, noncentrality delta·√S/sd (sd: the per-seed contrast's standard deviation, which is
    2σ for four cells of independent noise σ given the seed)."""
    sps = scipy_stats()
    df = seeds - 1
    crit = t_ppf(1 - alpha / 2, df)
    nc = delta * math.sqrt(seeds) / sd
    return float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))
