"""A study's trials: claimed by a worker, each a group of seed runs (adaptive seeds: Stein's two stages,
rlvrlab.sweep.seeds), scored over its seeds and told to Optuna and MLflow (the study itself: rlvrlab.sweep.study).

- Trials are claimed, never duplicated. Workers only pop WAITING trials (an atomic state change in the journal and
  PostgreSQL storages; not in sqlite, which ignores SELECT ... FOR UPDATE: bench/sweep_storage.py), so two workers
  never run the same grid point (Optuna's GridSampler alone re-runs points under concurrency). Samplers ask for new
  trials only when no enqueued trial waits.
- Liveness (`rlvrlab.sweep.liveness`): a trial whose worker died is failed and re-enqueued; its finished seed runs
  are reused by the retry, so no seed is trained or counted twice.
- A seed run that fails (non-finite loss, bad data) fails its trial with the reason; the sweep goes on, and a
  re-run does not repeat it (it would fail the same way) unless asked to (--retry-failed: rlvrlab.sweep.retry).
- Fail-fast (`rlvrlab.sweep.failfast`): when the invocation's first failed seed runs fail the same way, every
  worker stops before its next seed run; a trial cut short by it fails (it had a failed seed) or is re-enqueued.
- Each trial and seed run is tagged with its attempt (rlvrlab.attempt: 1, then 2 for its first retry), the trial
  it retries (rlvrlab.retry_of) and the digest of the code it ran (rlvrlab.code_digest: rlvrlab.sweep.guard).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import optuna
from mlflow.entities import Metric, RunTag
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from rlvrlab.config import compose, config_hash
from rlvrlab.errors import RlvrlabError, StorageError
from rlvrlab.outputs import full_or_held
from rlvrlab.procs import raise_if_stop_requested, stop_at_safe_points
from rlvrlab.sweep import failfast
from rlvrlab.sweep.command import run_command_seed
from rlvrlab.sweep.guard import CODE_DIGEST, recorded_digest
from rlvrlab.sweep.launch import run_seed_child
from rlvrlab.sweep.liveness import Heartbeat, close_runs, fail_and_retry, recover_stale, trial_id
from rlvrlab.sweep.objective import AGGREGATES, objective_of, seed_summary, window_mean
from rlvrlab.sweep.seeds import seed_count
from rlvrlab.sweep.spec import SweepSpec, format_value
from rlvrlab.sweep.study import ATTEMPT, Sweep, budget_used, mlflow_params
from rlvrlab.tracking import tags as T


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


@dataclass(frozen=True)
class _SeedDone:
    run_id: str
    value: float  # its objective (objective_of)
    reused: bool = False  # a finished run of an earlier attempt


@dataclass(frozen=True)
class _SeedFailed:
    run_id: Optional[str]  # its MLflow run, where it got as far as one
    reason: str


OnSeed = Callable[[int, int, int], None]  # (trial number, seed position, seeds) after each seed run


def work(sweep: Sweep, *, deadline: Optional[float] = None, on_seed: Optional[OnSeed] = None) -> WorkerReport:
    """Claim and run trials until the study is done, the budget is used or the deadline passes."""
    with stop_at_safe_points():  # Ctrl-C or SIGTERM: stop between steps or trials (a stopped trial is re-enqueued)
        return _work(sweep, deadline, on_seed, raise_if_stop_requested)


def _work(sweep: Sweep, deadline: Optional[float], on_seed: Optional[OnSeed], safe_point) -> WorkerReport:
    report = WorkerReport()
    if sweep.epoch is None:  # a worker process: the invocation its parent armed fail-fast for
        sweep.epoch = failfast.epoch_of(sweep.study)
    if sweep.code_digest is None:
        sweep.code_digest = recorded_digest(sweep.study)
    recover_stale(sweep)
    while deadline is None or time.time() < deadline:
        safe_point()
        if failfast.stopped(sweep.study, sweep.epoch):
            break
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
            if sweep.storage.set_trial_state_values(trial_id(sweep, frozen), state=TrialState.RUNNING):
                return optuna.Trial(sweep.study, trial_id(sweep, frozen))
        except UpdateFinishedTrialError:
            continue
    if sweep.spec.sampler == "grid" or budget_used(sweep):
        return None
    return sweep.study.ask()


class _Pruned(Exception):
    pass


class _FailFast(Exception):
    """Fail-fast stopped the sweep (this worker's seed run or another's): the trial runs no more seeds."""


def run_trial(sweep: Sweep, trial, *, on_seed: Optional[OnSeed] = None) -> TrialOutcome:
    """Run every seed of one trial (reusing seed runs a dead worker finished), report to Optuna and MLflow."""


    spec, client = sweep.spec, sweep.client()
    heartbeat = Heartbeat(sweep.storage, trial_id(sweep, trial))
    trial_run = None
    failures: dict[int, str] = {}
    seeds = list(spec.seeds)
    try:
        params = {p.key: p.suggest(trial) for p in spec.space}
        chash = spec.trial_hash(params)
        lineage = _lineage_tags(sweep, trial)
        trial_run = _trial_run(sweep, client, trial, params, chash, lineage)
        trial.set_user_attr(T.MLFLOW_RUN_ID, trial_run)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:  # the worker's GPUs, which its seed runs see
            trial.set_user_attr(T.DEVICES, os.environ["CUDA_VISIBLE_DEVICES"])
        trial.set_user_attr(T.TRIAL_CONFIG_HASH, chash)
        values: dict[int, float] = {}
        run_ids: dict[int, str] = {}
        position = 0
        while position < len(seeds):  # adaptive seeds: stage one, then stage two (a third round adds none)
            for seed in seeds[position:]:
                if failfast.stopped(sweep.study, sweep.epoch or ""):
                    raise _FailFast()
                outcome = _seed_run(sweep, client, trial, params, seed, position, trial_run, lineage)
                if outcome.run_id:
                    run_ids[seed] = outcome.run_id
                if isinstance(outcome, _SeedFailed):
                    failures[seed] = outcome.reason
                else:
                    values[seed] = outcome.value
                if not (isinstance(outcome, _SeedDone) and outcome.reused):
                    failfast.record(sweep.study, sweep.epoch or "", trial.number, seed,
                                    outcome.reason if isinstance(outcome, _SeedFailed) else None)
                trial.set_user_attr(T.VALUES, {str(s): v for s, v in values.items()})
                trial.set_user_attr(T.RUN_IDS, {str(s): r for s, r in run_ids.items()})
                if on_seed is not None:
                    on_seed(trial.number, position, len(seeds))
                position += 1
            if not failures:
                seeds = list(spec.seed_list(len(seeds) + more_seeds(spec, values)))
        if failures:
            return _fail_trial(sweep, client, trial, trial_run, failures, len(seeds))
        summary = seed_summary(values, spec.adaptive)  # adaptive: Stein's interval, the one the objective uses
        value = AGGREGATES[spec.objective.aggregate].over(values, spec.adaptive)
        trial.set_user_attr(T.SUMMARY, summary)
        sweep.study.tell(trial, value)
        _finish_trial_run(client, trial_run, "FINISHED", {
            "objective/value": value, "objective/mean": summary["mean"], "objective/ci95_low": summary["low"],
            "objective/ci95_high": summary["high"], "objective/sd": summary["sd"], "objective/n_seeds": summary["n"]},
            {})
        return TrialOutcome(trial.number, "COMPLETE", value=value)
    except _FailFast:
        if failures:  # it failed already: it stays failed (--retry-failed re-runs it)
            return _fail_trial(sweep, client, trial, trial_run, failures, len(seeds), cut=True)
        reason = "stopped by fail-fast before its seeds were done; re-enqueued"
        if trial_run is not None:
            close_runs(client, trial_run, "KILLED")
        sweep.storage.set_trial_user_attr(trial_id(sweep, trial), T.FAILURE, "worker")
        sweep.storage.set_trial_user_attr(trial_id(sweep, trial), T.FAIL_REASON, reason)
        fail_and_retry(sweep, trial_id(sweep, trial))
        return TrialOutcome(trial.number, "FAIL", reason=reason)
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
            sweep.storage.set_trial_user_attr(trial_id(sweep, trial), T.FAILURE, "worker")
            sweep.storage.set_trial_user_attr(trial_id(sweep, trial), T.FAIL_REASON, "interrupted; re-enqueued")
            fail_and_retry(sweep, trial_id(sweep, trial))
        except Exception:
            pass
        raise
    finally:
        heartbeat.stop()


def _fail_trial(sweep: Sweep, client, trial, trial_run: Optional[str], failures: dict[int, str], seeds: int,
                cut: bool = False) -> TrialOutcome:
    seed, reason = next(iter(failures.items()))
    message = f"{len(failures)}/{seeds} seeds failed; seed {seed}: {reason}"
    if cut:
        message = f"{message}; the rest of its seeds not run (fail-fast)"
    trial.set_user_attr(T.FAILURE, "run")
    trial.set_user_attr(T.FAIL_REASON, message[:1000])
    sweep.study.tell(trial, state=TrialState.FAIL)
    _finish_trial_run(client, trial_run, "FAILED", {}, {T.FAIL_REASON: message[:5000]})
    return TrialOutcome(trial.number, "FAIL", reason=message)


def _lineage_tags(sweep: Sweep, trial) -> dict[str, str]:
    """The attempt, the trial it retries and the code digest, tagged on its trial run and its new seed runs."""
    system = sweep.storage.get_trial_system_attrs(trial_id(sweep, trial))
    return {ATTEMPT: str(len(system.get("retry_history", ())) + 1),
            **({T.RETRY_OF: str(system["failed_trial"])} if "failed_trial" in system else {}),
            **({CODE_DIGEST: sweep.code_digest} if sweep.code_digest else {})}


def _trial_run(sweep: Sweep, client, trial, params: dict, chash: str, lineage: dict[str, str]) -> str:
    if client.get_run(sweep.study_run_id).info.status != "RUNNING":  # a finished study given more budget
        client.update_run(sweep.study_run_id, status="RUNNING")
    run = client.create_run(sweep.experiment_id, run_name=f"trial {trial.number}",
                            tags={T.PARENT: sweep.study_run_id, T.ROLE: "trial",
                                  T.STUDY: sweep.spec.name, T.TRIAL: str(trial.number),
                                  "config_hash": chash, T.RETRY_OF: "", **lineage})
    client.log_batch(run.info.run_id, params=mlflow_params(params))
    return run.info.run_id


def _seed_run(sweep: Sweep, client, trial, params: dict, seed: int, position: int,
              trial_run: str, lineage: dict[str, str]) -> _SeedDone | _SeedFailed:
    """One seed's run and objective, or why it failed; a finished run of an earlier attempt is reused."""
    from rlvrlab.train.loop import RunStopped, train  # torch: only where a seed run trains
    from rlvrlab.train.metrics import step_metrics

    spec = sweep.spec
    cfg = compose(spec.experiment, spec.overrides_for(params, seed)) if spec.command is None else None
    done = _finished_seed_run(sweep, client, spec.trial_hash(params) if cfg is None else config_hash(cfg), seed)
    if done is not None:
        client.set_tag(done, T.PARENT, trial_run)
        client.set_tag(done, T.TRIAL, str(trial.number))
        return _SeedDone(done, objective_of(client, done, spec.objective.metric, spec.objective.window), reused=True)
    if cfg is None:  # a command sweep: another trainer's command logs into the run made for it
        ran, found, why = run_command_seed(sweep, client, trial.number, params, seed, trial_run, lineage)
        return _SeedDone(ran, found) if found is not None else _SeedFailed(ran, why or "no objective")

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
        trial.report(window_mean(recent, window), offset + step)
        if step >= spec.pruner.warmup_steps and trial.should_prune():
            raise Prune()

    tags = {T.PARENT: trial_run, T.ROLE: "seed", T.STUDY: spec.name,
            T.TRIAL: str(trial.number), **lineage}
    if spec.launcher.child:  # its own process (torchrun with several ranks): no per-step callback, no pruning
        child, found, why = run_seed_child(sweep, client, trial.number, seed, spec.overrides_for(params, seed), tags,
                                           trial_run)  # its run FAILED with the reason, or KILLED on a stop
        return _SeedDone(child, found) if child is not None and found is not None else _SeedFailed(child, why or "")
    try:
        run_id = train(cfg, on_step=report, tags=tags, testbed=spec.testbed)
    except RunStopped:
        raise
    except Exception as error:
        trouble = full_or_held(error)
        if trouble is not None:  # a full disk or a held store: the sweep stops and its next invocation re-runs it
            raise _stopped_by_storage(error, trouble, trial.number, seed) from None
        if isinstance(error, RlvrlabError):
            return _SeedFailed(_last_run_of(client, sweep, trial_run, seed), str(error))
        if os.environ.get("RLVRLAB_DEBUG") == "1":
            raise
        return _SeedFailed(_last_run_of(client, sweep, trial_run, seed), f"{type(error).__name__}: {error}")
    try:
        value = objective_of(client, run_id, metric, window)
    except RlvrlabError as error:  # no objective, or a non-finite one: the seed run fails with why
        client.set_tag(run_id, T.FAIL_REASON, str(error)[:T.FAIL_REASON_CHARS])
        client.set_terminated(run_id, status="FAILED")
        return _SeedFailed(run_id, str(error))
    client.set_tag(run_id, T.OBJECTIVE, format_value(value))
    return _SeedDone(run_id, value)


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


def more_seeds(spec: SweepSpec, values: dict[int, float]) -> int:
    """Adaptive seeds: how many seeds the next round adds to a trial with `values` (seed -> value): after stage one,
    the rest of Stein's N (rlvrlab.sweep.seeds.seed_count, from the spread of stage one only, never a mean); 0
    once the trial has them (or for a fixed seed list)."""
    if spec.adaptive is None:
        return 0
    return max(0, seed_count(values, spec.adaptive) - len(values))


def _finish_trial_run(client, run_id: Optional[str], status: str, metrics: dict[str, float],
                      tags: dict[str, str]) -> None:
    if run_id is None:
        return

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    client.set_terminated(run_id, status=status)


