"""`rlvrlab sweep SWEEP.yaml`: an Optuna study over config keys, several seeds per trial, recorded in MLflow."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from rlvrlab.cli.options import (
    AllowInitialModelChangeOpt,
    OverridesArg,
    ProtocolOpt,
    print_table,
    request_values,
    say,
    with_request_options,
)
from rlvrlab.cli.progress import bar
from rlvrlab.sweep.request import SweepRequest

SweepArg = Annotated[str, typer.Argument(help="A sweep file (sweeps/NAME.yaml or a path).", show_default=False)]


def sweep(sweep_file: SweepArg, overrides: OverridesArg = None, protocol: ProtocolOpt = None,
          allow_initial_model_change: AllowInitialModelChangeOpt = False, **given) -> None:
    """Run (or continue) an Optuna study: each trial trains every seed and scores the objective from MLflow.

    [dim]rlvrlab sweep sweeps/ucpo_tau.yaml                      # toy tier, 5 seeds per value of tau
    rlvrlab sweep sweeps/tau_eps_staleness_grid.yaml --workers 2
    rlvrlab sweep sweeps/ucpo_tau.yaml --status             # the table so far, nothing runs
    rlvrlab sweep sweeps/ucpo_tau.yaml --storage postgresql://user:pw@db/optuna   # on every machine
    rlvrlab sweep sweeps/up_stability.yaml --launcher process --workers 4 --gpus-per-run 2
    rlvrlab sweep sweeps/examples/trl_grpo.yaml             # another trainer's command (TRL), see docs/sweeps.md
    rlvrlab sweep sweeps/up_stability.yaml --launcher slurm --workers 8 --slurm partition=gpu --slurm time=240 \\
        --storage postgresql://user:pw@db/optuna tracking.uri=http://mlflow:5000[/dim]

    Re-running the same command continues the study: finished trials are kept, trials of a worker that died
    are re-run, failed ones only with --retry-failed. KEY=VALUE overrides change the base config (and so the
    study's fingerprint). Exit codes: 0 done, 1 usage or config error, 2 some trials failed, 3 stopped by
    fail-fast, 130/143 stopped by Ctrl-C/SIGTERM (docs/sweeps.md).
    """
    from rlvrlab.sweep import request, summary, view
    from rlvrlab.sweep.exits import SweepExit, outcome
    from rlvrlab.tracking.testbed import optional

    testbed = optional(protocol, allow_initial_model_change)  # a bad protocol file: one line before anything runs
    asked = SweepRequest(**request_values(SweepRequest, given), testbed=testbed)
    err = Console(stderr=True)
    # rich's bar on a terminal, plain lines in a log file (rlvrlab.cli.progress); it moves once a seed run or trial:
    # more than 2 redraws a second only cost CPU
    progress = bar(err, "[bold]sweep[/]", status=True, refresh_per_second=2)
    task = progress.add_task("sweep", total=None, status="")
    started = False

    def show(done: int, total: int | None, note: str) -> None:
        nonlocal started
        if not started:  # from the first report on: a bad file or storage stays one line
            started = True
            progress.start()
        progress.update(task, completed=done, total=total, status=note)

    try:
        opened = request.run(sweep_file, overrides or [], asked, on_progress=show, warn=lambda message: err.print(
            f"warning: {message}", style="yellow", markup=False, highlight=False, soft_wrap=True))
    finally:  # a SweepExit (stopped by a signal) ends as one line with its own code (rlvrlab.cli.main)
        progress.stop()
    console = Console(soft_wrap=True)
    if not console.is_terminal:  # a log file: wide enough for the table, not squeezed to 80 columns
        console = Console(soft_wrap=True, width=200)
    found = summary.summarize(opened)
    print_table(console, view.study_table(opened.spec, found), marked_style="bold green")
    say(console, view.study_lines(opened, found))
    code, line = outcome(opened, status_only=asked.status)
    if code:
        raise SweepExit(line or "", code)


with_request_options(sweep, SweepRequest, after=2)
