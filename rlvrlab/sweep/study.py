"""An Optuna study whose trials are groups of seed runs, recorded in MLflow as study -> trial -> seed runs.

How the pieces fit:
- Storage: Optuna's journal file by default (`<output_dir>/optuna.journal`, safe for several processes on one
  machine: every write is an appended record under a file lock), or any Optuna RDB URL (`postgresql://...`) for
  workers on many machines.
- Trials are claimed, never duplicated. A grid study enqueues all its points once, when the study is created;
  workers then only pop WAITING trials (an atomic state change in the journal and PostgreSQL storages; not in
  sqlite, which ignores SELECT ... FOR UPDATE: bench/sweep_storage.py), so two workers never run the same point (Optuna's GridSampler alone re-runs points under concurrency). Samplers ask for new trials
  only when no enqueued trial waits.
- Liveness: a worker records its host:pid and a heartbeat on the trial it runs. Optuna's own heartbeat exists only
  for RDB storages, so rlvrlab keeps one for all: a RUNNING trial whose worker is gone (same host: the process
  no longer exists; any host: no heartbeat for STALE_AFTER seconds) is marked FAIL and re-enqueued with Optuna's
  RetryHeartbeatStaleTrialCallback. Its finished seed runs are reused by the retry, so no seed is trained or
  counted twice.
- A seed run that fails (non-finite loss, bad data) fails its trial with the reason; the sweep goes on, and a
  re-run does not repeat it (it would fail the same way).
"""

from __future__ import annotations

import copy
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.sweep.spec import SweepSpec, format_value

HEARTBEAT_SECONDS = 10.0
STALE_AFTER = 120.0  # seconds without a heartbeat after which a trial on another host counts as dead
MAX_RETRY = 3  # re-runs of a trial whose worker died, before it stays failed
ATTR = "rlvrlab."  # prefix of rlvrlab's study and trial attributes


# ---------------------------------------------------------------------------------------------- storage and study
def storage_url(spec_output_dir: str, storage: Optional[str]) -> str:
    """The storage as given, or the default journal file in the base config's output_dir."""
    if storage:
        return storage
    return str(Path(spec_output_dir).expanduser().resolve() / "optuna.journal")


def open_storage(url: str):
    """A journal file path (default) or an RDB URL; one-line errors for unreachable servers."""
    import optuna

    if "://" not in url:
        from optuna.storages.journal import JournalFileBackend

        path = Path(url).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    for attempt in range(5):
        try:
            engine = {"pool_pre_ping": True}
            if url.startswith("sqlite"):  # wait for the lock instead of failing after pysqlite's 5 s
                engine["connect_args"] = {"timeout": 60}
            return optuna.storages.RDBStorage(url, engine_kwargs=engine)
        except ImportError as error:  # optuna wraps the driver's ModuleNotFoundError
            raise RlvrlabError(f"--storage {masked(url)}: the database driver is not installed ({error}); for "
                               "PostgreSQL: pip install 'rlvrlab[postgres]'") from None
        except Exception as error:  # sqlalchemy's OperationalError & co
            # two workers creating the tables of a fresh database at once collide (a unique violation on
            # PostgreSQL's catalog); the loser retries and finds the tables there
            collided = "UniqueViolation" in repr(error) or "IntegrityError" in type(error).__name__
            if collided and attempt < 4:
                time.sleep(0.5 * (attempt + 1))
                continue
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RlvrlabError(f"cannot open the Optuna storage {masked(url)}: {first}") from None
    raise AssertionError("unreachable")


def masked(url: str) -> str:
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("://")[0] + "://..."


def make_sampler(spec: SweepSpec, seed: int):
    """seed: sampler_seed mixed with what differs between invocations and workers (see open_sweep)."""
    import optuna

    # A grid study's trials are all enqueued with fixed values, so its sampler is never asked; Optuna's GridSampler
    # is not used because it calls study.stop() (outside an optimize loop: an error) and picks points on its own.
    if spec.sampler in ("grid", "random"):
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(spec: SweepSpec, steps: int):
    import optuna

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
        return self.study.user_attrs[ATTR + "mlflow_run_id"]

    def client(self):
        from rlvrlab.tracking.mlflow_tracker import quiet_client

        return quiet_client(self.mlflow_uri)


