"""`rlvrlab sweep --retry-failed`: re-run the failed (and timed-out) seeds of a study, and only those (docs/sweeps.md,
"When seed runs fail"). Each failed trial that no later attempt re-runs gets a new WAITING trial with the same
params, linked as Optuna links a dead worker's retry (system attrs failed_trial, retry_history); its seeds reuse the
FINISHED seed runs of the failed one (rlvrlab.sweep.runner.reused), and the failed trial no longer counts
(rlvrlab.sweep.study.superseded)."""

from __future__ import annotations

import copy
from typing import Any

from optuna.trial import TrialState

from rlvrlab.outputs import file_lock
from rlvrlab.tracking import tags as T


def enqueue_failed(sweep: Any) -> list[int]:
    """Enqueue a retry of every failed trial (not a dead worker's, which is retried on its own) that no later
    attempt re-runs; returns the numbers of the trials retried. Under the study's start lock where it has one, so
    that two invocations do not both enqueue them."""
    from contextlib import nullcontext

    from rlvrlab.sweep.study import _start_lock, superseded

    lock = _start_lock(sweep.storage_url)
    with nullcontext() if lock is None else file_lock(lock):
        trials = sweep.study.get_trials(deepcopy=False)
        retried = superseded(trials)
        failed = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get(T.FAILURE) != "worker"
                  and t.number not in retried and t.params]
        for trial in failed:
            system = {k: copy.deepcopy(v) for k, v in trial.system_attrs.items()
                      if k not in (T.WORKER, T.HEARTBEAT)}
            system.setdefault("failed_trial", trial.number)
            system["retry_history"] = [*system.get("retry_history", []), trial.number]
            import optuna

            sweep.study.add_trial(optuna.create_trial(state=TrialState.WAITING, params=trial.params,
                                                      distributions=trial.distributions, system_attrs=system))
    return [t.number for t in failed]
