"""Running a sweep: its trials claimed by this process, or by N spawned worker processes sharing the study's
storage, until the study is done, its budget is used or its timeout passes.

Stops are safe: the first Ctrl-C or SIGTERM stops each worker at the end of its current step (its trial is
re-enqueued, its MLflow runs end KILLED); a second stops them at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.procs import signal_name, stop_at_safe_points, stop_requested
from rlvrlab.sweep.spec import SweepSpec
from rlvrlab.sweep.summary import summarize
from rlvrlab.sweep.trials import Sweep, finish_study_run, open_sweep, work

STOP_GRACE_SECONDS = 600  # how long a stopping sweep waits for each worker to finish its step

# on_progress(done, total or None, status): seed runs done (one worker) or trials done (several)
OnProgress = Callable[[int, Optional[int], str], None]


def run_sweep(spec: SweepSpec, storage: Optional[str] = None, *, workers: int = 1, status_only: bool = False,
              on_progress: Optional[OnProgress] = None, warn: Callable[[str], None] = lambda message: None) -> Sweep:
    """Open (or create) the study and run it to its end; with status_only, open it and run nothing."""
    if workers > 1 and (storage or "").startswith("sqlite"):
        raise RlvrlabError("--storage sqlite:// can hand one trial to two workers (sqlite ignores SELECT ... FOR "
                           "UPDATE; bench/sweep_storage.py); with --workers use the default journal file or "
                           "PostgreSQL")
    if (storage or "").startswith("sqlite"):
        warn("with sqlite storage run one worker at a time (two processes can claim the same trial); the default "
             "journal file is safe for several")
    check_locations(spec, storage, status_only=status_only)
    opened = open_sweep(spec, storage, create=not status_only)
    if status_only:
        return opened
    _study_run_status(opened, "RUNNING")  # continued after a stop: its study run (KILLED) runs again
    deadline = time.time() + spec.timeout if spec.timeout else None
    report = on_progress or (lambda done, total, status: None)
    try:
        if workers == 1:
            _run_here(opened, deadline, report)
        else:
            _run_workers(opened, workers, storage, deadline, report, warn)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM; the interrupted trials are re-enqueued
        _study_run_status(opened, "KILLED")
        raise RlvrlabError(f"sweep stopped by {signal_name(stop_requested() or signal.SIGINT)} before the study was "
                           f"done; its MLflow study run {opened.study_run_id} ended KILLED; re-run the same command "
                           "to continue it (interrupted trials are re-run)") from None
    finish_study_run(opened)
    return opened


def check_locations(spec: SweepSpec, storage: Optional[str], *, status_only: bool) -> None:
    """Before any work: the base config's output_dir (MLflow store, run folders) can be written, and the journal
    file can be (or, for --status, exists: looking at a study creates nothing)."""
    from rlvrlab.config import compose
    from rlvrlab.sweep.storage import storage_url

    base = compose(spec.experiment, spec.overrides_for({}, spec.seeds[0]))
    url = storage_url(base.output_dir, storage)
    if not status_only:
        outputs.check_dir(base.output_dir, f"output_dir={base.output_dir}")
    if "://" in url:
        return
    if status_only and not Path(url).expanduser().is_file():
        raise RlvrlabError(f"no study {spec.name!r}: the journal file {url} does not exist (run the sweep without "
                           "--status to start it, or pass --storage / output_dir= of the study)")
    if not status_only:
        outputs.check_file_target(url, f"--storage {url}" if storage else f"the journal file {url}")


def _study_run_status(opened: Sweep, status: str) -> None:
    """End the study's MLflow run (KILLED: the sweep was stopped) or mark it running again (continued)."""
    try:
        client = opened.client()
        run_id = opened.study_run_id
        if status == "RUNNING":
            if client.get_run(run_id).info.status in ("KILLED", "FAILED"):  # a finished study stays FINISHED
                client.update_run(run_id, status="RUNNING")
        else:
            client.set_terminated(run_id, status=status)
    except KeyError:  # a study whose creator died before opening its run: nothing to mark
        pass


def _run_here(opened: Sweep, deadline: Optional[float], report: OnProgress) -> None:
    total = opened.spec.total_trials()
    runs = total * len(opened.spec.seeds) if total else None
    done = 0
    report(0, runs, "")

    def on_seed(number: int, position: int, count: int) -> None:
        nonlocal done
        done += 1
        report(done, runs, f"trial {number}: seed {position + 1}/{count}")

    work(opened, deadline=deadline, on_seed=on_seed)


def _run_workers(opened: Sweep, workers: int, storage: Optional[str], deadline: Optional[float], report: OnProgress,
                 warn: Callable[[str], None]) -> None:
    """Spawned processes, each a full worker on the same storage; progress polls the study."""
    import multiprocessing

    threads = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_worker_main, args=(opened.spec, storage, deadline, threads, index),
                             daemon=False) for index in range(workers)]
    total = opened.spec.total_trials()
    status = f"{workers} workers"
    report(0, total, status)
    try:
        with stop_at_safe_points():
            for proc in procs:
                proc.start()
            while any(proc.is_alive() for proc in procs):
                time.sleep(1.0)
                if stop_requested() is not None:
                    _stop_workers(procs, pass_on=stop_requested() == signal.SIGTERM)
                report(summarize(opened).finished, total, status)
            report(summarize(opened).finished, total, status)
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
    warn(f"{message}; the other workers re-ran their trials")


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
    import torch

    from rlvrlab.procs import die_with_parent, install_stop_handlers

    install_stop_handlers(announce=False)  # the parent prints the one stop message
    die_with_parent(signal.SIGTERM)  # a killed `rlvrlab sweep` takes its workers with it
    torch.set_num_threads(threads)
    try:
        work(open_sweep(spec, storage, create=False, worker=index), deadline=deadline)
    except RlvrlabError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # its trial is already re-enqueued and its runs closed KILLED (run_trial)
        raise SystemExit(130) from None
