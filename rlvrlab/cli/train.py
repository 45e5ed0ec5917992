"""`rlvrlab train`: compose a configuration and run the training loop on it, with a progress bar."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlvrlab.cli.options import ExperimentArg, OverridesArg, split_experiment
from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import RlvrlabError

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

# `rlvrlab train`, `sweep` and `eval pass-at-k`: a protocol's fixed initial model (rlvrlab.tracking.testbed)
ProtocolOpt = Annotated[
    Optional[Path],
    typer.Option("--protocol", help="The study's protocol file (results/protocols/NAME.md): when its ```testbed "
                 "block fixes the initial model's digest, a run starting from another model stops before it runs.",
                 show_default=False),
]
AllowInitialModelChangeOpt = Annotated[
    bool,
    typer.Option("--allow-initial-model-change", help="Run even when the initial model differs from the one "
                 "--protocol fixes (recorded on the run as rlvrlab.initial_model.override)."),
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
    from rlvrlab.train.loop import NothingLeft, RunInterrupted, train as run_training
    from rlvrlab.train.setup import run_config

    experiment, overrides = split_experiment(experiment, overrides)
    tags = parse_tags(tag or [])
    testbed = optional(protocol, allow_initial_model_change)  # a bad protocol file: one line before anything runs
    cfg = run_config(experiment, overrides, resume=resume)
    progress = _progress_bar(Console(stderr=True), cfg)  # shown from the first step: setup errors stay one line
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
            progress.update(task, completed=step + 1,
                            status=f"reward {stats.reward:.3f} entropy {stats.entropy:.3f}")

    try:
        run_id = run_training(cfg, resume=resume, progress=show, tags=tags, testbed=testbed,
                              warn=lambda message: Console(stderr=True, soft_wrap=True).print(
                                  f"warning: {message}", style="yellow", markup=False, highlight=False))
    except RunInterrupted as stopped:  # Ctrl-C or SIGTERM
        progress.stop()
        saved = (f"continue it from step {stopped.checkpoint_step} with `{resume_command(cfg, stopped.run_id)}`"
                 if stopped.checkpoint_step is not None else "no checkpoint was saved yet (trainer.checkpoint_every)")
        raise RlvrlabError(f"stopped at step {stopped.step}: MLflow run {stopped.run_id} ended KILLED; {saved}") \
            from None
    except NothingLeft as finished:  # a FINISHED run resumed with its own steps
        progress.stop()
        Console(soft_wrap=True).print(
            f"nothing to do: run {finished.run_id} is FINISHED and has trained all its {finished.steps} steps; its "
            f"records are unchanged (to train it further: `{resume_command(cfg, finished.run_id)} "
            f"steps={2 * finished.steps}`)", markup=False, highlight=False)
        return
    finally:
        progress.stop()
    _print_done(cfg, run_id)


def parse_tags(pairs: list[str]) -> dict[str, str]:
    """`--tag KEY=VALUE` options as a dict; a malformed one is a one-line error."""
    tags = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise RlvrlabError(f"--tag {pair}: give KEY=VALUE, e.g. --tag team=rl")
        tags[key.strip()] = value
    return tags


def resume_command(cfg: RunConfig, run_id: str) -> str:
    """The command that continues a run, shell-quoted for copy and paste."""
    words = ["rlvrlab", "train", "--resume", run_id]
    if cfg.output_dir != RunConfig.output_dir:
        words.append(f"output_dir={cfg.output_dir}")
    if cfg.tracking.uri:
        words.append(f"tracking.uri={cfg.tracking.uri}")
    return shlex.join(words)


def _progress_bar(console: Console, cfg: RunConfig) -> Progress:
    """rich's bar on a terminal; plain lines (rlvrlab.cli.progress) in a log file or a pipe."""
    from rlvrlab.cli.progress import progress_display

    return progress_display(
        console,
        TextColumn(f"[bold]{cfg.algorithm.name}[/] {cfg.model.tier}/{cfg.dataset.name} seed {cfg.seed}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        unit="steps",
        disable=os.environ.get("RANK", "0") != "0",
    )


def _print_done(cfg: RunConfig, run_id: str) -> None:
    from rlvrlab.tracking.mlflow_tracker import ui_hint
    from rlvrlab.tracking.store import store

    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 records the run (the others have no run id)
        return
    output_dir = Path(cfg.output_dir).expanduser().resolve()
    console = Console(soft_wrap=True)
    if cfg.tracking.backend == "none":
        console.print(f"[green]done[/]: run [bold]{run_id}[/], not recorded (tracking.backend=none)")
        console.print(f"  checkpoints and resolved config: {escape(str(output_dir / run_id))}")
        return
    uri = store(output_dir, cfg.tracking.uri).uri
    console.print(f"[green]done[/]: MLflow run [bold]{run_id}[/] (experiment {escape(repr(cfg.experiment))}) in "
                  f"{escape(uri)}")
    console.print(f"  look at it: {escape(ui_hint(uri, run_id))}")
    console.print(f"  checkpoints and resolved config: {escape(str(output_dir / run_id))}")

