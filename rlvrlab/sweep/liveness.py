"""Liveness of sweep workers: a worker records its host:pid and a heartbeat on the trial it runs, for every storage
(Optuna's own heartbeat is RDB-only); a RUNNING trial whose worker is gone is marked FAIL and re-enqueued, and its
retry reuses its finished seed runs (docs/sweeps.md, "Dead workers")."""

from __future__ import annotations

import copy
import os
import socket
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from rlvrlab.tracking import tags as T
from rlvrlab.tracking.mlflow_tracker import retry_locked


class Sweep(Protocol):
    """What liveness needs of an opened sweep (rlvrlab.sweep.trials.Sweep)."""

    study: Any  # optuna.Study
    storage: Any  # its optuna.storages.BaseStorage
    study_id: int  # the study's id in that storage

    def client(self) -> Any: ...

HEARTBEAT_SECONDS = 10.0
STALE_AFTER = 120.0  # seconds without a heartbeat after which a trial on another host counts as dead
MAX_RETRY = 3  # re-runs of a trial whose worker died, before it stays failed
WORKER, HEARTBEAT, FAILURE = T.WORKER, T.HEARTBEAT, T.FAILURE


def trial_id(sweep: Sweep, trial) -> int:
    """The storage id of an Optuna Trial or FrozenTrial of the sweep's study, which Optuna's storage API takes (trials
    carry it only as a private attribute): looked up by the trial's number, as Optuna's storages index it."""
    return sweep.storage.get_trial_id_from_study_id_trial_number(sweep.study_id, trial.number)


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _worker_gone(worker: str) -> bool:
    """True when `worker` ran on this host and its process no longer exists (a reused pid has another start)."""
    host, _, rest = worker.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return bool(started) and _start_time(int(pid_text)) != started


class Heartbeat:
    """Records this worker and a timestamp on a trial every HEARTBEAT_SECONDS while it runs."""

    def __init__(self, storage, trial_id: int):
        self.storage, self.trial_id = storage, trial_id
        self._stop = threading.Event()
        storage.set_trial_system_attr(trial_id, WORKER, worker_id())
        self._beat()
        self._thread = threading.Thread(target=self._run, name="rlvrlab-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self.storage.set_trial_system_attr(self.trial_id, HEARTBEAT, time.time())

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._beat()
            except Exception:  # a storage hiccup must not kill the trial; the next beat tries again
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def recover_stale(sweep: Sweep) -> list[int]:
    """Mark RUNNING trials whose worker is gone as FAIL, close their MLflow runs, and enqueue a retry of each.
    Returns the numbers of the trials recovered."""
    from optuna.trial import TrialState

    recovered = []
    for trial in sweep.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.system_attrs.get(WORKER, "")
        beat = trial.system_attrs.get(HEARTBEAT)
        if beat is None and trial.datetime_start is not None:
            beat = trial.datetime_start.timestamp()
        if not (_worker_gone(worker) or (beat is not None and time.time() - beat > STALE_AFTER)):
            continue
        if not requeue(sweep, trial, f"worker {worker.split(':')[1] if worker else '?'} died; re-run"):
            continue  # another process recovered it first
        run_id = sweep.storage.get_trial(trial_id(sweep, trial)).user_attrs.get(T.MLFLOW_RUN_ID)
        if run_id:
            close_runs(sweep.client(), run_id, "KILLED")
        recovered.append(trial.number)
    return recovered


def requeue(sweep: Sweep, trial: Any, reason: str) -> bool:
    """A RUNNING trial whose worker died or stopped it: failed as the worker's (with `reason`), then a copy with
    the same params enqueued (Optuna's retry callback records the lineage: system attrs failed_trial and
    retry_history). The reason goes on while it is still RUNNING (a finished trial takes no attributes); the FAIL
    transition is atomic, so only one process re-enqueues it. False when another process finished or failed it."""
    import warnings

    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    ident = trial_id(sweep, trial)  # its id in the storage
    try:
        sweep.storage.set_trial_user_attr(ident, FAILURE, "worker")
        sweep.storage.set_trial_user_attr(ident, T.FAIL_REASON, reason)
        if not sweep.storage.set_trial_state_values(ident, state=TrialState.FAIL):
            return False
    except UpdateFinishedTrialError:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the callback is marked experimental
        # user attrs are not carried over: the retry gets its own MLflow run and reason
        frozen = copy.deepcopy(sweep.storage.get_trial(ident))  # storages may hand out their cached object
        frozen.user_attrs = {}
        # nor is the dead worker's liveness record: on the WAITING copy it would make the copy look dead again in
        # the moment between another worker claiming it and its first heartbeat (found by tests/sweep/test_sweep.py)
        frozen.system_attrs = {k: v for k, v in frozen.system_attrs.items()
                               if k not in (WORKER, HEARTBEAT)}
        RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)(sweep.study, frozen)
    return True


def close_runs(client, trial_run_id: str, status: str) -> None:
    """End a dead trial's MLflow run and its still-RUNNING seed runs."""
    run = client.get_run(trial_run_id)
    children = client.search_runs([run.info.experiment_id],
                                  filter_string=f"tags.`{T.PARENT}` = '{trial_run_id}' and "
                                                "attributes.status = 'RUNNING'")
    for child in children:
        retry_locked(partial(client.set_terminated, child.info.run_id, status=status))
    if run.info.status == "RUNNING":
        retry_locked(partial(client.set_terminated, trial_run_id, status=status))