def open_sweep(spec: SweepSpec, storage: Optional[str] = None, *, create: bool = True, worker: int = 0) -> Sweep:
    """Create the study (enqueue its grid, open its MLflow study run) or load it, checking it is the same sweep.

    worker: this process's index among the invocation's workers. The sampler's seed mixes sampler_seed with it
    and with the number of trials the study already has, so that a resumed study or a second worker does not
    draw the same points again (a sampler re-created with one fixed seed repeats its first draws). A study run
    by one worker from start to end is reproducible."""
    import optuna

    from rlvrlab.config import compose
    from rlvrlab.tracking.mlflow_tracker import default_uri

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    base = compose(spec.experiment, spec.overrides_for({}, spec.seeds[0]))
    output_dir = Path(base.output_dir).expanduser().resolve()
    url = storage_url(base.output_dir, storage)
    backend = open_storage(url)
    existing = _trial_count(backend, spec.name)
    salt = os.getpid() if "://" in url else 0  # RDB: workers on other machines have other indices' twins
    seed = int(np.random.SeedSequence([spec.sampler_seed, existing, worker, salt]).generate_state(1)[0])
    sampler, pruner = make_sampler(spec, seed), make_pruner(spec, base.steps)
    direction = spec.objective.direction
    created = False
    if create:
        try:
            study = optuna.create_study(study_name=spec.name, storage=backend, sampler=sampler, pruner=pruner,
                                        direction=direction)
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            pass
    if not created:
        try:
            study = optuna.load_study(study_name=spec.name, storage=backend, sampler=sampler, pruner=pruner)
        except KeyError:
            names = [s.study_name for s in optuna.get_all_study_summaries(backend, include_best_trial=False)]
            raise RlvrlabError(f"no study {spec.name!r} in {masked(url)}; studies there: "
                               f"{', '.join(names) or 'none'} (run the sweep without --status to start it)") from None
    uri = base.tracking.uri or default_uri(output_dir)
    artifact_root = None if base.tracking.uri else output_dir / "mlartifacts"
    sweep = Sweep(spec, study, backend, url, backend.get_study_id_from_name(spec.name), uri, artifact_root,
                  output_dir, base.steps)
    if created:
        _initialise(sweep)
    else:
        _wait_ready(sweep)
    return sweep


def _trial_count(storage, name: str) -> int:
    try:
        return len(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False))
    except KeyError:
        return 0


def _initialise(sweep: Sweep) -> None:
    """Once per study, by the process that created it: record the sweep, open the MLflow study run, enqueue the
    grid, then mark the study ready (other workers wait for that mark)."""
    from rlvrlab.tracking.mlflow_tracker import experiment_id_for

    spec, study = sweep.spec, sweep.study
    study.set_user_attr(ATTR + "fingerprint", spec.fingerprint())
    study.set_user_attr(ATTR + "seeds", list(spec.seeds))
    study.set_user_attr(ATTR + "objective", f"{spec.objective.aggregate} over seeds of {spec.objective.metric} "
                        f"(last {spec.objective.window} steps), {spec.objective.direction}")
    client = sweep.client()
    experiment_id = experiment_id_for(client, spec.name, sweep.artifact_root)
    run = client.create_run(experiment_id, run_name=f"study {spec.name}", tags={
        ATTR + "role": "study", ATTR + "study": spec.name, ATTR + "storage": masked(sweep.storage_url),
        ATTR + "fingerprint": spec.fingerprint()})
    client.log_text(run.info.run_id, spec.file.read_text(), "sweep.yaml")
    client.log_batch(run.info.run_id, params=_params({
        "sampler": spec.sampler, "seeds": list(spec.seeds), "objective.metric": spec.objective.metric,
        "objective.direction": spec.objective.direction, "objective.window": spec.objective.window,
        "objective.aggregate": spec.objective.aggregate, "overrides": " ".join(spec.overrides),
        "experiment": spec.experiment or "default", "pruner": spec.pruner.type,
        **({"seeds.adaptive": f"initial={spec.adaptive.initial} max={spec.adaptive.max} "
                              f"halfwidth={spec.adaptive.halfwidth}"} if spec.adaptive else {})}))
    study.set_user_attr(ATTR + "mlflow_run_id", run.info.run_id)
    _enqueue_grid(sweep)
    study.set_user_attr(ATTR + "ready", True)


def _enqueue_grid(sweep: Sweep) -> None:
    """Enqueue the grid points that have no live or final trial yet (all of them for a new study)."""
    if sweep.spec.sampler != "grid":
        return
    import optuna

    taken = {_point_key(t.params) for t in sweep.study.get_trials(deepcopy=False) if t.state != optuna.trial.
             TrialState.FAIL or t.user_attrs.get(ATTR + "failure") == "run"}
    for point in sweep.spec.grid():
        if _point_key(point) not in taken:
            sweep.study.enqueue_trial(point, skip_if_exists=False)


