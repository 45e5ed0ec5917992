"""A study's trials: claimed by a worker, each a group of seed runs (adaptive seeds: Stein's two stages,
rlvrlab.sweep.seeds), scored over its seeds and told to Optuna and MLflow (the study itself: rlvrlab.sweep.study).
What a trial does, how workers share a study and what happens when seeds fail: docs/sweeps.md ("What a trial
does", "Storage, workers and resuming", "When seed runs fail").

- Workers only pop WAITING trials (an atomic state change in the journal and PostgreSQL storages; not in sqlite,
  which ignores SELECT ... FOR UPDATE: bench/sweep_storage.py), so no grid point runs twice.
- A trial whose worker died is re-enqueued (rlvrlab.sweep.liveness) and reuses its finished seed runs; a failed
  seed fails its trial (--retry-failed: rlvrlab.sweep.retry); fail-fast (rlvrlab.sweep.failfast) stops every worker
  before its next seed run; the sequential pruner (`_look`, rlvrlab.stats.sequential) stops a trial between seeds.
- Each trial and seed run is tagged with its attempt (rlvrlab.attempt), the trial it retries (rlvrlab.retry_of)
  and the digest of the code it ran (rlvrlab.code_digest: rlvrlab.sweep.guard)."""

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

from rlvrlab.errors import RlvrlabError, StorageError
from rlvrlab.procs import raise_if_stop_requested, stop_at_safe_points
from rlvrlab.stats.sequential import PRUNE, SequentialDesign, sequential_decision
from rlvrlab.sweep import failfast
from rlvrlab.sweep.guard import CODE_DIGEST, recorded_digest
from rlvrlab.sweep.liveness import Heartbeat, close_runs, recover_stale, requeue, trial_id
from rlvrlab.sweep.objective import AGGREGATES, seed_summary
from rlvrlab.sweep.runner import SEQUENTIAL, Pruned, SeedDone, SeedFailed
from rlvrlab.sweep.seeds import seed_count
from rlvrlab.sweep.spec import SweepSpec
from rlvrlab.sweep.study import ATTEMPT, Sweep, budget_used, mlflow_params
from rlvrlab.tracking import tags as T

SEQUENTIAL_ATTR = "sequential"  # a trial the sequential pruner stopped: {decision, seeds, incumbent, delta}


# --------------------------------------------------------------------------------------------------- the workers
@dataclass
class TrialOutcome:
    number: int
    state: str  # COMPLETE | FAIL | PRUNED
    value: Optional[float] = None
    reason: str = ""


OnSeed = Callable[[int, int, int], None]  # (trial number, seed position, seeds) after each seed run


def work(sweep: Sweep, *, deadline: Optional[float] = None,
         on_seed: Optional[OnSeed] = None) -> list[TrialOutcome]:
    """Claim and run trials until the study is done, the budget is used or the deadline passes; their outcomes."""
    with stop_at_safe_points():  # Ctrl-C or SIGTERM: stop between steps or trials (a stopped trial is re-enqueued)
        return _work(sweep, deadline, on_seed, raise_if_stop_requested)


def _work(sweep: Sweep, deadline: Optional[float], on_seed: Optional[OnSeed], safe_point) -> list[TrialOutcome]:
    outcomes = []
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
        outcomes.append(run_trial(sweep, trial, on_seed=on_seed))
    return outcomes


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


class _FailFast(Exception):
    """Fail-fast stopped the sweep (this worker's seed run or another's): the trial runs no more seeds."""


@dataclass
class _Seeds:
    """A trial's seeds so far: the ones to run (adaptive: more after stage one), their values, runs and failures."""

    seeds: list[int]
    values: dict[int, float] = field(default_factory=dict)
    run_ids: dict[int, str] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)

    def failed(self) -> str:
        """Why the trial failed: how many seeds did, and the first one's reason."""
        seed, reason = next(iter(self.failures.items()))
        return f"{len(self.failures)}/{len(self.seeds)} seeds failed; seed {seed}: {reason}"


