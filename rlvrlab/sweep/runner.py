"""What runs a sweep's seed runs, chosen once from the sweep file (`seed_runner`): rlvrlab's own training (`Training`:
in the worker, or as a child `rlvrlab train`, rlvrlab.sweep.launch) or another trainer's command (`Command`:
`command:` of the file, rlvrlab.sweep.template and rlvrlab.sweep.command). Both are a `SeedRunner`: the traits the
sweep file's checks read, and the operations a sweep needs of a seed run (what it overrides, the trial's hash, its
checks, the code it runs, running one seed and reading its objective back); the rest of rlvrlab.sweep asks the
runner (SweepSpec.runner) instead of asking which kind it has.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Optional, Protocol

from rlvrlab.config import compose, config_hash
from rlvrlab.errors import ConfigError, RlvrlabError, StorageError
from rlvrlab.outputs import full_or_held
from rlvrlab.sweep import guard
from rlvrlab.sweep.command import run_command_seed
from rlvrlab.sweep.launch import child_run, run_seed_child, settle
from rlvrlab.sweep.objective import objective_of, window_mean
from rlvrlab.sweep.space import VARIANT, format_value
from rlvrlab.sweep.template import check_template, command_hash
from rlvrlab.tracking import tags as T


@dataclasses.dataclass(frozen=True)
class SeedDone:
    run_id: str
    value: float  # its objective (objective_of)
    reused: bool = False  # a finished run of an earlier attempt


@dataclasses.dataclass(frozen=True)
class SeedFailed:
    run_id: Optional[str]  # its MLflow run, where it got as far as one
    reason: str


SEQUENTIAL = "sequential"  # the pruner that reads each finished seed's value, not its steps (rlvrlab.sweep.trials)
NO_STEPS = ("none", SEQUENTIAL)  # pruner types that are told no step of a running seed


class Pruned(Exception):
    """The pruner stopped a running seed, or (sequential) the trial between seeds: its trial is pruned."""


class SeedRunner(Protocol):
    """A kind of seed run. spec: a rlvrlab.sweep.spec.SweepSpec; sweep: an opened rlvrlab.sweep.study.Sweep."""

    @property
    def name(self) -> str: ...

    @property
    def any_metric(self) -> bool:
        """objective.metric may be any name (the runs log their own), not only rlvrlab's."""

    @property
    def own_process(self) -> bool:
        """Each seed run is its own process (launcher process or slurm; process by default)."""

    @property
    def checks_testbed(self) -> bool:
        """Its runs can check --protocol's fixed initial model."""

    @property
    def no_pruner(self) -> str:
        """Why a pruner cannot see its running seeds' steps; "" when it can."""

    @property
    def no_reproduce(self) -> str:
        """Why `rlvrlab reproduce` cannot re-run its studies' seeds; "" when it can."""

    def searched(self, params: dict[str, Any]) -> dict[str, Any]:
        """The trial's params that are rlvrlab config overrides of its seed runs."""

    def trial_hash(self, spec: Any, params: dict[str, Any]) -> str:
        """The config hash that a trial's seed runs share."""

    def check(self, spec: Any, where: str) -> None:
        """What the sweep file asks of this kind, checked when the file is read (one-line ConfigErrors)."""

    def recorded(self) -> dict[str, str]:
        """What the study's MLflow run records of it, beside the sweep's own params."""

    def watched(self, spec: Any, folder: Path) -> dict[str, Path]:
        """The files whose content its seed runs depend on (rlvrlab.sweep.guard): name -> path."""

    def code_root(self, folder: Path) -> Path:
        """A folder in the repository of the code its seed runs run."""

    def run_seed(self, sweep: Any, client: Any, trial: Any, params: dict[str, Any], seed: int, position: int,
                 trial_run: str, lineage: dict[str, str]) -> SeedDone | SeedFailed:
        """One seed's run and objective, or why it failed; a finished run of an earlier attempt is reused."""


