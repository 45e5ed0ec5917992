"""`rlvrlab sweep SWEEP.yaml`: an Optuna study over config keys, several seeds per trial, recorded in MLflow."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlvrlab.cli.options import OverridesArg
from rlvrlab.cli.progress import progress_display
from rlvrlab.cli.train import AllowInitialModelChangeOpt, ProtocolOpt

SweepArg = Annotated[str, typer.Argument(help="A sweep file (sweeps/NAME.yaml or a path).", show_default=False)]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Trials run in parallel processes on this machine "
                                         "(at most the trials left; refused beyond a core and ~400 MiB each).")]
OversubscribeOpt = Annotated[bool, typer.Option(
    "--oversubscribe", help="Start --workers processes even beyond a core and ~400 MiB of available memory each.")]
StorageOpt = Annotated[Optional[str], typer.Option(
    "--storage", help="Optuna storage: a journal file path, or an RDB URL such as postgresql://user:pw@host/db "
    "for workers on several machines. Default: <output_dir>/optuna.journal.", show_default=False)]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Study name (default: the file's name:).",
                                                show_default=False)]
SeedsOpt = Annotated[Optional[int], typer.Option("--seeds", min=1, help="Seeds per trial (default: the file's seeds:).",
                                                 show_default=False)]
StatusOpt = Annotated[bool, typer.Option("--status", help="Show the study's trials and best config; run nothing.")]
LauncherOpt = Annotated[Optional[str], typer.Option(
    "--launcher", help="How seed runs run: inprocess (the toy default), process (a child `rlvrlab train`; torchrun "
    "with --nproc ranks), slurm (--workers jobs through submitit). Default: the file's launcher:.",
    show_default=False)]
NprocOpt = Annotated[Optional[int], typer.Option(
    "--nproc", min=1, help="Ranks per seed run (process, slurm); default: --gpus-per-run, else 1.",
    show_default=False)]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus-per-run", min=1, help="GPUs each worker owns (disjoint CUDA_VISIBLE_DEVICES sets of this machine).",
    show_default=False)]
SlurmOpt = Annotated[Optional[list[str]], typer.Option(
    "--slurm", help="KEY=VALUE over the file's slurm: block (partition, time, gpus_per_node, cpus_per_task, "
    "account, nodes, cluster); repeatable.", show_default=False)]
SeedTimeoutOpt = Annotated[Optional[str], typer.Option(
    "--seed-timeout", help="Seconds a seed run may take (launcher process, command sweeps): then its processes are "
    "stopped and the seed fails. Default: the file's seed_timeout:.", show_default=False)]
KeepGoingOpt = Annotated[bool, typer.Option(
    "--keep-going", help="No fail-fast: run every seed even when the first failed seed runs fail the same way.")]
RetryFailedOpt = Annotated[bool, typer.Option(
    "--retry-failed", help="Re-run the failed (and timed-out) seeds of the study's failed trials; their finished "
    "seeds are reused.")]
AllowCodeChangeOpt = Annotated[bool, typer.Option(
    "--allow-code-change", help="Continue a study whose code (the command's files, watch:, rlvrlab's source) "
    "changed; new seed runs are tagged with the new rlvrlab.code_digest.")]


def sweep(sweep_file: SweepArg, overrides: OverridesArg = None, workers: WorkersOpt = 1, storage: StorageOpt = None,
          name: NameOpt = None, seeds: SeedsOpt = None, status: StatusOpt = False, launcher: LauncherOpt = None,
          nproc: NprocOpt = None, gpus_per_run: GpusOpt = None, slurm: SlurmOpt = None,
          oversubscribe: OversubscribeOpt = False, keep_going: KeepGoingOpt = False,
          retry_failed: RetryFailedOpt = False, allow_code_change: AllowCodeChangeOpt = False,
          seed_timeout: SeedTimeoutOpt = None, protocol: ProtocolOpt = None,
          allow_initial_model_change: AllowInitialModelChangeOpt = False) -> None:
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
    from rlvrlab.sweep.exits import SweepExit, outcome
    from rlvrlab.sweep.workers import run_sweep_file
    from rlvrlab.tracking.testbed import optional

    testbed = optional(protocol, allow_initial_model_change)  # a bad protocol file: one line before anything runs

    err = Console(stderr=True)
    # rich's bar on a terminal, plain lines in a log file (rlvrlab.cli.progress); it moves once a seed run or trial:
    # more than 2 redraws a second only cost CPU
    progress = progress_display(err, TextColumn("[bold]sweep[/]"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[status]}"), refresh_per_second=2)
    task = progress.add_task("sweep", total=None, status="")
    started = False

    def show(done: int, total: int | None, note: str) -> None:
        nonlocal started
        if not started:  # from the first report on: a bad file or storage stays one line
            started = True
            progress.start()
        progress.update(task, completed=done, total=total, status=note)

    try:
        opened = run_sweep_file(sweep_file, overrides or [], seeds=seeds, study=name, launcher=launcher, nproc=nproc,
                                gpus_per_run=gpus_per_run, slurm=slurm or [], storage=storage, workers=workers,
                                status_only=status, on_progress=show, oversubscribe=oversubscribe,
                                keep_going=keep_going, retry_failed=retry_failed, allow_code_change=allow_code_change,
                                testbed=testbed,
                                **({"seed_timeout": seed_timeout} if seed_timeout is not None else {}),
                                warn=lambda message: err.print(f"warning: {message}", style="yellow", markup=False,
                                                               highlight=False, soft_wrap=True))
    except SweepExit as stopped:  # stopped by a signal: its own exit code (rlvrlab.sweep.exits)
        progress.stop()
        _exit_with(err, str(stopped), stopped.code)
    finally:
        progress.stop()
    console = Console(soft_wrap=True)
    if not console.is_terminal:  # a log file: wide enough for the table, not squeezed to 80 columns
        console = Console(soft_wrap=True, width=200)
    _print_summary(console, opened)
    code, line = outcome(opened, status_only=status)
    if code:
        _exit_with(err, line or "", code)


def _exit_with(err: Console, line: str, code: int) -> None:
    """One `error:` line (as rlvrlab.cli.main prints a RlvrlabError), then exit with `code`."""
    from rlvrlab.procs import ignore_further_signals, stop_requested

    if stop_requested() is not None:  # on its way out after a stop: a late signal must not cut the line short
        ignore_further_signals()
    err.print(f"error: {line}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _short(keys: list[str]) -> list[str]:
    """Column labels: the last part of each dotted key, unless two keys share it."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return [tail if last.count(tail) == 1 else key for key, tail in zip(keys, last)]


