"""`rlvrlab sweep SWEEP.yaml`: an Optuna study over config keys, several seeds per trial, recorded in MLflow."""

from __future__ import annotations

import os
import signal
import time
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlvrlab.cli.options import OverridesArg
from rlvrlab.errors import RlvrlabError
from rlvrlab.procs import stop_at_safe_points, stop_requested

SweepArg = Annotated[str, typer.Argument(help="A sweep file (sweeps/NAME.yaml or a path).", show_default=False)]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Trials run in parallel processes on this machine.")]
StorageOpt = Annotated[Optional[str], typer.Option(
    "--storage", help="Optuna storage: a journal file path, or an RDB URL such as postgresql://user:pw@host/db "
    "for workers on several machines. Default: <output_dir>/optuna.journal.", show_default=False)]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Study name (default: the file's name:).",
                                                show_default=False)]
SeedsOpt = Annotated[Optional[int], typer.Option("--seeds", min=1, help="Seeds per trial (default: the file's seeds:).",
                                                 show_default=False)]
STOP_GRACE_SECONDS = 600  # how long a stopping sweep waits for each worker to finish its step
StatusOpt = Annotated[bool, typer.Option("--status", help="Show the study's trials and best config; run nothing.")]


def sweep(sweep_file: SweepArg, overrides: OverridesArg = None, workers: WorkersOpt = 1, storage: StorageOpt = None,
          name: NameOpt = None, seeds: SeedsOpt = None, status: StatusOpt = False) -> None:
    """Run (or continue) an Optuna study: each trial trains every seed and scores the objective from MLflow.

    [dim]rlvrlab sweep sweeps/ucpo_tau.yaml                      # toy tier, 5 seeds per value of tau
    rlvrlab sweep sweeps/tau_eps_staleness_grid.yaml --workers 2
    rlvrlab sweep sweeps/ucpo_tau.yaml --status             # the table so far, nothing runs
    rlvrlab sweep sweeps/ucpo_tau.yaml --storage postgresql://user:pw@db/optuna   # on every machine[/dim]

    Re-running the same command continues the study: finished trials are kept, trials of a worker that died
    are re-run. KEY=VALUE overrides change the base config (and so the study's fingerprint).
    """
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import finish_study_run, open_sweep, work

    if workers > 1 and (storage or "").startswith("sqlite"):
        raise RlvrlabError("--storage sqlite:// can hand one trial to two workers (sqlite ignores SELECT ... FOR "
                           "UPDATE; bench/sweep_storage.py); with --workers use the default journal file or "
                           "PostgreSQL")
    if (storage or "").startswith("sqlite"):
        Console(stderr=True).print("warning: with sqlite storage run one worker at a time (two processes can claim "
                                   "the same trial); the default journal file is safe for several", style="yellow")
    spec = load_sweep(sweep_file, overrides or [], seeds=seeds, study=name)
    opened = open_sweep(spec, storage, create=not status)
    console = Console(soft_wrap=True)
    if not console.is_terminal:  # a log file: wide enough for the table, not squeezed to 80 columns
        console = Console(soft_wrap=True, width=200)
    if not status:
        deadline = time.time() + spec.timeout if spec.timeout else None
        try:
            if workers == 1:
                _run_here(opened, deadline, work)
            else:
                _run_workers(opened, workers, storage, deadline)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM; the interrupted trials are re-enqueued
            raise RlvrlabError("sweep stopped before the study was done; re-run the same command to continue it "
                               "(interrupted trials are re-run)") from None
        finish_study_run(opened)
    _print_summary(console, opened)


def _run_here(opened, deadline, work) -> None:
    total = opened.spec.total_trials()
    seeds = len(opened.spec.seeds)
    progress = _progress(total * seeds if total else None)
    task = progress.add_task("sweep", total=total * seeds if total else None, status="")

    def on_seed(number: int, position: int, count: int) -> None:
        progress.update(task, advance=1, status=f"trial {number}: seed {position + 1}/{count}")

    with progress:
        work(opened, deadline=deadline, on_seed=on_seed)


