"""An Optuna study whose trials are groups of seed runs, recorded in MLflow as study -> trial -> seed runs.

How the pieces fit:
- Storage (`rlvrlab.sweep.storage`): Optuna's journal file by default, or an RDB URL for many machines.
- Trials are claimed, never duplicated. A grid study enqueues all its points once, when the study is created;
  workers then only pop WAITING trials (an atomic state change in the journal and PostgreSQL storages; not in
  sqlite, which ignores SELECT ... FOR UPDATE: bench/sweep_storage.py), so two workers never run the same point
  (Optuna's GridSampler alone re-runs points under concurrency). Samplers ask for new trials only when no
  enqueued trial waits.
- Start-up (`_initialise`: the sweep recorded, the MLflow study run opened, the grid enqueued, the study marked
  ready) is done by one process under a file lock beside the storage file, and each phase is skipped where done:
  a start-up stopped at any point is finished by the same command; --status writes nothing.
- Liveness (`rlvrlab.sweep.liveness`): a trial whose worker died is failed and re-enqueued; its finished seed runs
  are reused by the retry, so no seed is trained or counted twice.
- A seed run that fails (non-finite loss, bad data) fails its trial with the reason; the sweep goes on, and a
  re-run does not repeat it (it would fail the same way).
"""

from __future__ import annotations

import functools
import math
import os
import signal
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import optuna
from mlflow.entities import Metric, Param, RunTag
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from rlvrlab.config import compose, config_hash
from rlvrlab.errors import RlvrlabError, StorageError
from rlvrlab.outputs import file_lock, full_or_held, shared_file_lock
from rlvrlab.procs import raise_if_stop_requested, stop_at_safe_points
from rlvrlab.report.stats import seeds_for_halfwidth, t_interval
from rlvrlab.sweep.launch import run_seed_process
from rlvrlab.sweep.liveness import Heartbeat, close_runs, fail_and_retry, recover_stale, trial_id
from rlvrlab.sweep.mismatch import mismatch_message
from rlvrlab.sweep.spec import SweepSpec, format_value
from rlvrlab.sweep.storage import masked, open_storage, storage_url
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.mlflow_tracker import experiment_id_for, quiet_client
from rlvrlab.tracking.store import store


