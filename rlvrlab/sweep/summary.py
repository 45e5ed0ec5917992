"""What a study has so far, as plain rows (the CLI draws them; tests read them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from rlvrlab.sweep.confirmation import CONFIRMATION
from rlvrlab.sweep.objective import seed_summary
from rlvrlab.sweep.seeds import wanted
from rlvrlab.sweep.study import Sweep, attempt, counts, superseded
from rlvrlab.sweep.trials import SEQUENTIAL_ATTR
from rlvrlab.tracking import tags as T


@dataclass
class TrialRow:
    number: int
    state: str  # COMPLETE | FAIL | PRUNED | RUNNING | WAITING
    params: dict[str, Any]
    value: Optional[float]  # the objective Optuna optimises (mean or a bound over seeds)
    mean: Optional[float]
    low: Optional[float]  # the 95% interval the objective's bounds are: Student t (adaptive seeds: Stein's, once
    high: Optional[float]  # stage one is done; rlvrlab.sweep.seeds)
    seeds_done: int
    reason: str
    retry_of: Optional[int]
    halfwidth: Optional[float] = None  # of that interval
    more_seeds: Optional[int] = None  # adaptive seeds: seeds Stein's rule still asks for (beyond max too); None
    # while stage one runs or when its spread is not finite
    attempt: int = 1  # 1: the first run of its params; 2: its first retry (a dead worker's, --retry-failed), ...
    retried: bool = False  # a later attempt re-runs it (a failed trial then no longer counts as failed)
    failure: str = ""  # why it failed: run | worker | pruned (rlvrlab.sweep.trials)


@dataclass
class StudySummary:
    rows: list[TrialRow]
    best: Optional[TrialRow]
    total: Optional[int]  # trials the study will have (grid size or budget.trials)
    finished: int  # trials that count as done (complete, pruned, failed runs)
    pruned_early: int = 0  # pruner sequential: trials it stopped before their last seed
    seeds_saved: int = 0  # pruner sequential: Σ over those trials of (seeds of the sweep - seeds they ran)
    confirmation: Optional[dict] = None  # confirm: the record of rlvrlab.sweep.confirmation.confirm_sweep


def summarize(sweep: Sweep) -> StudySummary:
    from optuna.trial import TrialState

    rows = []
    trials = sweep.study.get_trials(deepcopy=False)
    retried = superseded(trials)
    for t in trials:
        values = {int(s): v for s, v in (t.user_attrs.get(T.VALUES) or {}).items()}  # seed -> value
        adaptive = sweep.spec.adaptive
        summary = seed_summary(values, adaptive) if values else {}
        need = wanted(values, adaptive) if adaptive is not None else None
        more = None if need is None else max(0, need - len(values))
        rows.append(TrialRow(
            number=t.number, state=t.state.name, params=dict(t.params),
            value=t.value if t.state == TrialState.COMPLETE else None,
            mean=summary.get("mean"), low=_finite(summary.get("low")), high=_finite(summary.get("high")),
            seeds_done=len(values), reason=t.user_attrs.get(T.FAIL_REASON, "") or _stopped(t),
            retry_of=t.system_attrs.get("failed_trial"),
            halfwidth=_finite(summary.get("halfwidth")), more_seeds=more, attempt=attempt(t),
            retried=t.number in retried, failure=t.user_attrs.get(T.FAILURE, ""),
        ))
    sign = 1 if sweep.spec.objective.direction == "maximize" else -1
    scored = [(sign * r.value, r) for r in rows if r.state == "COMPLETE" and r.value is not None]
    best = max(scored, key=lambda pair: pair[0])[1] if scored else None
    stopped = [t.user_attrs[SEQUENTIAL_ATTR]["seeds"] for t in trials
               if t.state == TrialState.PRUNED and SEQUENTIAL_ATTR in t.user_attrs]
    return StudySummary(rows, best, sweep.spec.total_trials(), finished_trials(sweep), len(stopped),
                        sum(sweep.spec.max_seeds - used for used in stopped),
                        sweep.study.user_attrs.get(CONFIRMATION))


def _stopped(trial) -> str:
    """Why the sequential pruner stopped a trial, or ""."""
    why = trial.user_attrs.get(SEQUENTIAL_ATTR)
    return "" if not why else (f"pruned after {why['seeds']} seeds: cannot beat trial {why['incumbent']} by "
                               f"delta {why['delta']:g}")


def finished_trials(sweep: Sweep) -> int:
    """StudySummary.finished alone: what a progress display polls (no intervals over seeds computed)."""
    from optuna.trial import TrialState

    trials = sweep.study.get_trials(deepcopy=False)
    retried = superseded(trials)
    return sum(1 for t in trials if counts(t, retried) and t.state not in (TrialState.RUNNING, TrialState.WAITING))


def failed_rows(sweep: Sweep) -> list[TrialRow]:
    """The study's failed trials that no later attempt re-runs (those --retry-failed would run again)."""
    return [row for row in summarize(sweep).rows
            if row.state == "FAIL" and row.failure != "worker" and not row.retried]


def _finite(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None
