"""An Optuna study whose trials are groups of seed runs, recorded in MLflow as study -> trial -> seed runs: its
opening, its start-up and its end (its trials: rlvrlab.sweep.trials).

- Storage (`rlvrlab.sweep.storage`): Optuna's journal file by default, or an RDB URL for many machines.
- Start-up (`_initialise`: the sweep recorded, the MLflow study run opened, the grid enqueued, the study marked
  ready) is done by one process under a file lock beside the storage file, and each phase is skipped where done:
  a start-up stopped at any point is finished by the same command; --status writes nothing.
- A grid study enqueues all its points once, at its start-up; its workers then only claim them.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import optuna
from mlflow.entities import Param, RunTag
from optuna.study import StudyDirection
from optuna.trial import TrialState

from rlvrlab.errors import RlvrlabError
from rlvrlab.outputs import file_lock, shared_file_lock
from rlvrlab.sweep.mismatch import mismatch_message
from rlvrlab.sweep.spec import SweepSpec, format_value
from rlvrlab.sweep.storage import open_storage, storage_url
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.mlflow_tracker import experiment_id_for, quiet_client
from rlvrlab.tracking.store import masked, store

ATTEMPT = T.ATTEMPT


def make_sampler(spec: SweepSpec, seed: int):
    """seed: sampler_seed mixed with what differs between invocations and workers (see open_sweep)."""

    # A grid study's trials are all enqueued with fixed values, so its sampler is never asked; Optuna's GridSampler
    # is not used because it calls study.stop() (outside an optimize loop: an error) and picks points on its own.
    if spec.sampler in ("grid", "random"):
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(spec: SweepSpec, steps: int):
    """Optuna's pruner of the study's step reports; none (NopPruner) for none and sequential, which reads each
    finished seed's value instead (rlvrlab.sweep.trials)."""
    kind = spec.pruner.type
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.pruner.startup_trials,
                                           n_warmup_steps=spec.pruner.warmup_steps)
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, spec.pruner.warmup_steps),
                                              max_resource=steps * spec.max_seeds)
    return optuna.pruners.NopPruner()


@dataclass
class Sweep:
    """An opened study and what its trials need."""
    spec: SweepSpec
    study: Any  # optuna.Study
    storage: Any
    storage_url: str
    study_id: int
    mlflow_uri: str
    artifact_root: Optional[Path]
    output_dir: Path
    steps: int
    epoch: Optional[str] = None  # this invocation's fail-fast epoch (rlvrlab.sweep.failfast); "" or None: off
    code_digest: Optional[str] = None  # the digest of the code its seed runs run (rlvrlab.sweep.guard)

    @property
    def study_run_id(self) -> str:
        return self.study.user_attrs[T.MLFLOW_RUN_ID]

    @property
    def started(self) -> bool:
        """Its start-up is done (sweep recorded, MLflow study run opened, grid enqueued). False only for a study
        opened with create=False (--status) whose start-up stopped: the next sweep command finishes it."""
        return bool(self.study.user_attrs.get(T.READY))

    def client(self):
        return quiet_client(self.mlflow_uri)

    @functools.cached_property
    def experiment_id(self) -> str:
        """The MLflow experiment of the study run, and so of its trial and seed runs (read once per process)."""
        return self.client().get_run(self.study_run_id).info.experiment_id


