"""A command sweep's seed run: rlvrlab creates the MLflow run (nested study -> trial -> seed with the tags of its own
seed runs, plus the command's git commit and the rendered command, `rlvrlab.command`), and the command (another
trainer) logs into it through MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_ID and MLFLOW_RUN_ID (docs/sweeps.md,
"Sweeping another trainer's command"). The process runs as a child `rlvrlab train` does
(rlvrlab.sweep.launch.run_process). Afterwards rlvrlab sets the status it decided, whatever the command left: a
failure, a signal or a limit fails the seed (FAILED, with stderr's tail and the log's path), a stopped sweep's seed
ends KILLED, and a run that exits 0 is FINISHED once its objective is read back (objective.objective_of) finite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from rlvrlab.procs import raise_if_stop_requested, stop_requested
from rlvrlab.sweep import launch
from rlvrlab.sweep.launch import child_env, how_it_ended, last_lines, run_process
from rlvrlab.sweep.seedlog import log_path
from rlvrlab.sweep.template import render
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.provenance import repo_state

COMMAND = T.attr("command")  # the rendered command, on its seed run
GIT_COMMIT = "mlflow.source.git.commit"  # MLflow's own provenance tag (its UI shows it)
DROPPED_ENV = ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_NESTED_RUN", "MLFLOW_RUN_NAME")  # would start another run
MAX_TAG = 5000  # characters of a tag value kept (MLflow's limit is 8000)


def run_command_seed(sweep: Any, client: Any, template: str, number: int, params: dict[str, Any], seed: int,
                     trial_run: str, lineage: Optional[dict[str, str]] = None) -> tuple[Optional[str],
                                                                               Optional[float], Optional[str]]:
    """One seed of trial `number` of a command sweep (sweep: an opened rlvrlab.sweep.study.Sweep; template: the
    command of its rlvrlab.sweep.runner.Command): (its MLflow run, its objective, None) or (its run, None, why it
    failed). lineage: the tags of its attempt (attempt, retry of, code digest), on the run from its creation. A stop
    asked of the worker ends the run KILLED and is raised as KeyboardInterrupt once the command's processes have
    ended."""
    spec = sweep.spec
    rendered = render(template, spec.command_values(params, seed))
    folder = os.getcwd()
    commit, dirty = repo_state(Path(folder))
    tags = {T.PARENT: trial_run, T.ROLE: "seed", T.STUDY: spec.name, T.TRIAL: str(number), T.SEED: str(seed),
            T.CONFIG_HASH: spec.trial_hash(params), COMMAND: rendered[:MAX_TAG],
            T.GIT_SHA: commit or "unknown", T.GIT_DIRTY: "true" if dirty else "false",
            **({GIT_COMMIT: commit} if commit else {}), **(lineage or {})}
    run_id = client.create_run(sweep.experiment_id, run_name=f"trial {number} seed {seed}", tags=tags).info.run_id
    log = log_path(sweep.output_dir, spec.name, number, seed)
    env = {k: v for k, v in child_env(1).items() if k not in DROPPED_ENV}  # + the run for the command to re-attach to
    env.update(MLFLOW_TRACKING_URI=sweep.mlflow_uri, MLFLOW_EXPERIMENT_ID=sweep.experiment_id, MLFLOW_RUN_ID=run_id)
    try:
        ended = run_process(["/bin/sh", "-c", rendered], env, cwd=folder, limits=spec.launcher.limits, log=log,
                            first_metric=lambda: bool(client.get_run(run_id).data.metrics))
    except BaseException:  # a second signal: the command's processes are gone; its run ends KILLED
        launch.end_stopped(client, run_id, log, signalled=True)
        raise
    if stop_requested() is not None:  # stopped with the sweep: KILLED (re-run by a resumed study)
        launch.end_stopped(client, run_id, log, signalled=ended.stopped == launch.STOP)
        raise_if_stop_requested()
    launch.attach_log(client, run_id, log)
    status = client.get_run(run_id).info.status
    reason = None
    if ended.stopped is not None:
        reason = launch.limit_reason(ended, spec.launcher.limits, "the command", f"its MLflow run {run_id}",
                                     sweep.mlflow_uri)
    elif ended.returncode != 0:
        shown = last_lines(ended.tail)
        reason = f"the command failed ({how_it_ended(ended.returncode)})" + (f": {shown}" if shown else "")
    elif status not in ("RUNNING", "FINISHED"):
        reason = f"the command exited 0 but ended its MLflow run {status}"
    if reason is None and status == "RUNNING":
        client.set_terminated(run_id, status="FINISHED")
    return launch.settle(client, run_id, spec.objective, reason, log, chars=MAX_TAG)