def run_trial(sweep: Sweep, trial, *, on_seed: Optional[OnSeed] = None) -> TrialOutcome:
    """Run every seed of one trial (reusing seed runs a dead worker finished), report to Optuna and MLflow."""
    client = sweep.client()
    heartbeat = Heartbeat(sweep.storage, trial_id(sweep, trial))
    trial_run = None
    done = _Seeds(list(sweep.spec.seeds))
    try:
        params = {p.key: p.suggest(trial) for p in sweep.spec.space}
        lineage = _lineage_tags(sweep, trial)
        chash = sweep.spec.trial_hash(params)
        trial_run = _trial_run(sweep, client, trial, params, chash, lineage)
        _name_trial_run(trial, trial_run, chash)
        _run_seeds(sweep, client, trial, params, trial_run, lineage, done, on_seed)
        if done.failures:
            return _failed(sweep, client, trial, trial_run, done.failed())
        return _complete_trial(sweep, client, trial, trial_run, done.values)
    except _FailFast:
        if done.failures:  # it failed already: it stays failed (--retry-failed re-runs it)
            return _failed(sweep, client, trial, trial_run,
                           f"{done.failed()}; the rest of its seeds not run (fail-fast)")
        reason = "stopped by fail-fast before its seeds were done; re-enqueued"
        _requeue(sweep, client, trial, trial_run, reason)
        return TrialOutcome(trial.number, "FAIL", reason=reason)
    except Pruned:
        trial.set_user_attr(T.FAILURE, "pruned")
        sweep.study.tell(trial, state=TrialState.PRUNED)
        _finish_trial_run(client, trial_run, "KILLED", {}, {T.PRUNED: "true"})
        return TrialOutcome(trial.number, "PRUNED")
    except RlvrlabError as error:  # the trial's config does not compose (e.g. a sampled value a rule rejects)
        if isinstance(error, StorageError):  # the place, not the trial: the stores may not take a write now; the
            raise  # next invocation finds this worker gone and re-runs the trial (rlvrlab.sweep.liveness)
        return _failed(sweep, client, trial, trial_run, str(error))
    except BaseException:
        # interrupted (Ctrl-C) or a bug: leave the trial to the liveness check of the next invocation, which
        # retries it; the MLflow runs are closed as KILLED
        try:
            _requeue(sweep, client, trial, trial_run, "interrupted; re-enqueued")
        except Exception:
            pass
        raise
    finally:
        heartbeat.stop()


def _name_trial_run(trial, trial_run: str, chash: str) -> None:
    """The trial's user attributes that name its MLflow run, its worker's GPUs and its config hash."""
    trial.set_user_attr(T.MLFLOW_RUN_ID, trial_run)
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:  # the worker's GPUs, which its seed runs see
        trial.set_user_attr(T.DEVICES, os.environ["CUDA_VISIBLE_DEVICES"])
    trial.set_user_attr(T.TRIAL_CONFIG_HASH, chash)


def _run_seeds(sweep: Sweep, client, trial, params: dict, trial_run: str, lineage: dict[str, str], done: _Seeds,
               on_seed: Optional[OnSeed]) -> None:
    """Run the trial's seeds into `done`, recording each on the trial and for fail-fast; adaptive seeds: stage one,
    then stage two (a third round adds none). Raises _FailFast when fail-fast stopped the sweep."""
    spec, position = sweep.spec, 0
    while position < len(done.seeds):
        for seed in done.seeds[position:]:
            if failfast.stopped(sweep.study, sweep.epoch or ""):
                raise _FailFast()
            outcome = spec.runner.run_seed(sweep, client, trial, params, seed, position, trial_run, lineage)
            if outcome.run_id:
                done.run_ids[seed] = outcome.run_id
            if isinstance(outcome, SeedFailed):
                done.failures[seed] = outcome.reason
            else:
                done.values[seed] = outcome.value
            if not (isinstance(outcome, SeedDone) and outcome.reused):
                failfast.record(sweep.study, sweep.epoch or "", trial.number, seed,
                                outcome.reason if isinstance(outcome, SeedFailed) else None)
            trial.set_user_attr(T.VALUES, {str(s): v for s, v in done.values.items()})
            trial.set_user_attr(T.RUN_IDS, {str(s): r for s, r in done.run_ids.items()})
            if on_seed is not None:
                on_seed(trial.number, position, len(done.seeds))
            position += 1
            _look(sweep, trial, done)
        if not done.failures:
            done.seeds = list(spec.seed_list(len(done.seeds) + more_seeds(spec, done.values)))