def _point_key(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _wait_ready(sweep: Sweep, timeout: float = 30.0) -> None:
    """Check the loaded study is this sweep; wait for its creator to finish enqueueing (or finish it for a creator
    that died in between)."""
    fingerprint = sweep.study.user_attrs.get(ATTR + "fingerprint")
    deadline = time.monotonic() + timeout
    while not sweep.study.user_attrs.get(ATTR + "ready"):
        if time.monotonic() > deadline:
            if fingerprint is None:
                _initialise(sweep)
            else:
                _enqueue_grid(sweep)
                sweep.study.set_user_attr(ATTR + "ready", True)
            break
        time.sleep(0.2)
        fingerprint = sweep.study.user_attrs.get(ATTR + "fingerprint")
    if fingerprint is not None and fingerprint != sweep.spec.fingerprint():
        raise RlvrlabError(
            f"study {sweep.spec.name!r} in {masked(sweep.storage_url)} was started from a different sweep "
            f"(fingerprint {fingerprint}, this file {sweep.spec.fingerprint()}: space, seeds, objective, base "
            "config or overrides changed); give it a new name with --name, or restore the file")


# ------------------------------------------------------------------------------------------------------ liveness
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
        storage.set_trial_system_attr(trial_id, ATTR + "worker", worker_id())
        self._beat()
        self._thread = threading.Thread(target=self._run, name="rlvrlab-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self.storage.set_trial_system_attr(self.trial_id, ATTR + "heartbeat", time.time())

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
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    recovered = []
    for trial in sweep.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.system_attrs.get(ATTR + "worker", "")
        beat = trial.system_attrs.get(ATTR + "heartbeat")
        if beat is None and trial.datetime_start is not None:
            beat = trial.datetime_start.timestamp()
        if not (_worker_gone(worker) or (beat is not None and time.time() - beat > STALE_AFTER)):
            continue
        # the reason goes on while the trial is still RUNNING (a finished trial takes no attributes); the FAIL
        # transition below is atomic, so only one process re-enqueues it
        try:
            sweep.storage.set_trial_user_attr(trial._trial_id, ATTR + "failure", "worker")
            sweep.storage.set_trial_user_attr(trial._trial_id, ATTR + "fail_reason",
                                              f"worker {worker.split(':')[1] if worker else '?'} died; re-run")
        except UpdateFinishedTrialError:
            continue  # another process recovered it first
        if not _fail_and_retry(sweep, trial._trial_id):
            continue
        frozen = sweep.storage.get_trial(trial._trial_id)
        run_id = frozen.user_attrs.get(ATTR + "mlflow_run_id")
        if run_id:
            _close_runs(sweep.client(), run_id, "KILLED")
        recovered.append(trial.number)
    return recovered


def _fail_and_retry(sweep: Sweep, trial_id: int) -> bool:
    """RUNNING -> FAIL, then enqueue a copy with the same params (Optuna's retry callback records the lineage:
    system attrs failed_trial and retry_history). False when another process finished or failed it first."""
    import warnings

    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    try:
        if not sweep.storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
            return False
    except UpdateFinishedTrialError:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the callback is marked experimental
        # user attrs are not carried over: the retry gets its own MLflow run and reason
        frozen = copy.deepcopy(sweep.storage.get_trial(trial_id))  # storages may hand out their cached object
        frozen.user_attrs = {}
        # nor is the dead worker's liveness record: on the WAITING copy it would make the copy look dead again in
        # the moment between another worker claiming it and its first heartbeat (found by tests/test_sweep.py)
        frozen.system_attrs = {k: v for k, v in frozen.system_attrs.items()
                               if k not in (ATTR + "worker", ATTR + "heartbeat")}
        RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)(sweep.study, frozen)
    return True


def _close_runs(client, trial_run_id: str, status: str) -> None:
    """End a dead trial's MLflow run and its still-RUNNING seed runs."""
    run = client.get_run(trial_run_id)
    children = client.search_runs([run.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{trial_run_id}' and "
                                                "attributes.status = 'RUNNING'")
    for child in children:
        client.set_terminated(child.info.run_id, status=status)
    if run.info.status == "RUNNING":
        client.set_terminated(trial_run_id, status=status)


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
    from rlvrlab.procs import raise_if_stop_requested, stop_at_safe_points

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
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    for frozen in sweep.storage.get_all_trials(sweep.study_id, deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if sweep.storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
                return optuna.Trial(sweep.study, frozen._trial_id)
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
    from optuna.trial import TrialState

    if trial.state == TrialState.FAIL:
        return trial.user_attrs.get(ATTR + "failure") != "worker"
    return trial.state != TrialState.WAITING


class _Pruned(Exception):
    pass


def run_trial(sweep: Sweep, trial, *, on_seed: Optional[OnSeed] = None) -> TrialOutcome:
    """Run every seed of one trial (reusing seed runs a dead worker finished), report to Optuna and MLflow."""
    from optuna.trial import TrialState

    from rlvrlab.config import compose, config_hash

    spec, client = sweep.spec, sweep.client()
    heartbeat = Heartbeat(sweep.storage, trial._trial_id)
    trial_run = None
    try:
        params = {p.key: p.suggest(trial) for p in spec.space}
        cfg = compose(spec.experiment, spec.overrides_for(params, spec.seeds[0]))
        chash = config_hash(cfg)
        trial_run = _trial_run(sweep, client, trial, params, chash)
        trial.set_user_attr(ATTR + "mlflow_run_id", trial_run)
        trial.set_user_attr(ATTR + "config_hash", chash)
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
                trial.set_user_attr(ATTR + "values", {str(s): v for s, v in values.items()})
                trial.set_user_attr(ATTR + "run_ids", {str(s): r for s, r in run_ids.items()})
                if on_seed is not None:
                    on_seed(trial.number, position, len(seeds))
                position += 1
            if not failures:
                seeds = list(spec.seed_list(len(seeds) + more_seeds(spec, list(values.values()))))
        if failures:
            seed, reason = next(iter(failures.items()))
            message = f"{len(failures)}/{len(seeds)} seeds failed; seed {seed}: {reason}"
            trial.set_user_attr(ATTR + "failure", "run")
            trial.set_user_attr(ATTR + "fail_reason", message[:1000])
            sweep.study.tell(trial, state=TrialState.FAIL)
            _finish_trial_run(client, trial_run, "FAILED", {}, {ATTR + "fail_reason": message[:5000]})
            return TrialOutcome(trial.number, "FAIL", reason=message)
        summary = seed_summary(list(values.values()))
        value = aggregate(summary, spec.objective.aggregate)
        trial.set_user_attr(ATTR + "summary", summary)
        sweep.study.tell(trial, value)
        _finish_trial_run(client, trial_run, "FINISHED", {
            "objective/value": value, "objective/mean": summary["mean"], "objective/ci95_low": summary["low"],
            "objective/ci95_high": summary["high"], "objective/sd": summary["sd"], "objective/n_seeds": summary["n"]},
            {})
        return TrialOutcome(trial.number, "COMPLETE", value=value)
    except _Pruned:
        trial.set_user_attr(ATTR + "failure", "pruned")
        sweep.study.tell(trial, state=TrialState.PRUNED)
        _finish_trial_run(client, trial_run, "KILLED", {}, {ATTR + "pruned": "true"})
        return TrialOutcome(trial.number, "PRUNED")
    except RlvrlabError as error:  # the trial's config does not compose (e.g. a sampled value a rule rejects)
        trial.set_user_attr(ATTR + "failure", "run")
        trial.set_user_attr(ATTR + "fail_reason", str(error)[:1000])
        sweep.study.tell(trial, state=TrialState.FAIL)
        _finish_trial_run(client, trial_run, "FAILED", {}, {ATTR + "fail_reason": str(error)[:5000]})
        return TrialOutcome(trial.number, "FAIL", reason=str(error))
    except BaseException:
        # interrupted (Ctrl-C) or a bug: leave the trial to the liveness check of the next invocation, which
        # retries it; the MLflow runs are closed as KILLED
        if trial_run is not None:
            _close_runs(client, trial_run, "KILLED")
        try:
            sweep.storage.set_trial_user_attr(trial._trial_id, ATTR + "failure", "worker")
            sweep.storage.set_trial_user_attr(trial._trial_id, ATTR + "fail_reason", "interrupted; re-enqueued")
            _fail_and_retry(sweep, trial._trial_id)
        except Exception:
            pass
        raise
    finally:
        heartbeat.stop()


def _trial_run(sweep: Sweep, client, trial, params: dict, chash: str) -> str:
    if client.get_run(sweep.study_run_id).info.status != "RUNNING":  # a finished study given more budget
        client.update_run(sweep.study_run_id, status="RUNNING")
    run = client.create_run(client.get_run(sweep.study_run_id).info.experiment_id, run_name=f"trial {trial.number}",
                            tags={"mlflow.parentRunId": sweep.study_run_id, ATTR + "role": "trial",
                                  ATTR + "study": sweep.spec.name, ATTR + "trial": str(trial.number),
                                  "config_hash": chash, ATTR + "retry_of": str(sweep.storage.get_trial_system_attrs(
                                      trial._trial_id).get("failed_trial", ""))})
    client.log_batch(run.info.run_id, params=_params(params))
    return run.info.run_id


def _seed_run(sweep: Sweep, client, trial, params: dict, seed: int, position: int,
              trial_run: str) -> tuple[Optional[str], Optional[float], Optional[str]]:
    """(run id, objective value, failure reason) of one seed, reusing a finished run of an earlier attempt."""
    from rlvrlab.config import compose, config_hash
    from rlvrlab.tracking.metrics import step_metrics
    from rlvrlab.train.loop import RunStopped, train

    spec = sweep.spec
    cfg = compose(spec.experiment, spec.overrides_for(params, seed))
    done = _finished_seed_run(sweep, client, config_hash(cfg), seed)
    if done is not None:
        client.set_tag(done, "mlflow.parentRunId", trial_run)
        client.set_tag(done, ATTR + "trial", str(trial.number))
        return done, objective_of(client, done, spec.objective.metric, spec.objective.window), None

    metric, window, offset = spec.objective.metric, spec.objective.window, position * cfg.steps
    recent: list[float] = []

    class Prune(RunStopped, _Pruned):
        pass

    def report(step: int, batch, run, stats) -> None:
        if spec.pruner.type == "none":
            return
        value = step_metrics(stats).get(metric)
        if value is None:
            return
        recent.append(value)
        trial.report(float(np.mean(recent[-window:])), offset + step)
        if step >= spec.pruner.warmup_steps and trial.should_prune():
            raise Prune()

    tags = {"mlflow.parentRunId": trial_run, ATTR + "role": "seed", ATTR + "study": spec.name,
            ATTR + "trial": str(trial.number)}
    try:
        run_id = train(cfg, on_step=report, tags=tags)
    except RunStopped:
        raise
    except RlvrlabError as error:
        return _last_run_of(client, sweep, trial_run, seed), None, str(error)
    except Exception as error:
        if os.environ.get("RLVRLAB_DEBUG") == "1":
            raise
        return _last_run_of(client, sweep, trial_run, seed), None, f"{type(error).__name__}: {error}"
    value = objective_of(client, run_id, metric, window)
    client.set_tag(run_id, ATTR + "objective", format_value(value))
    return run_id, value, None


def _finished_seed_run(sweep: Sweep, client, chash: str, seed: int) -> Optional[str]:
    found = client.search_runs(
        [client.get_run(sweep.study_run_id).info.experiment_id],
        filter_string=(f"tags.`{ATTR}study` = '{sweep.spec.name}' and tags.config_hash = '{chash}' and "
                       f"tags.seed = '{seed}' and tags.`{ATTR}role` = 'seed' and attributes.status = 'FINISHED'"),
        max_results=1)
    return found[0].info.run_id if found else None


def _last_run_of(client, sweep: Sweep, trial_run: str, seed: int) -> Optional[str]:
    found = client.search_runs([client.get_run(trial_run).info.experiment_id],
                               filter_string=f"tags.`mlflow.parentRunId` = '{trial_run}' and tags.seed = '{seed}'",
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
    from rlvrlab.report.stats import t_interval

    x = np.asarray(values, dtype=float)
    interval = t_interval(x)
    sd = float(x.std(ddof=1)) if len(x) > 1 else math.nan
    return {"mean": interval.mean, "sd": sd, "low": interval.low, "high": interval.high,
            "halfwidth": interval.halfwidth, "n": len(x)}


def seeds_needed(values: list[float], halfwidth: float) -> int:
    """Seeds for a 95% t half-width of `halfwidth`, from the spread of `values` (rlvrlab.report.stats)."""
    from rlvrlab.report.stats import seeds_for_halfwidth

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
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    client.set_terminated(run_id, status=status)


def _params(values: dict[str, Any]) -> list:
    from mlflow.entities import Param

    return [Param(k, format_value(v) if not isinstance(v, str) else v) for k, v in values.items()]


def finish_study_run(sweep: Sweep) -> None:
    """When nothing is left to run: the best trial on the MLflow study run, which ends FINISHED."""
    from optuna.trial import TrialState

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
    from mlflow.entities import RunTag

    shown = " ".join(f"{k}={format_value(v)}" for k, v in best.params.items())
    return [RunTag(ATTR + "best_trial", str(best.number)), RunTag(ATTR + "best_params", shown),
            RunTag(ATTR + "best_value", format_value(best.value))]