def _more(row, most: int) -> str:
    """Seeds still needed for the target half-width; those beyond the sweep's max are marked."""
    if row.more_seeds is None:
        return ""
    if row.seeds_done + row.more_seeds > most:
        return f"{row.more_seeds} (> max {most})"
    return str(row.more_seeds)


def _print_summary(console: Console, opened) -> None:
    from rlvrlab.sweep.objective import MEAN
    from rlvrlab.sweep.spec import format_value
    from rlvrlab.sweep.summary import summarize
    from rlvrlab.tracking.mlflow_tracker import ui_hint
    from rlvrlab.tracking.store import masked

    spec, summary = opened.spec, summarize(opened)
    keys = [p.key for p in spec.space]
    objective = spec.objective
    bound = objective.aggregate != MEAN.name  # the optimised value differs from the mean: show both
    adaptive = spec.adaptive
    seeds_text = (f"seeds {adaptive.initial}-{adaptive.max} until ±{adaptive.halfwidth:g}" if adaptive
                  else f"{len(spec.seeds)} seeds")
    interval = ("95% interval of Stein's two-stage rule (t on the first stage's spread)" if adaptive
                else "95% t-interval over seeds")
    table = Table(title=f"study {spec.name}: {objective.metric} (last {objective.window} steps), "
                        f"{objective.direction}, {seeds_text}; {interval}")
    attempts = any(row.attempt > 1 for row in summary.rows)  # a retried study: which attempt each trial is
    columns = ["trial", "state", *(["attempt"] if attempts else []), *_short(keys),
               *([objective.aggregate] if bound else []), "mean", "95% CI", "±", "seeds",
               *(["more seeds"] if adaptive else []), "note"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("state", "note") else "right", no_wrap=column != "note")
    sign = -1 if objective.direction == "maximize" else 1
    order = {"COMPLETE": 0, "RUNNING": 1, "WAITING": 2, "PRUNED": 3, "FAIL": 4}
    rows = sorted(summary.rows, key=lambda r: (order[r.state], sign * r.value if r.value is not None else 0,
                                               r.number))
    for row in rows:
        best = summary.best is not None and row.number == summary.best.number
        interval = f"[{row.low:.3f}, {row.high:.3f}]" if row.low is not None else ""
        note = "; ".join(part for part in (
            row.reason, f"retry of trial {row.retry_of}" if row.retry_of is not None else "",
            "re-run by a later attempt" if row.retried and row.state == "FAIL" else "") if part)
        value = [] if not bound else ["" if row.value is None else f"{row.value:.3f}"]
        table.add_row(str(row.number), row.state, *([str(row.attempt)] if attempts else []),
                      *[format_value(row.params.get(k, "")) for k in keys], *value,
                      "" if row.mean is None else f"{row.mean:.3f}", interval,
                      "" if row.halfwidth is None else f"{row.halfwidth:.3f}", str(row.seeds_done),
                      *([_more(row, adaptive.max)] if adaptive else []), note,
                      style="bold green" if best else None)
    console.print(table)
    total = summary.total if summary.total is not None else "?"
    console.print(f"{summary.finished}/{total} trials done")
    if summary.best is not None:
        shown = " ".join(f"{k}={format_value(v)}" for k, v in summary.best.params.items())
        console.print(f"[bold]best[/]: trial {summary.best.number}: {shown} -> {summary.best.value:.4f}")
    if not opened.started:  # --status of a study whose start-up stopped (killed, a store that was held)
        console.print(f"study {spec.name!r} in {masked(opened.storage_url)}: its start-up stopped before it was done; "
                      "re-run the sweep command without --status to finish it and run the trials")
        return
    console.print(f"records: Optuna study {spec.name!r} in {masked(opened.storage_url)}; MLflow experiment "
                  f"{spec.name!r} (study run {opened.study_run_id}) in {opened.mlflow_uri}")
    password = "   (with your password for ***)" if "***" in masked(opened.storage_url) else ""
    console.print(f"  look at them: optuna-dashboard {masked(opened.storage_url)}{password}   |   "
                  f"{ui_hint(opened.mlflow_uri, opened.study_run_id)}", markup=False, highlight=False)
