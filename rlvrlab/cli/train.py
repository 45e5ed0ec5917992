"""`rlvrlab train`: compose a configuration and run the training loop on it, with a progress bar."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer
from rich.console import Console

from rlvrlab.cli.options import (
    AllowInitialModelChangeOpt,
    ExperimentArg,
    OverridesArg,
    ProtocolOpt,
    say,
    split_experiment,
)
from rlvrlab.cli.progress import bar

ResumeOpt = Annotated[
    Optional[str],
    typer.Option("--resume", help="Continue this MLflow run from its last checkpoint (same config; "
                 "output_dir=, tracking.uri=, trainer.dist_timeout_minutes= and steps= may be given).",
                 show_default=False),
]

TagOpt = Annotated[
    Optional[list[str]],
    typer.Option("--tag", help="KEY=VALUE: an MLflow tag on the new run (repeatable; a sweep nests its seed runs "
                 "under their trial with mlflow.parentRunId=...).", show_default=False),
]


def train(experiment: ExperimentArg = None, overrides: OverridesArg = None, resume: ResumeOpt = None,
          tag: TagOpt = None, protocol: ProtocolOpt = None,
          allow_initial_model_change: AllowInitialModelChangeOpt = False) -> None:
    """Train a policy: rollouts -> verifier -> advantages -> policy update, recorded in MLflow.

    [dim]rlvrlab train                                   # the default experiment (tiny model, Countdown, GRPO)
    rlvrlab train toy algorithm=ucpo algorithm.tau=0.2 seed=1
    rlvrlab train algorithm=up_dapo model=real model.path=/models/SmolLM2-135M
    rlvrlab train --resume 3f2a...                   # after a crash: continue from the last checkpoint
    rlvrlab train pairs --protocol results/protocols/ucpo_pairs.md   # refuses another initial model[/dim]
    """
    from rlvrlab.tracking.testbed import optional
    from rlvrlab.train import lifecycle
    from rlvrlab.train.loop import NothingLeft, RunInterrupted, train as run_training
    from rlvrlab.train.setup import run_config

    experiment, overrides = split_experiment(experiment, overrides)
    tags = lifecycle.parse_tags(tag or [])
    testbed = optional(protocol, allow_initial_model_change)  # a bad protocol file: one line before anything runs
    cfg = run_config(experiment, overrides, resume=resume)
    # shown from the first step: setup errors stay one line; rich's bar on a terminal, plain lines in a log file
    progress = bar(Console(stderr=True), f"[bold]{cfg.algorithm.name}[/] {cfg.model.tier}/{cfg.dataset.name} seed "
                   f"{cfg.seed}", left=True, status=True, unit="steps", disable=os.environ.get("RANK", "0") != "0")
    task = progress.add_task(f"train {cfg.algorithm.name} {cfg.model.tier}/{cfg.dataset.name} seed {cfg.seed}",
                             total=cfg.steps, status="", start=False)

    started = False

    def show(step: int, stats) -> None:
        nonlocal started
        if not started:
            started = True
            progress.start()
            progress.start_task(task)
        if stats is None:  # a step that logs nothing (tracking.log_every): the last logged values stay shown
            progress.update(task, completed=step + 1)
        else:
            progress.update(task, completed=step + 1, status=f"reward {stats.reward:.3f} entropy {stats.entropy:.3f}")

    try:
        run_id = run_training(cfg, resume=resume, progress=show, tags=tags, testbed=testbed,
                              warn=lambda message: Console(stderr=True, soft_wrap=True).print(
                                  f"warning: {message}", style="yellow", markup=False, highlight=False))
    except RunInterrupted as stopped:  # Ctrl-C or SIGTERM
        progress.stop()
        raise lifecycle.interrupted_error(cfg, stopped) from None
    except NothingLeft as finished:  # a FINISHED run resumed with its own steps
        progress.stop()
        say(Console(soft_wrap=True), [lifecycle.nothing_left_line(cfg, finished)])
        return
    finally:
        progress.stop()
    say(Console(soft_wrap=True), lifecycle.done_lines(cfg, run_id))
