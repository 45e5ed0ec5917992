"""A sweep's objective: a seed run's value (`window_mean` of a metric over its last logged steps, read back from
MLflow) and a trial's value over its seeds (an `Aggregate`) with its 95% interval over seeds (`trial_interval`):
for a fixed seed list the Student-t interval that `rlvrlab report` prints (rlvrlab.stats.t_interval), so
`--status`, the objective and a report agree to the bit; for adaptive seeds Stein's two-stage interval
(rlvrlab.sweep.seeds), the one whose 95% holds for the seed count the rule chose, so a `lcb95`/`ucb95` objective
optimises the interval that `--status` shows.

An aggregate is registered once, in AGGREGATES, with its traits: the sweep file's validation (the name, the
direction it fits, the seeds it needs) and the trial's objective both read that entry, and nothing else lists them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Optional

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.stats import Interval
from rlvrlab.sweep.seeds import AdaptiveSeeds, trial_interval

DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class Aggregate:
    """A trial's value from its seed values: one statistic of their 95% interval (`trial_interval`), and its
    traits."""

    name: str
    statistic: Callable[[Interval], float]
    _: KW_ONLY
    min_seeds: int  # seeds a trial needs (an interval's bound needs a spread: 2); checked when the file is read
    # the one direction it fits: a bound is the pessimistic end for that direction (lcb95 of a maximised metric);
    # the other end would favour noisy trials. None: it fits both
    direction: Optional[str]

    def over(self, values: Mapping[int, float] | Sequence[float], adaptive: Optional[AdaptiveSeeds] = None) -> float:
        """The trial's value from its seed values (seed -> value for adaptive seeds: Stein's interval)."""
        return self.statistic(trial_interval(values, adaptive))


MEAN = Aggregate("mean", lambda interval: interval.mean, min_seeds=1, direction=None)
AGGREGATES: dict[str, Aggregate] = {a.name: a for a in (
    MEAN,
    Aggregate("lcb95", lambda interval: interval.low, min_seeds=2, direction="maximize"),
    Aggregate("ucb95", lambda interval: interval.high, min_seeds=2, direction="minimize"),
)}


@dataclass(frozen=True)
class Objective:
    """`objective:` of a sweep file (its fields, in this order, are part of the study's fingerprint)."""

    metric: str
    direction: str = "maximize"  # one of DIRECTIONS
    window: int = 1  # per seed run: window_mean of the metric over its last `window` steps, each of them logged
    aggregate: str = MEAN.name  # over seeds: a name in AGGREGATES


def window_mean(values: Sequence[float], window: int) -> float:
    """The mean of the last `window` of `values` (all of them when there are fewer), given in step order: a seed
    run's objective from its logged steps, and the value the pruner is told at each step of a running seed."""
    return float(np.mean(values[-window:]))


def objective_of(client: Any, run_id: str, metric: str, window: int) -> float:
    """A seed run's objective: window_mean of `metric` over its logged steps (the last value logged at each step).
    A non-finite value (inf, -inf, nan) is refused: it would rank a trial (inf as the best) on no number."""
    history = client.get_metric_history(run_id, metric)
    if not history:
        logged = sorted(client.get_run(run_id).data.metrics)
        raise RlvrlabError(f"run {run_id} logged no {metric!r}; it logged {', '.join(logged) or 'nothing'} "
                           "(change objective.metric)")
    by_step: dict[int, float] = {}
    for point in sorted(history, key=lambda m: (m.step, m.timestamp)):
        by_step[point.step] = _stored(point.value)
    value = window_mean([by_step[step] for step in sorted(by_step)], window)
    if not math.isfinite(value):
        bad = next((s for s in sorted(by_step)[-window:] if not math.isfinite(by_step[s])), None)
        raise RlvrlabError(f"run {run_id}'s objective {metric!r} is {value} (the mean of its last {window} logged "
                           f"steps{f'; step {bad} logged {by_step[bad]}' if bad is not None else ''}): a non-finite "
                           "objective ranks no trial, so the seed fails")
    return value


def _stored(value: float) -> float:
    """A value as logged: MLflow's SQL stores keep inf and -inf as the largest finite floats (±1.8e308)."""
    return math.copysign(math.inf, value) if abs(value) == sys.float_info.max else value


def seed_summary(values: Mapping[int, float] | Sequence[float],
                 adaptive: Optional[AdaptiveSeeds] = None) -> dict[str, float]:
    """Mean over seeds with the trial's 95% interval (`trial_interval`: Student t, or Stein's for adaptive seeds;
    NaN bounds for one seed; NaN everywhere for a NaN value) and the SD over all its seeds, as a trial records it."""
    interval = trial_interval(values, adaptive)
    x = np.asarray(list(values.values()) if isinstance(values, Mapping) else values, dtype=float)
    sd = float(x.std(ddof=1)) if len(x) > 1 else math.nan
    return {"mean": interval.mean, "sd": sd, "low": interval.low, "high": interval.high,
            "halfwidth": interval.halfwidth, "n": len(x)}