def _run_workers(opened, workers: int, storage: Optional[str], deadline) -> None:
    """Spawned processes, each a full worker on the same storage; the progress bar polls the study."""
    import multiprocessing

    from rlvrlab.sweep.summary import summarize

    threads = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_worker_main, args=(opened.spec, storage, deadline, threads, index),
                             daemon=False) for index in range(workers)]
    total = opened.spec.total_trials()
    progress = _progress(total)
    task = progress.add_task("sweep", total=total, status=f"{workers} workers")
    try:
        with stop_at_safe_points():
            for proc in procs:
                proc.start()
            with progress:
                while any(proc.is_alive() for proc in procs):
                    time.sleep(1.0)
                    if stop_requested() is not None:
                        _stop_workers(procs, pass_on=stop_requested() == signal.SIGTERM)
                    progress.update(task, completed=summarize(opened).finished)
                progress.update(task, completed=summarize(opened).finished)
    except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM: stop the workers now
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # to a worker already stopping, a second signal: KeyboardInterrupt at once
        for proc in procs:
            proc.join(timeout=60)
        raise
    if stop_requested() is not None:
        raise KeyboardInterrupt
    failed = [proc.exitcode for proc in procs if proc.exitcode]
    if not failed:
        return
    message = f"{len(failed)} of {workers} sweep workers exited with an error (exit codes {failed})"
    if any(row.state in ("WAITING", "RUNNING") for row in summarize(opened).rows):
        raise RlvrlabError(f"{message}; re-run the same command to continue the study")
    Console(stderr=True).print(f"warning: {message}; the other workers re-ran their trials", style="yellow")


def _stop_workers(procs, *, pass_on: bool) -> None:
    """This process was asked to stop. Ctrl-C reached the workers too (same process group); SIGTERM to this process
    alone is passed on. Each worker then stops at the end of its current step, closes its runs KILLED and
    re-enqueues its trial; wait for that (a step of a large model can take minutes)."""
    if pass_on:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
    for proc in procs:
        proc.join(timeout=STOP_GRACE_SECONDS)


def _worker_main(spec, storage: Optional[str], deadline, threads: int, index: int) -> None:
    import sys

    import torch

    from rlvrlab.procs import die_with_parent, install_stop_handlers
    from rlvrlab.sweep.study import open_sweep, work

    install_stop_handlers()
    die_with_parent(signal.SIGTERM)  # a killed `rlvrlab sweep` takes its workers with it
    torch.set_num_threads(threads)
    try:
        work(open_sweep(spec, storage, create=False, worker=index), deadline=deadline)
    except RlvrlabError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # its trial is already re-enqueued and its runs closed KILLED (run_trial)
        raise SystemExit(130) from None


def _progress(total) -> Progress:
    return Progress(TextColumn("[bold]sweep[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[status]}"), console=Console(stderr=True))


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
    from rlvrlab.sweep.spec import format_value
    from rlvrlab.sweep.study import masked
    from rlvrlab.sweep.summary import summarize

    spec, summary = opened.spec, summarize(opened)
    keys = [p.key for p in spec.space]
    objective = spec.objective
    bound = objective.aggregate != "mean"  # the optimised value differs from the mean: show both
    adaptive = spec.adaptive
    seeds_text = (f"seeds {adaptive.initial}-{adaptive.max} until ±{adaptive.halfwidth:g}" if adaptive
                  else f"{len(spec.seeds)} seeds")
    table = Table(title=f"study {spec.name}: {objective.metric} (last {objective.window} steps), "
                        f"{objective.direction}, {seeds_text}; 95% t-interval over seeds")
    columns = ["trial", "state", *_short(keys), *([objective.aggregate] if bound else []), "mean", "95% CI", "±",
               "seeds", *(["more seeds"] if adaptive else []), "note"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("state", "note") else "right", no_wrap=column != "note")
    sign = -1 if objective.direction == "maximize" else 1
    order = {"COMPLETE": 0, "RUNNING": 1, "WAITING": 2, "PRUNED": 3, "FAIL": 4}
    rows = sorted(summary.rows, key=lambda r: (order[r.state], sign * r.value if r.value is not None else 0,
                                               r.number))
    for row in rows:
        best = summary.best is not None and row.number == summary.best.number
        interval = f"[{row.low:.3f}, {row.high:.3f}]" if row.low is not None else ""
        note = row.reason or (f"retry of trial {row.retry_of}" if row.retry_of is not None else "")
        value = [] if not bound else ["" if row.value is None else f"{row.value:.3f}"]
        table.add_row(str(row.number), row.state, *[format_value(row.params.get(k, "")) for k in keys], *value,
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
    console.print(f"records: Optuna study {spec.name!r} in {masked(opened.storage_url)}; MLflow experiment "
                  f"{spec.name!r} (study run {opened.study_run_id}) in {opened.mlflow_uri}")
    password = "   (with your password for ***)" if "***" in masked(opened.storage_url) else ""
    console.print(f"  look at them: optuna-dashboard {masked(opened.storage_url)}{password}   |   "
                  f"mlflow ui --backend-store-uri {opened.mlflow_uri}")
