"""Peak-over-steps comparisons that are not cherry-picked (issue 48, item 5; docs/report.md, "Peaks").

For per-seed curves A[S, T] and B[S, T] of two arms on the same (paired) seeds and the same T evaluation steps, the
statistic is D = max_t mean_s A[s, t] - max_t mean_s B[s, t], its null calibrated by swapping A[s] with B[s]
within a subset of the seeds (all 2^S patterns when S <= MAX_EXACT_SWAPS, else RANDOM_SWAPS seeded random patterns
plus the observed one), the peaks re-selected in every pattern; two-sided p = share of patterns with |D*| >= |D|.
With identical arms it rejects at p < 0.05 with probability <= 0.05; its smallest p is 2/2^S, so it cannot reject
below 6 seeds. naive_peak_p is the comparison a paper does: a paired t at each arm's own best step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.stats.comparisons import TIE_TOLERANCE
from rlvrlab.stats.intervals import scipy_stats

MAX_EXACT_SWAPS = 16  # all 2^S swap patterns up to here; beyond, RANDOM_SWAPS seeded random ones
RANDOM_SWAPS = 2 ** 16
SWAP_SEED = 48  # the random patterns' seed: the same p on every machine
CHUNK = 2 ** 23  # at most this many (pattern, step) values at once, to bound memory on long batches
MIN_PEAK_SEEDS = 2


@dataclass(frozen=True)
class Peak:
    """The peak comparison of two arms (module docstring)."""

    peak_a: float  # max over steps of a's mean curve
    step_a: int  # its index among the T evaluation points
    peak_b: float
    step_b: int
    delta: float  # peak_a - peak_b
    p: float  # swap-permutation p of |delta|
    naive_p: float  # paired t at each arm's own best step (selection ignored)
    n_seeds: int
    exact: bool  # all 2^S patterns enumerated (else RANDOM_SWAPS random ones plus the observed)


def checked_curves(a, b) -> tuple[np.ndarray, np.ndarray]:
    """a, b [..., S, T] as float arrays; a one-line error for shapes that are not paired curves."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim < 2:
        raise RlvrlabError(f"peak comparison needs per-seed curves of one shape [seeds, steps] in both arms, got "
                           f"{a.shape} and {b.shape}: align both arms on the same seeds and evaluation steps")
    if a.shape[-2] < MIN_PEAK_SEEDS:
        raise RlvrlabError(f"peak comparison needs >= {MIN_PEAK_SEEDS} paired seeds, got {a.shape[-2]}: "
                           f"run more seeds in both arms")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise RlvrlabError("peak comparison got missing (NaN/inf) curve values: evaluate every seed at every step")
    return a, b


def swap_patterns(seeds: int, rng_seed: int = SWAP_SEED) -> tuple[np.ndarray, bool]:
    """[K, S] 0/1 patterns (1 = swap the arms of that seed), the observed (all 0) first; and whether exact."""
    if seeds <= MAX_EXACT_SWAPS:
        return ((np.arange(2 ** seeds)[:, None] >> np.arange(seeds)[None, :]) & 1).astype(np.float64), True
    drawn = np.random.default_rng(rng_seed).integers(0, 2, size=(RANDOM_SWAPS, seeds)).astype(np.float64)
    return np.vstack([np.zeros((1, seeds)), drawn]), False


def peak_statistic(a, b) -> np.ndarray:
    """D = max_t mean_s a - max_t mean_s b over the trailing [S, T] axes (a, b [..., S, T])."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.mean(axis=-2).max(axis=-1) - b.mean(axis=-2).max(axis=-1)


def _swap_p(a: np.ndarray, b: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """a, b [N, S, T] -> p [N]: the share of patterns with |D*| >= |D| (the observed is pattern 0)."""
    seeds = a.shape[1]
    mean_a, mean_b = a.mean(axis=1), b.mean(axis=1)  # [N, T]
    shift = np.einsum("ks,nst->nkt", patterns, b - a) / seeds  # swapping seed s moves (b - a)[s]/S from b to a
    stars = (mean_a[:, None, :] + shift).max(axis=2) - (mean_b[:, None, :] - shift).max(axis=2)  # [N, K]
    # ties: float sums of the same exact values differ by rounding (see comparisons.signflip_p); a pattern within
    # TIE_TOLERANCE of the curves' scale of the observed |D| counts
    scale = np.maximum(np.abs(a).max(axis=(1, 2)), np.abs(b).max(axis=(1, 2)))
    tolerance = TIE_TOLERANCE * np.maximum(scale, np.finfo(np.float64).tiny)
    observed = np.abs(stars[:, :1])
    return (np.abs(stars) >= observed - tolerance[:, None]).mean(axis=1)


def peak_p(a, b, rng_seed: int = SWAP_SEED) -> np.ndarray:
    """Swap-permutation p of the peak difference D for curves a, b [..., S, T] (vectorised over leading axes)."""
    a, b = checked_curves(a, b)
    batch, (seeds, steps) = a.shape[:-2], a.shape[-2:]
    patterns, _ = swap_patterns(seeds, rng_seed)
    flat_a, flat_b = a.reshape(-1, seeds, steps), b.reshape(-1, seeds, steps)
    rows = max(1, CHUNK // (len(patterns) * steps))
    p = np.concatenate([_swap_p(flat_a[i:i + rows], flat_b[i:i + rows], patterns)
                        for i in range(0, len(flat_a), rows)])
    return p.reshape(batch)


def naive_peak_p(a, b) -> np.ndarray:
    """The naive peak comparison's p: each arm's best step on its own mean curve, then a two-sided paired t on the
    per-seed values at those steps (vectorised over leading axes; a zero spread gives p = 1 at D = 0, else 0)."""
    a, b = checked_curves(a, b)
    seeds = a.shape[-2]
    step_a = a.mean(axis=-2).argmax(axis=-1)[..., None, None]
    step_b = b.mean(axis=-2).argmax(axis=-1)[..., None, None]
    d = (np.take_along_axis(a, step_a, axis=-1) - np.take_along_axis(b, step_b, axis=-1))[..., 0]  # [..., S]
    mean, sd = d.mean(axis=-1), d.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean) / (sd / np.sqrt(seeds))
    p = 2.0 * scipy_stats().t.sf(t, seeds - 1)
    return np.where(sd > 0, p, np.where(mean == 0, 1.0, 0.0))


def peak_test(a, b, rng_seed: int = SWAP_SEED) -> Peak:
    """The peak comparison of curves a, b [S, T] (paired seeds, the same evaluation steps): D, its swap-permutation
    p and the naive p beside it."""
    a, b = checked_curves(a, b)
    if a.ndim != 2:
        raise RlvrlabError(f"peak_test compares one pair of [seeds, steps] curves, got {a.shape}: "
                           "use peak_p for a batch")
    mean_a, mean_b = a.mean(axis=0), b.mean(axis=0)
    step_a, step_b = int(mean_a.argmax()), int(mean_b.argmax())
    return Peak(float(mean_a[step_a]), step_a, float(mean_b[step_b]), step_b,
                float(mean_a[step_a] - mean_b[step_b]), float(peak_p(a, b, rng_seed)), float(naive_peak_p(a, b)),
                a.shape[0], a.shape[0] <= MAX_EXACT_SWAPS)