def _look(sweep: Sweep, trial, done: _Seeds) -> None:
    """pruner: sequential: the trial against the incumbent (the best complete trial by the objective) on the seeds
    both ran, in seed order, both negated for minimize. Raises Pruned, with why on the trial, once it can no longer
    plausibly beat the incumbent by delta; no incumbent yet (or a failed seed): all its seeds run. No efficacy stop
    (alpha 0): a trial that may become the incumbent needs all its seeds."""
    spec, delta = sweep.spec, sweep.spec.pruner.delta
    if spec.pruner.type != SEQUENTIAL or delta is None or done.failures:  # delta: set for sequential (spec.py)
        return
    best = incumbent(sweep)
    if best is None:
        return
    sign = 1.0 if spec.objective.direction == "maximize" else -1.0
    theirs = {int(s): v for s, v in (best.user_attrs.get(T.VALUES) or {}).items()}
    shared = [s for s in spec.seeds if s in done.values and s in theirs]
    design = SequentialDesign(spec.pruner.n_min, len(spec.seeds), alpha=0.0)
    decision, used = sequential_decision([sign * done.values[s] for s in shared], [sign * theirs[s] for s in shared],
                                         delta, design)
    if decision == PRUNE:
        trial.set_user_attr(SEQUENTIAL_ATTR, {"decision": decision, "seeds": used, "incumbent": best.number,
                                              "delta": delta})
        raise Pruned()


def incumbent(sweep: Sweep):
    """The study's best COMPLETE trial by the objective's direction (a FrozenTrial), or None before one is."""
    complete = [t for t in sweep.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    sign = 1.0 if sweep.spec.objective.direction == "maximize" else -1.0
    return max(complete, key=lambda t: (sign * t.value, -t.number)) if complete else None


def _complete_trial(sweep: Sweep, client, trial, trial_run: str, values: dict[int, float]) -> TrialOutcome:
    """Score a trial whose seeds all ran: its objective over the seeds, told to Optuna and logged on its run."""
    spec = sweep.spec
    summary = seed_summary(values, spec.adaptive)  # adaptive: Stein's interval, the one the objective uses
    value = AGGREGATES[spec.objective.aggregate].over(values, spec.adaptive)
    trial.set_user_attr(T.SUMMARY, summary)
    sweep.study.tell(trial, value)
    _finish_trial_run(client, trial_run, "FINISHED", {
        "objective/value": value, "objective/mean": summary["mean"], "objective/ci95_low": summary["low"],
        "objective/ci95_high": summary["high"], "objective/sd": summary["sd"], "objective/n_seeds": summary["n"]},
        {})
    return TrialOutcome(trial.number, "COMPLETE", value=value)


def _requeue(sweep: Sweep, client, trial, trial_run: Optional[str], reason: str) -> None:
    """A trial stopped short by its worker (fail-fast, a stop, a bug): its runs end KILLED, it is re-enqueued."""
    if trial_run is not None:
        close_runs(client, trial_run, "KILLED")
    requeue(sweep, trial, reason)


def _failed(sweep: Sweep, client, trial, trial_run: Optional[str], message: str) -> TrialOutcome:
    """The trial fails with `message` (on the trial, told to Optuna, and on its MLflow run, which ends FAILED)."""
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