@dataclasses.dataclass(frozen=True)
class Training:
    """rlvrlab's own training: a seed run is `rlvrlab train` of the experiment with the trial's overrides."""

    name: str = "rlvrlab"
    any_metric: bool = False
    own_process: bool = False
    checks_testbed: bool = True
    no_pruner: str = ""
    no_reproduce: str = ""

    def searched(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def trial_hash(self, spec: Any, params: dict[str, Any]) -> str:
        return config_hash(compose(spec.experiment, spec.overrides_for(params, spec.seeds[0])))

    def check(self, spec: Any, where: str) -> None:
        """Every grid point (or both ends of every range) composes, and has the objective's window of steps."""
        from rlvrlab.data import warm_start_targets

        points = spec.grid() if spec.sampler == "grid" else [
            {p.key: value} for p in spec.space for value in p.corners()]
        for params in points:
            shown = ", ".join(f"{k}={format_value(v)}" for k, v in params.items())
            try:
                cfg = compose(spec.experiment, spec.overrides_for(params, spec.seeds[0]))
                if cfg.model.tier == "tiny":  # checked when a run builds its model: here, before any trial
                    warm_start_targets(cfg.dataset)
            except ConfigError as error:
                raise ConfigError(f"{where}: the point {shown} does not compose: {error}") from None
            if cfg.steps < spec.objective.window:  # the objective would read every step, labelled "last <window>"
                at = f" at the point {shown}" if shown else ""
                raise ConfigError(f"objective.window {spec.objective.window} in {where} is more than the runs' "
                                  f"{cfg.steps} steps{at}; set window to at most {cfg.steps} or raise steps")

    def recorded(self) -> dict[str, str]:
        return {}

    def watched(self, spec: Any, folder: Path) -> dict[str, Path]:
        return guard.rlvrlab_source()

    def code_root(self, folder: Path) -> Path:
        return Path(guard.__file__).resolve().parent

    def run_seed(self, sweep: Any, client: Any, trial: Any, params: dict[str, Any], seed: int, position: int,
                 trial_run: str, lineage: dict[str, str]) -> SeedDone | SeedFailed:
        from rlvrlab.train.loop import RunStopped, train  # torch: only where a seed run trains
        from rlvrlab.train.metrics import step_metrics

        spec = sweep.spec
        cfg = compose(spec.experiment, spec.overrides_for(params, seed))
        done = reused(sweep, client, trial, config_hash(cfg), seed, trial_run)
        if done is not None:
            return done
        metric, window, offset = spec.objective.metric, spec.objective.window, position * cfg.steps
        recent: list[float] = []

        class Prune(RunStopped, Pruned):
            pass

        def report(step: int, batch, run, stats) -> None:
            if spec.pruner.type in NO_STEPS or stats is None:  # stats: None on steps that log nothing
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
            return _outcome(*run_seed_child(  # its run FAILED with the reason, or KILLED on a stop
                sweep, client, trial.number, seed, spec.overrides_for(params, seed), tags, trial_run))
        try:
            run_id = train(cfg, on_step=report, tags=tags, testbed=spec.testbed)
        except RunStopped:
            raise
        except Exception as error:
            trouble = full_or_held(error)
            if trouble is not None:  # a full disk or a held store: the sweep stops and its next invocation re-runs it
                raise stopped_by_storage(error, trouble, trial.number, seed) from None
            if not isinstance(error, RlvrlabError) and os.environ.get("RLVRLAB_DEBUG") == "1":
                raise
            why = str(error) if isinstance(error, RlvrlabError) else f"{type(error).__name__}: {error}"
            return SeedFailed(child_run(client, sweep.experiment_id, trial_run, seed), why)
        return _outcome(*settle(client, run_id, spec.objective, None))  # no objective, or a non-finite one: failed


@dataclasses.dataclass(frozen=True)
class Command:
    """Another trainer's command (`command:`): a seed run is the template filled with the trial's values and its
    seed, which logs into the MLflow run rlvrlab made for it; its steps are the command's (no pruner)."""

    template: str
    name: str = "command"
    any_metric: bool = True
    own_process: bool = True
    checks_testbed: bool = False
    no_pruner: str = "a step pruner needs the steps of a running seed, which a command reports to MLflow only"
    no_reproduce: str = ("it runs another trainer's command; rlvrlab reproduce re-runs rlvrlab training studies: "
                         "re-run its command (sources.json) by hand")

    def searched(self, params: dict[str, Any]) -> dict[str, Any]:
        return {}  # its values go to the command (SweepSpec.command_values); overrides say where records go

    def trial_hash(self, spec: Any, params: dict[str, Any]) -> str:
        return command_hash(self.template, spec.command_values(params, spec.seeds[0]))

    def check(self, spec: Any, where: str) -> None:
        check_template(self.template, [p.key for p in spec.space if p.key != VARIANT], spec.variants, where)

    def recorded(self) -> dict[str, str]:
        return {"command": self.template[:6000]}  # MLflow keeps 6000 characters of a param

    def watched(self, spec: Any, folder: Path) -> dict[str, Path]:
        return guard.command_files(self.template, spec, folder)

    def code_root(self, folder: Path) -> Path:
        return folder

    def run_seed(self, sweep: Any, client: Any, trial: Any, params: dict[str, Any], seed: int, position: int,
                 trial_run: str, lineage: dict[str, str]) -> SeedDone | SeedFailed:
        done = reused(sweep, client, trial, self.trial_hash(sweep.spec, params), seed, trial_run)
        if done is not None:
            return done
        return _outcome(*run_command_seed(sweep, client, self.template, trial.number, params, seed, trial_run,
                                          lineage))


TRAINING = Training()


def seed_runner(command: Optional[str]) -> SeedRunner:
    """The one place a sweep's kind of seed run is chosen: `command:` of the sweep file, else rlvrlab's training."""
    return TRAINING if command is None else Command(command)


def _outcome(run_id: Optional[str], value: Optional[float], why: Optional[str]) -> SeedDone | SeedFailed:
    """A seed run's (run, objective, None) or (run, None, why it failed) as what run_seed returns."""
    return SeedDone(run_id, value) if run_id is not None and value is not None else SeedFailed(run_id, why or "")


def reused(sweep: Any, client: Any, trial: Any, chash: str, seed: int, trial_run: str) -> Optional[SeedDone]:
    """A finished seed run of an earlier attempt with this config hash and seed, moved under this trial."""
    found = client.search_runs(
        [sweep.experiment_id],
        filter_string=(f"tags.`{T.STUDY}` = '{sweep.spec.name}' and tags.config_hash = '{chash}' and "
                       f"tags.seed = '{seed}' and tags.`{T.ROLE}` = 'seed' and attributes.status = 'FINISHED'"),
        max_results=1)
    if not found:
        return None
    done = found[0].info.run_id
    client.set_tag(done, T.PARENT, trial_run)
    client.set_tag(done, T.TRIAL, str(trial.number))
    return SeedDone(done, objective_of(client, done, sweep.spec.objective.metric, sweep.spec.objective.window),
                    reused=True)


def stopped_by_storage(error: Exception, trouble: str, number: int, seed: int) -> StorageError:
    """A seed run stopped by a full disk or a held store, worded for the sweep: its trial is not failed (nothing is
    wrong with it), and the same command re-runs it."""
    what = error.what if isinstance(error, StorageError) else (
        ("no space left on the device" if trouble == "full" else "a sqlite store is locked by another process")
        + f" ({T.failure_reason(error)})")
    fix = "free space there" if trouble == "full" else "wait for the process holding it to end"
    return StorageError(f"sweep stopped in trial {number}, seed {seed}: {what}; {fix}, then run the same command "
                        "again (the trial is re-run)", what=what)

