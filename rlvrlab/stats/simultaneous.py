"""Simultaneous 95% intervals for every cell of a grid against its baseline on paired seeds: a max-t (Dunnett-type)
construction, so that all K intervals cover their true differences together with probability 0.95 (docs/report.md,
"Simultaneous intervals": the construction, and the simpler ones that fail at 3-10 seeds). Each interval is
mean_k ± c·sd_k/√S, c simulated under the Dunnett-model correlation (dunnett_correlation) with a fixed seed
(MC_SEED, DRAWS experiments), so every machine gets the same c; Bonferroni's t_{1-0.025/K, S-1} is returned beside
it (c is capped at it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlvrlab.stats.intervals import LEVEL, t_ppf

MC_SEED = 48  # the seed of the critical value's simulation: fixed, so a table is the same on every machine
DRAWS = 2 ** 14  # simulated experiments behind a critical value
METHOD = "max-t"


@dataclass(frozen=True)
class Simultaneous:
    """Every cell minus the baseline with intervals that hold jointly (module docstring)."""

    delta: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    se: tuple[float, ...]
    df: float
    critical: float  # max-t c: the joint intervals are delta ± critical·se
    bonferroni: float  # t_{1-(1-level)/(2K), df}: Bonferroni's multiplier, for comparison
    level: float = LEVEL
    method: str = METHOD

    @property
    def width_ratio(self) -> float:
        """The max-t intervals' width over Bonferroni's (≤ 1)."""
        return self.critical / self.bonferroni


def root_of(corr: np.ndarray) -> np.ndarray:
    """A matrix L with L Lᵀ = corr (any leading axes), from its eigen-decomposition with negative rounding clipped."""
    vals, vecs = np.linalg.eigh(corr)
    return vecs * np.sqrt(np.clip(vals, 0.0, None))[..., None, :]


def max_t_critical(corr: np.ndarray, seeds: int, level: float = LEVEL, draws: int = DRAWS, seed: int = MC_SEED,
                   chunk: int = 16) -> np.ndarray:
    """c with P(max_k |T_k| ≤ c) = level, T_k the paired t of cell k on `seeds` normal seeds whose differences have
    correlation corr [..., K, K] (any leading Monte Carlo axes, `chunk` matrices at a time). Each draw simulates the
    seeds and studentises every cell by its own sd, as the data are; the draws are the same for every matrix."""
    corr = np.asarray(corr, dtype=np.float64)
    k = corr.shape[-1]
    z = np.random.default_rng(seed).standard_normal((draws, seeds, k))
    flat = root_of(corr.reshape(-1, k, k))
    out = np.empty(flat.shape[0])
    for start in range(0, flat.shape[0], chunk):
        x = np.einsum("nsk,mjk->mnsj", z, flat[start:start + chunk])
        t = x.mean(axis=2) / x.std(axis=2, ddof=1) * math.sqrt(seeds)
        out[start:start + chunk] = np.quantile(np.abs(t).max(axis=-1), level, axis=1)
    return out.reshape(corr.shape[:-2])


def dunnett_correlation(d: np.ndarray) -> np.ndarray:
    """The correlation of the differences d [..., S, K] under the Dunnett model (seeds as blocks, cells independent
    given the seed, each with its own variance): cov(d_k, d_j) = the baseline's variance v0 for every k ≠ j, so
    corr_kj = v0 / (sd_k sd_j), v0 the mean off-diagonal sample covariance clipped to [0, min_k sd_k²]. One pooled
    v0 instead of K(K-1)/2 sample correlations: estimated from S ≤ K seeds those are singular, and a critical value
    from them covers 0.83 at 3 seeds (docs/report.md, "Simultaneous intervals")."""
    d = np.asarray(d, dtype=np.float64)
    s, k = d.shape[-2], d.shape[-1]
    centred = d - d.mean(axis=-2, keepdims=True)
    cov = np.einsum("...sk,...sj->...kj", centred, centred) / (s - 1)
    var = np.diagonal(cov, axis1=-2, axis2=-1)
    off = ~np.eye(k, dtype=bool)
    v0 = np.clip(cov[..., off].mean(axis=-1) if k > 1 else np.zeros(cov.shape[:-2]), 0.0, var.min(axis=-1))
    sd = np.sqrt(var)
    safe = np.where(sd > 0, sd, 1.0)
    corr = np.where(sd[..., :, None] * sd[..., None, :] > 0, v0[..., None, None] / safe[..., :, None]
                    / safe[..., None, :], 0.0)
    return np.where(np.eye(k, dtype=bool), 1.0, corr)


def moments(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean [..., K], se [..., K]) of paired differences d [..., S, K]."""
    d = np.asarray(d, dtype=np.float64)
    return d.mean(axis=-2), d.std(axis=-2, ddof=1) / math.sqrt(d.shape[-2])


def bonferroni_critical(k: int, df: float, level: float = LEVEL) -> float:
    """Bonferroni's multiplier for k two-sided intervals at joint level `level`."""
    return float(t_ppf(1 - (1 - level) / (2 * k), df))


def critical_values(d: np.ndarray, level: float = LEVEL, draws: int = DRAWS) -> np.ndarray:
    """The joint intervals' multiplier of differences d [..., S, K]: the max-t c of their Dunnett correlation, never
    above Bonferroni's (which holds whatever the correlation; the simulation's own error can put c a little above
    it when the cells are nearly independent)."""
    s, k = d.shape[-2], d.shape[-1]
    return np.minimum(max_t_critical(dunnett_correlation(d), s, level, draws), bonferroni_critical(k, s - 1, level))


def simultaneous(cells: Sequence[np.ndarray], baseline: np.ndarray, level: float = LEVEL) -> Simultaneous:
    """Joint intervals of cells[k] - baseline (each [S], the baseline's seeds in the same order) by max-t."""
    base = np.asarray(baseline, dtype=np.float64)
    x = np.stack([np.asarray(c, dtype=np.float64) for c in cells], axis=-1) if len(cells) else np.empty((len(base), 0))
    if x.shape[0] != base.shape[0] or x.shape[0] < 2 or x.shape[1] < 1:
        raise ValueError(f"simultaneous needs >= 1 cell and >= 2 paired seeds; got {x.shape[1]} cells, seeds "
                         f"{x.shape[0]} and {base.shape[0]}")
    d = x - base[:, None]
    mean, se = moments(d)
    df = float(x.shape[0] - 1)
    c = float(critical_values(d, level))
    return Simultaneous(tuple(map(float, mean)), tuple(map(float, mean - c * se)), tuple(map(float, mean + c * se)),
                        tuple(map(float, se)), df, c, bonferroni_critical(x.shape[1], df, level), level)