# ----------------------------------------------------------------------------------------------------- the study
def make_sampler(spec: SweepSpec, seed: int):
    """seed: sampler_seed mixed with what differs between invocations and workers (see open_sweep)."""

    # A grid study's trials are all enqueued with fixed values, so its sampler is never asked; Optuna's GridSampler
    # is not used because it calls study.stop() (outside an optimize loop: an error) and picks points on its own.
    if spec.sampler in ("grid", "random"):
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(spec: SweepSpec, steps: int):

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
    base = compose(spec.experiment, spec.overrides_for({}, spec.seeds[0]))
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
                                            direction=spec.objective.direction)
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
    client.log_batch(run_id, params=_params({
        "sampler": spec.sampler, "seeds": list(spec.seeds), "objective.metric": spec.objective.metric,
        "objective.direction": spec.objective.direction, "objective.window": spec.objective.window,
        "objective.aggregate": spec.objective.aggregate, "overrides": " ".join(spec.overrides),
        "experiment": spec.experiment or "default", "pruner": spec.pruner.type,
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


# --------------------------------------------------------------------------------------------------- the workers
@dataclass
class TrialOutcome:
    number: int
    state: str  # COMPLETE | FAIL | PRUNED
    value: Optional[float] = None
    reason: str = ""


@dataclass
class WorkerReport:
    outcomes: list[TrialOutcome] = field(default_factory=list)


OnSeed = Callable[[int, int, int], None]  # (trial number, seed position, seeds) after each seed run


def work(sweep: Sweep, *, deadline: Optional[float] = None, on_seed: Optional[OnSeed] = None) -> WorkerReport:
    """Claim and run trials until the study is done, the budget is used or the deadline passes."""

    with stop_at_safe_points():  # Ctrl-C or SIGTERM: stop between steps or trials (a stopped trial is re-enqueued)
        return _work(sweep, deadline, on_seed, raise_if_stop_requested)


def _work(sweep: Sweep, deadline: Optional[float], on_seed: Optional[OnSeed], safe_point) -> WorkerReport:
    report = WorkerReport()
    recover_stale(sweep)
    while deadline is None or time.time() < deadline:
        safe_point()
        trial = _next_trial(sweep)
        if trial is None and recover_stale(sweep):  # a worker died meanwhile: its trials are waiting again
            continue
        if trial is None:
            break
        report.outcomes.append(run_trial(sweep, trial, on_seed=on_seed))
    return report


def _next_trial(sweep: Sweep):
    """A WAITING trial claimed by this worker, or (samplers, within budget) a new one; None when nothing is left."""

    for frozen in sweep.storage.get_all_trials(sweep.study_id, deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if sweep.storage.set_trial_state_values(trial_id(frozen), state=TrialState.RUNNING):
                return optuna.Trial(sweep.study, trial_id(frozen))
        except UpdateFinishedTrialError:
            continue
    if sweep.spec.sampler == "grid" or budget_used(sweep):
        return None
    return sweep.study.ask()


def budget_used(sweep: Sweep) -> bool:
    """Trials that count against budget.trials: finished ones (except dead-worker failures, which are retried)
    and running ones."""
    limit = sweep.spec.trials
    if limit is None:
        return False
    return sum(1 for t in sweep.study.get_trials(deepcopy=False) if counts(t)) >= limit


def counts(trial) -> bool:

    if trial.state == TrialState.FAIL:
        return trial.user_attrs.get(T.FAILURE) != "worker"
    return trial.state != TrialState.WAITING


class _Pruned(Exception):
    pass


def run_trial(sweep: Sweep, trial, *, on_seed: Optional[OnSeed] = None) -> TrialOutcome:
    """Run every seed of one trial (reusing seed runs a dead worker finished), report to Optuna and MLflow."""


    spec, client = sweep.spec, sweep.client()
    heartbeat = Heartbeat(sweep.storage, trial_id(trial))
    trial_run = None
    try:
        params = {p.key: p.suggest(trial) for p in spec.space}
        cfg = compose(spec.experiment, spec.overrides_for(params, spec.seeds[0]))
        chash = config_hash(cfg)
        trial_run = _trial_run(sweep, client, trial, params, chash)
        trial.set_user_attr(T.MLFLOW_RUN_ID, trial_run)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:  # the worker's GPUs, which its seed runs see
            trial.set_user_attr(T.DEVICES, os.environ["CUDA_VISIBLE_DEVICES"])
        trial.set_user_attr(T.TRIAL_CONFIG_HASH, chash)
        values: dict[int, float] = {}
        run_ids: dict[int, str] = {}
        failures: dict[int, str] = {}
        seeds = list(spec.seeds)
        position = 0
        while position < len(seeds):  # adaptive seeds: a round at a time, while the interval is too wide
            for seed in seeds[position:]:
                run_id, value, error = _seed_run(sweep, client, trial, params, seed, position, trial_run)
                if run_id:
                    run_ids[seed] = run_id
                if error is not None:
                    failures[seed] = error
                else:
                    values[seed] = value
                trial.set_user_attr(T.VALUES, {str(s): v for s, v in values.items()})
                trial.set_user_attr(T.RUN_IDS, {str(s): r for s, r in run_ids.items()})
                if on_seed is not None:
                    on_seed(trial.number, position, len(seeds))
                position += 1
            if not failures:
                seeds = list(spec.seed_list(len(seeds) + more_seeds(spec, list(values.values()))))
        if failures:
            seed, reason = next(iter(failures.items()))
            message = f"{len(failures)}/{len(seeds)} seeds failed; seed {seed}: {reason}"
            trial.set_user_attr(T.FAILURE, "run")
            trial.set_user_attr(T.FAIL_REASON, message[:1000])
            sweep.study.tell(trial, state=TrialState.FAIL)
            _finish_trial_run(client, trial_run, "FAILED", {}, {T.FAIL_REASON: message[:5000]})
            return TrialOutcome(trial.number, "FAIL", reason=message)
        summary = seed_summary(list(values.values()))
        value = aggregate(summary, spec.objective.aggregate)
        trial.set_user_attr(T.SUMMARY, summary)
        sweep.study.tell(trial, value)
        _finish_trial_run(client, trial_run, "FINISHED", {
            "objective/value": value, "objective/mean": summary["mean"], "objective/ci95_low": summary["low"],
            "objective/ci95_high": summary["high"], "objective/sd": summary["sd"], "objective/n_seeds": summary["n"]},
            {})
        return TrialOutcome(trial.number, "COMPLETE", value=value)
    except _Pruned:
        trial.set_user_attr(T.FAILURE, "pruned")
        sweep.study.tell(trial, state=TrialState.PRUNED)
        _finish_trial_run(client, trial_run, "KILLED", {}, {T.PRUNED: "true"})
        return TrialOutcome(trial.number, "PRUNED")
    except RlvrlabError as error:  # the trial's config does not compose (e.g. a sampled value a rule rejects)
        if isinstance(error, StorageError):  # the place, not the trial: the stores may not take a write now; the
            raise  # next invocation finds this worker gone and re-runs the trial (rlvrlab.sweep.liveness)
        trial.set_user_attr(T.FAILURE, "run")
        trial.set_user_attr(T.FAIL_REASON, str(error)[:1000])
        sweep.study.tell(trial, state=TrialState.FAIL)
        _finish_trial_run(client, trial_run, "FAILED", {}, {T.FAIL_REASON: str(error)[:5000]})
        return TrialOutcome(trial.number, "FAIL", reason=str(error))
    except BaseException:
        # interrupted (Ctrl-C) or a bug: leave the trial to the liveness check of the next invocation, which
        # retries it; the MLflow runs are closed as KILLED
        if trial_run is not None:
            close_runs(client, trial_run, "KILLED")
        try:
            sweep.storage.set_trial_user_attr(trial_id(trial), T.FAILURE, "worker")
            sweep.storage.set_trial_user_attr(trial_id(trial), T.FAIL_REASON, "interrupted; re-enqueued")
            fail_and_retry(sweep, trial_id(trial))
        except Exception:
            pass
        raise
    finally:
        heartbeat.stop()


def _trial_run(sweep: Sweep, client, trial, params: dict, chash: str) -> str:
    if client.get_run(sweep.study_run_id).info.status != "RUNNING":  # a finished study given more budget
        client.update_run(sweep.study_run_id, status="RUNNING")
    run = client.create_run(sweep.experiment_id, run_name=f"trial {trial.number}",
                            tags={T.PARENT: sweep.study_run_id, T.ROLE: "trial",
                                  T.STUDY: sweep.spec.name, T.TRIAL: str(trial.number),
                                  "config_hash": chash, T.RETRY_OF: str(sweep.storage.get_trial_system_attrs(
                                      trial_id(trial)).get("failed_trial", ""))})
    client.log_batch(run.info.run_id, params=_params(params))
    return run.info.run_id


def _seed_run(sweep: Sweep, client, trial, params: dict, seed: int, position: int,
              trial_run: str) -> tuple[Optional[str], Optional[float], Optional[str]]:
    """(run id, objective value, failure reason) of one seed, reusing a finished run of an earlier attempt."""
    from rlvrlab.train.loop import RunStopped, train  # torch: only where a seed run trains
    from rlvrlab.train.metrics import step_metrics

    spec = sweep.spec
    cfg = compose(spec.experiment, spec.overrides_for(params, seed))
    done = _finished_seed_run(sweep, client, config_hash(cfg), seed)
    if done is not None:
        client.set_tag(done, T.PARENT, trial_run)
        client.set_tag(done, T.TRIAL, str(trial.number))
        return done, objective_of(client, done, spec.objective.metric, spec.objective.window), None

    metric, window, offset = spec.objective.metric, spec.objective.window, position * cfg.steps
    recent: list[float] = []

    class Prune(RunStopped, _Pruned):
        pass

    def report(step: int, batch, run, stats) -> None:
        if spec.pruner.type == "none" or stats is None:  # stats: None on steps that log nothing
            return
        value = step_metrics(stats).get(metric)
        if value is None:
            return
        recent.append(value)
        trial.report(float(np.mean(recent[-window:])), offset + step)
        if step >= spec.pruner.warmup_steps and trial.should_prune():
            raise Prune()

    tags = {T.PARENT: trial_run, T.ROLE: "seed", T.STUDY: spec.name,
            T.TRIAL: str(trial.number)}
    if spec.launcher.child:  # its own process (torchrun with several ranks): no per-step callback, no pruning
        reason = run_seed_process(spec, spec.overrides_for(params, seed), tags)
        run_id = _last_run_of(client, sweep, trial_run, seed)
        if reason is None and run_id is None:
            reason = "the seed run's process ended without an MLflow run under its trial"
        if reason is not None:
            if run_id is not None and client.get_run(run_id).info.status == "RUNNING":  # killed: it could not
                client.set_terminated(run_id, status="FAILED")
            return run_id, None, reason
        assert run_id is not None
        value = objective_of(client, run_id, metric, window)
        client.set_tag(run_id, T.OBJECTIVE, format_value(value))
        return run_id, value, None
    try:
        run_id = train(cfg, on_step=report, tags=tags)
    except RunStopped:
        raise
    except Exception as error:
        trouble = full_or_held(error)
        if trouble is not None:  # a full disk or a held store: the sweep stops and its next invocation re-runs it
            raise _stopped_by_storage(error, trouble, trial.number, seed) from None
        if isinstance(error, RlvrlabError):
            return _last_run_of(client, sweep, trial_run, seed), None, str(error)
        if os.environ.get("RLVRLAB_DEBUG") == "1":
            raise
        return _last_run_of(client, sweep, trial_run, seed), None, f"{type(error).__name__}: {error}"
    value = objective_of(client, run_id, metric, window)
    client.set_tag(run_id, T.OBJECTIVE, format_value(value))
    return run_id, value, None


def _stopped_by_storage(error: Exception, trouble: str, number: int, seed: int) -> StorageError:
    """A seed run stopped by a full disk or a held store, worded for the sweep: its trial is not failed (nothing is
    wrong with it), and the same command re-runs it."""
    what = error.what if isinstance(error, StorageError) else (
        ("no space left on the device" if trouble == "full" else "a sqlite store is locked by another process")
        + f" ({type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''})")
    fix = "free space there" if trouble == "full" else "wait for the process holding it to end"
    return StorageError(f"sweep stopped in trial {number}, seed {seed}: {what}; {fix}, then run the same command "
                        "again (the trial is re-run)", what=what)


def _finished_seed_run(sweep: Sweep, client, chash: str, seed: int) -> Optional[str]:
    found = client.search_runs(
        [sweep.experiment_id],
        filter_string=(f"tags.`{T.STUDY}` = '{sweep.spec.name}' and tags.config_hash = '{chash}' and "
                       f"tags.seed = '{seed}' and tags.`{T.ROLE}` = 'seed' and attributes.status = 'FINISHED'"),
        max_results=1)
    return found[0].info.run_id if found else None


def _last_run_of(client, sweep: Sweep, trial_run: str, seed: int) -> Optional[str]:
    found = client.search_runs([sweep.experiment_id],  # the trial run's experiment: the study's
                               filter_string=f"tags.`{T.PARENT}` = '{trial_run}' and tags.seed = '{seed}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def objective_of(client, run_id: str, metric: str, window: int) -> float:
    """Mean of `metric` over the last `window` logged steps of a run (the last value logged at each step)."""
    history = client.get_metric_history(run_id, metric)
    if not history:
        logged = sorted(client.get_run(run_id).data.metrics)
        raise RlvrlabError(f"run {run_id} logged no {metric!r}; it logged {', '.join(logged) or 'nothing'} "
                           "(change objective.metric)")
    by_step: dict[int, float] = {}
    for point in sorted(history, key=lambda m: (m.step, m.timestamp)):
        by_step[point.step] = point.value
    values = [by_step[s] for s in sorted(by_step)[-window:]]
    return float(np.mean(values))


def seed_summary(values: list[float]) -> dict[str, float]:
    """Mean over seeds with the report's Student-t 95% interval (rlvrlab.report.stats.t_interval; NaN bounds for
    one seed; NaN everywhere for a NaN value)."""

    x = np.asarray(values, dtype=float)
    interval = t_interval(x)
    sd = float(x.std(ddof=1)) if len(x) > 1 else math.nan
    return {"mean": interval.mean, "sd": sd, "low": interval.low, "high": interval.high,
            "halfwidth": interval.halfwidth, "n": len(x)}


def seeds_needed(values: list[float], halfwidth: float) -> int:
    """Seeds for a 95% t half-width of `halfwidth`, from the spread of `values` (rlvrlab.report.stats)."""

    return seeds_for_halfwidth(float(np.std(values, ddof=1)) if len(values) > 1 else math.inf, halfwidth)


def more_seeds(spec: SweepSpec, values: list[float]) -> int:
    """Adaptive seeds: how many seeds the next round adds (0: the interval is narrow enough, or max is reached).
    Only the spread of the values decides, never their mean."""
    if spec.adaptive is None:
        return 0
    target = min(seeds_needed(values, spec.adaptive.halfwidth), spec.adaptive.max)
    return max(0, target - len(values))


def aggregate(summary: dict[str, float], how: str) -> float:
    return {"mean": summary["mean"], "lcb95": summary["low"], "ucb95": summary["high"]}[how]


def _finish_trial_run(client, run_id: Optional[str], status: str, metrics: dict[str, float],
                      tags: dict[str, str]) -> None:
    if run_id is None:
        return

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    client.set_terminated(run_id, status=status)


def _params(values: dict[str, Any]) -> list:

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
