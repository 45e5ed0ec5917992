"""Sequential seeds: compare a trial with the incumbent after each shared seed, and prune it once it can no longer
plausibly beat the incumbent by δ, the minimum effect of interest (issue 48, item 3). The tests, the spending of
the levels and why the stated error holds: docs/sweeps.md, "Sequential seeds".

The data are the paired differences d_s = trial_s - incumbent_s on the seeds both ran, in seed order. At look n
(n = n_min..n_max), with T_n = (d̄_n - δ)/(s_n/√n): prune when T_n < -t_{1-b_n, n-1}; better when
d̄_n/(s_n/√n) > t_{1-a_n, n-1}. The levels b_n (a_n) are a power spending function of β (α) (Lan and DeMets
1983), combined over looks by the union bound. n_min >= 3: at 2 seeds the t has 1 df and a look can only spend β."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.stats.comparisons import ALPHA
from rlvrlab.stats.intervals import t_ppf

BETA = 0.05  # the probability of pruning a trial truly δ better than the incumbent, at most
MIN_LOOK = 3  # the first look needs 2 df (module docstring)
SPENDING_RHO = 2.0  # by look n, (n/n_max)^ρ of a level is spent (docs/sweeps.md, "Sequential seeds": why 2)

PRUNE = "prune"  # the trial can no longer plausibly beat the incumbent by δ
BETTER = "better"  # the trial beats the incumbent (μ_d > 0 shown at the efficacy level)
CONTINUE = "continue"  # neither boundary crossed and seeds are left
COMPLETE = "complete"  # neither boundary crossed by n_max: the fixed-design comparison applies
SEQUENTIAL_DECISIONS = (CONTINUE, PRUNE, BETTER, COMPLETE)  # their codes in `sequential_stops` are their indices


@dataclass(frozen=True)
class SequentialDesign:
    """A sequential comparison: looks after seeds n_min..n_max, futility level β and efficacy level α (0: no
    efficacy stop), both spent over the looks with power ρ."""

    n_min: int
    n_max: int
    beta: float = BETA
    alpha: float = ALPHA
    rho: float = SPENDING_RHO

    def __post_init__(self) -> None:
        if not (isinstance(self.n_min, int) and MIN_LOOK <= self.n_min <= self.n_max):
            raise RlvrlabError(
                f"sequential seeds need {MIN_LOOK} <= n_min <= n_max, got n_min={self.n_min}, n_max={self.n_max};"
                f" give at least {MIN_LOOK} seeds before the first look")
        if not (0 < self.beta < 1 and 0 <= self.alpha < 1 and self.rho > 0):
            raise RlvrlabError(f"sequential levels need 0 < beta < 1, 0 <= alpha < 1 and rho > 0, got beta="
                               f"{self.beta}, alpha={self.alpha}, rho={self.rho}; use e.g. beta=0.05, alpha=0.05")

    @property
    def looks(self) -> np.ndarray:
        """The seed counts at which a decision is taken."""
        return np.arange(self.n_min, self.n_max + 1)

    def spent(self, total: float) -> np.ndarray:
        """The level spent at each look: the increments of total·(n/n_max)^ρ, the first look taking all it has
        spent so far (the increments sum to total)."""
        cumulative = total * (self.looks / self.n_max) ** self.rho
        return np.diff(cumulative, prepend=0.0)

    def critical(self, total: float) -> np.ndarray:
        """The one-sided t critical values t_{1-level, n-1} at each look (inf where nothing is spent)."""
        levels = self.spent(total)
        return np.array([t_ppf(1.0 - b, n - 1) if b > 0 else math.inf for b, n in zip(levels, self.looks)])


def running_t(d: np.ndarray, shift: float) -> np.ndarray:
    """d [..., N] paired differences in seed order: T_n = (d̄_n - shift)/(s_n/√n) for n = 1..N (n = 1 is NaN; s_n = 0
    gives ±inf, or NaN when d̄_n = shift). The running sums are taken about the first value, so a large common
    offset does not cancel the spread away."""
    d = np.asarray(d, dtype=np.float64)
    origin = d[..., :1]
    c = d - origin
    n = np.arange(1, d.shape[-1] + 1)
    mean = np.cumsum(c, axis=-1) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.maximum(np.cumsum(c * c, axis=-1) - n * mean * mean, 0.0) / (n - 1)
        return (mean + (origin - shift)) / np.sqrt(var / n)


def sequential_stops(d: np.ndarray, delta: float, design: SequentialDesign) -> tuple[np.ndarray, np.ndarray]:
    """d [..., N] paired differences (trial - incumbent) in seed order, N >= n_min seeds so far (N <= n_max).
    Returns (decision code [...], seeds used [...]): the first look whose futility or efficacy boundary is crossed,
    else CONTINUE at N < n_max or COMPLETE at n_max. Both at one look (a large δ: d̄ above 0 and below δ, both
    clearly) is BETTER: the trial beats the incumbent, and keeping it only lowers the pruning error. Codes index
    SEQUENTIAL_DECISIONS; vectorised over the leading (Monte Carlo) axes."""
    d = np.asarray(d, dtype=np.float64)
    count = d.shape[-1]
    if not (math.isfinite(delta) and delta >= 0):
        raise RlvrlabError(f"the minimum effect of interest delta must be a finite number >= 0, got {delta}")
    if not design.n_min <= count <= design.n_max:
        raise RlvrlabError(f"a sequential decision needs between n_min={design.n_min} and n_max={design.n_max} "
                           f"shared seeds, got {count}; pass the first n_min..n_max shared seeds")
    looks = design.looks[design.looks <= count]
    futile = running_t(d, delta)[..., looks - 1] < -design.critical(design.beta)[: looks.size]
    better = running_t(d, 0.0)[..., looks - 1] > design.critical(design.alpha)[: looks.size]
    crossed = futile | better
    first = np.argmax(crossed, axis=-1)
    hit = np.take_along_axis(crossed, first[..., None], axis=-1)[..., 0]
    won = np.take_along_axis(better, first[..., None], axis=-1)[..., 0]
    end = SEQUENTIAL_DECISIONS.index(COMPLETE) if count == design.n_max else SEQUENTIAL_DECISIONS.index(CONTINUE)
    code = np.where(hit, np.where(won, SEQUENTIAL_DECISIONS.index(BETTER), SEQUENTIAL_DECISIONS.index(PRUNE)), end)
    return code, np.where(hit, looks[first], count)


def sequential_decision(trial, incumbent, delta: float, design: SequentialDesign) -> tuple[str, int]:
    """One trial against the incumbent on the seeds both ran so far (seed order; the shorter list sets the count):
    (decision, seeds it rests on). Before n_min shared seeds the answer is CONTINUE."""
    shared = min(len(trial), len(incumbent))
    if shared < design.n_min:
        return CONTINUE, shared
    d = np.asarray(trial[:shared], dtype=np.float64) - np.asarray(incumbent[:shared], dtype=np.float64)
    code, used = sequential_stops(d[: design.n_max], delta, design)
    return SEQUENTIAL_DECISIONS[int(code)], int(used)