def open_sweep(spec: SweepSpec, storage: Optional[str] = None, *, create: bool = True, worker: int = 0) -> Sweep:
    """Load the study, checking it is the same sweep. create=True (the sweep command): create it first when it does
    not exist, and finish its start-up (`_initialise`) wherever an earlier one stopped. create=False (--status, and
    workers given a study their parent opened): write nothing.

    worker: this process's index among the invocation's workers. The sampler's seed mixes sampler_seed with it
    and with the number of trials the study already has, so that a resumed study or a second worker does not
    draw the same points again (a sampler re-created with one fixed seed repeats its first draws). A study run
    by one worker from start to end is reproducible."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    base = spec.base()
    output_dir = Path(base.output_dir).expanduser().resolve()
    url = storage_url(base.output_dir, storage)
    where = store(output_dir, base.tracking.uri)
    lock = _start_lock(url)
    # a creator holds the lock from before the storage file exists to the end of the start-up; a reader waits for it
    with nullcontext() if lock is None else file_lock(lock) if create else shared_file_lock(lock):
        backend = open_storage(url)
        existing = _trial_count(backend, spec.name)
        salt = os.getpid() if "://" in url else 0  # RDB: workers on other machines have other indices' twins
        seed = int(np.random.SeedSequence([spec.sampler_seed, existing, worker, salt]).generate_state(1)[0])
        sampler, pruner = make_sampler(spec, seed), make_pruner(spec, base.steps)
        created = False
        if create:
            try:
                study = optuna.create_study(study_name=spec.name, storage=backend, sampler=sampler, pruner=pruner,
                                            direction=StudyDirection[spec.objective.direction.upper()])
                created = True
                _stop_point("created")
            except optuna.exceptions.DuplicatedStudyError:
                pass
        if not created:
            try:
                study = optuna.load_study(study_name=spec.name, storage=backend, sampler=sampler, pruner=pruner)
            except KeyError:
                names = [s.study_name for s in optuna.get_all_study_summaries(backend, include_best_trial=False)]
                raise RlvrlabError(f"no study {spec.name!r} in {masked(url)}; studies there: "
                                   f"{', '.join(names) or 'none'} (run the sweep without --status to start it)"
                                   ) from None
        sweep = Sweep(spec, study, backend, url, backend.get_study_id_from_name(spec.name), where.uri,
                      where.artifact_root, output_dir, base.steps)
        _check_same_sweep(sweep)  # before anything is written into it
        if create and not sweep.started:
            if not (created or lock is not None):  # a server: its creator, on another machine, may be at work
                _wait_ready(sweep)
            _initialise(sweep)  # under the lock, a study not ready had a creator that stopped
            _check_same_sweep(sweep)
    return sweep


def _start_lock(url: str) -> Optional[Path]:
    """The file lock that one creator holds over a study's creation and start-up, beside a storage file (the
    journal, a sqlite database): a command that finds the study not ready under it knows its creator stopped (the
    kernel releases a killed holder's lock), and a reader (--status, a worker) waits under a shared lock while a
    live one works. None for a server (PostgreSQL), whose creator may be on another machine: `_wait_ready` waits
    for it."""
    if "://" not in url:
        path = Path(url).expanduser()
    elif url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///")).expanduser()
    else:
        return None
    return path.with_name(path.name + ".start.lock")


def _trial_count(storage, name: str) -> int:
    try:
        return len(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False))
    except KeyError:
        return 0


def _stop_point(phase: str) -> None:
    """RLVRLAB_KILL_IN_START=phase: SIGKILL this process at that point of a study's start-up (created, attrs,
    study_run, run_id, grid, enqueued), for tests of a sweep stopped there; read at each point (a few per study)."""
    if os.environ.get("RLVRLAB_KILL_IN_START") == phase:
        os.kill(os.getpid(), signal.SIGKILL)


def _initialise(sweep: Sweep) -> None:
    """A study's start-up, by one process: record the sweep, open its MLflow study run, enqueue the grid, then mark
    the study ready (workers are given it only then). Each phase is skipped where an earlier start-up did it, so
    one stopped at any point (killed, or failing on a held store) is finished by the next sweep command, with no
    grid point enqueued twice and no second study run."""
    spec, study = sweep.spec, sweep.study
    recorded = study.user_attrs
    for key, value in {
        T.FINGERPRINT: spec.fingerprint(), T.SEEDS: list(spec.seeds),
        T.OBJECTIVE: f"{spec.objective.aggregate} over seeds of {spec.objective.metric} "
                     f"(last {spec.objective.window} logged steps), {spec.objective.direction}",
        T.START_KEY: uuid.uuid4().hex,
    }.items():
        if key not in recorded:
            study.set_user_attr(key, value)
            _stop_point("attrs")
    if T.MLFLOW_RUN_ID not in recorded:
        study.set_user_attr(T.MLFLOW_RUN_ID, _open_study_run(sweep, study.user_attrs[T.START_KEY]))
        _stop_point("run_id")
    _enqueue_grid(sweep)
    _stop_point("enqueued")
    study.set_user_attr(T.READY, True)


def _open_study_run(sweep: Sweep, key: str) -> str:
    """The study's MLflow run: the one an earlier start-up created (tagged with the study's start key) or a new one;
    its sweep file and params are recorded (again: the same values are accepted)."""
    spec, client = sweep.spec, sweep.client()
    experiment_id = experiment_id_for(client, spec.name, sweep.artifact_root)
    found = client.search_runs([experiment_id], filter_string=f"tags.`{T.START_KEY}` = '{key}'", max_results=1)
    if found:
        run_id = found[0].info.run_id
    else:
        run_id = client.create_run(experiment_id, run_name=f"study {spec.name}", tags={
            T.ROLE: "study", T.STUDY: spec.name, T.STORAGE: masked(sweep.storage_url),
            T.FINGERPRINT: spec.fingerprint(), T.START_KEY: key}).info.run_id
        _stop_point("study_run")
    client.log_text(run_id, spec.file.read_text(), "sweep.yaml")
    client.log_batch(run_id, params=mlflow_params({
        "sampler": spec.sampler, "seeds": list(spec.seeds), "objective.metric": spec.objective.metric,
        "objective.direction": spec.objective.direction, "objective.window": spec.objective.window,
        "objective.aggregate": spec.objective.aggregate, "overrides": " ".join(spec.overrides),
        "experiment": spec.experiment or "default", "pruner": spec.pruner.type,
        **({"pruner.delta": spec.pruner.delta, "pruner.n_min": spec.pruner.n_min} if spec.pruner.delta else {}),
        **spec.runner.recorded(),  # a command sweep's command
        **({"seeds.adaptive": f"initial={spec.adaptive.initial} max={spec.adaptive.max} "
                              f"halfwidth={spec.adaptive.halfwidth}"} if spec.adaptive else {})}))
    return run_id


def _enqueue_grid(sweep: Sweep) -> None:
    """Enqueue the grid points that have no live or final trial yet (all of them for a new study)."""
    if sweep.spec.sampler != "grid":
        return

    # a WAITING trial has no params yet: its point is in the fixed params enqueue_trial gave it
    taken = {_point_key(t.params or t.system_attrs.get("fixed_params", {}))
             for t in sweep.study.get_trials(deepcopy=False)
             if t.state != TrialState.FAIL or t.user_attrs.get(T.FAILURE) == "run"}
    for point in sweep.spec.grid():
        if _point_key(point) not in taken:
            sweep.study.enqueue_trial(point, skip_if_exists=False)
            _stop_point("grid")


def _point_key(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _wait_ready(sweep: Sweep, timeout: float = 30.0) -> None:
    """Wait up to `timeout` seconds for the study's creator (on another machine: a server storage) to finish its
    start-up; the caller finishes it after that."""
    deadline = time.monotonic() + timeout
    while not sweep.started and time.monotonic() < deadline:
        time.sleep(0.2)


def _check_same_sweep(sweep: Sweep) -> None:
    """The study was started from this sweep (or its start-up stopped before recording which)."""
    fingerprint = sweep.study.user_attrs.get(T.FINGERPRINT)
    if fingerprint is not None and fingerprint != sweep.spec.fingerprint():
        run_id = sweep.study.user_attrs.get(T.MLFLOW_RUN_ID)
        raise RlvrlabError(mismatch_message(sweep.spec, masked(sweep.storage_url), fingerprint,
                                            sweep.client() if run_id else None, run_id))


def budget_used(sweep: Sweep) -> bool:
    """Trials that count against budget.trials: finished ones (except dead-worker failures, which are retried)
    and running ones."""
    limit = sweep.spec.trials
    if limit is None:
        return False
    trials = sweep.study.get_trials(deepcopy=False)
    retried = superseded(trials)
    return sum(1 for t in trials if counts(t, retried)) >= limit


def counts(trial: Any, retried: frozenset[int] = frozenset()) -> bool:
    """The trial counts against budget.trials (and as done, once finished): all but waiting ones, dead-worker
    failures and failed trials that a later attempt re-runs (`retried`: superseded(trials))."""
    if trial.state == TrialState.FAIL:
        return trial.user_attrs.get(T.FAILURE) != "worker" and trial.number not in retried
    return trial.state != TrialState.WAITING


def superseded(trials: list) -> frozenset[int]:
    """Numbers of the trials that a later attempt re-runs (a dead worker's retry, --retry-failed): the chain each
    retry records (Optuna's system attr retry_history)."""
    return frozenset(n for t in trials for n in t.system_attrs.get("retry_history", ()))


def attempt(trial: Any) -> int:
    """1 for a first run of its params, 2 for its first retry, ..."""
    return len(trial.system_attrs.get("retry_history", ())) + 1


def mlflow_params(values: dict[str, Any]) -> list[Param]:
    """MLflow params of config values, each written as an override would give it (format_value)."""
    return [Param(k, format_value(v) if not isinstance(v, str) else v) for k, v in values.items()]


def finish_study_run(sweep: Sweep) -> None:
    """When nothing is left to run: the best trial on the MLflow study run, which ends FINISHED."""
    trials = sweep.study.get_trials(deepcopy=False)
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials):
        return
    if sweep.spec.sampler != "grid" and not budget_used(sweep):
        return
    client = sweep.client()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        best = sweep.study.best_trial
        client.log_batch(sweep.study_run_id, tags=_best_tags(best))
    client.set_terminated(sweep.study_run_id, status="FINISHED")


def _best_tags(best) -> list:
    shown = " ".join(f"{k}={format_value(v)}" for k, v in best.params.items())
    return [RunTag(T.BEST_TRIAL, str(best.number)), RunTag(T.BEST_PARAMS, shown),
            RunTag(T.BEST_VALUE, format_value(best.value))]
