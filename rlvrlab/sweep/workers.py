"""Running a sweep: its trials claimed by this process, or by N spawned worker processes sharing the study's
storage, or (launcher slurm) by N worker jobs submitted with submitit, until the study is done, its budget is used
or its timeout passes (docs/sweeps.md, "Storage, workers and resuming"). With --gpus-per-run k each worker of this
machine owns k GPUs (rlvrlab.sweep.placement). A stop ends the sweep with exit code 130 or 143
(rlvrlab.sweep.exits). Before any trial runs, an invocation checks the code its seed runs run (rlvrlab.sweep.guard),
enqueues the retries of --retry-failed (rlvrlab.sweep.retry) and arms fail-fast (rlvrlab.sweep.failfast)."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.procs import signal_name, stop_at_safe_points, stop_requested
from rlvrlab.sweep import failfast, guard
from rlvrlab.sweep.confirmation import confirm_sweep
from rlvrlab.sweep.exits import SweepExit, interrupted_code
from rlvrlab.sweep.placement import assign, visible_devices
from rlvrlab.sweep.runner import SEQUENTIAL
from rlvrlab.sweep.spawned import WORKER_BYTES, WorkerPool, machine_limit
from rlvrlab.sweep.spec import SweepSpec, load_sweep
from rlvrlab.sweep.study import Sweep, finish_study_run, open_sweep
from rlvrlab.sweep.summary import finished_trials, summarize
from rlvrlab.sweep.trials import work
from rlvrlab.sweep.view import sequential_line
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.testbed import Testbed

STOP_GRACE_SECONDS = 600  # how long a stopping sweep waits for each worker to finish its step

# on_progress(done, total or None, status): seed runs done (one worker) or trials done (several)
OnProgress = Callable[[int, Optional[int], str], None]


def run_sweep_file(name: str, overrides: Sequence[str] = (), *, seeds: Optional[int] = None,
                   study: Optional[str] = None, launcher: Optional[str] = None, nproc: Optional[int] = None,
                   gpus_per_run: Optional[int] = None, slurm: Sequence[str] = (), storage: Optional[str] = None,
                   workers: int = 1, status_only: bool = False, on_progress: Optional[OnProgress] = None,
                   warn: Callable[[str], None] = lambda message: None, oversubscribe: bool = False,
                   keep_going: bool = False, retry_failed: bool = False, allow_code_change: bool = False,
                   testbed: Optional[Testbed] = None, **load_options) -> Sweep:
    """`rlvrlab sweep` as one call: the sweep file read and checked (load_sweep, with the command line's choices
    over the file's; load_options: more of load_sweep's keywords), then run_sweep. testbed: --protocol's fixed
    initial model, which every seed run checks (in the worker or in its child `rlvrlab train`)."""
    spec = load_sweep(name, overrides, seeds=seeds, study=study, launcher=launcher, nproc=nproc,
                      gpus_per_run=gpus_per_run, slurm=slurm, **load_options)
    if testbed is not None and testbed.sha256 is not None and not spec.runner.checks_testbed:
        raise RlvrlabError(f"--protocol {testbed.protocol} fixes an initial model, which only rlvrlab's own training "
                           "runs can check; a command sweep's command trains another model: drop --protocol")
    if testbed is not None:
        spec = dataclasses.replace(spec, testbed=testbed)
    return run_sweep(spec, storage, workers=workers, status_only=status_only, on_progress=on_progress, warn=warn,
                     oversubscribe=oversubscribe, keep_going=keep_going, retry_failed=retry_failed,
                     allow_code_change=allow_code_change)


def run_sweep(spec: SweepSpec, storage: Optional[str] = None, *, workers: int = 1, status_only: bool = False,
              on_progress: Optional[OnProgress] = None, warn: Callable[[str], None] = lambda message: None,
              devices: Optional[Sequence[str]] = None, oversubscribe: bool = False, keep_going: bool = False,
              retry_failed: bool = False, allow_code_change: bool = False) -> Sweep:
    """Open (or create) the study and run it to its end; with status_only, open it and run nothing.
    workers: never more than the sweep's trials (a grid's points, a sampler's budget.trials) nor, once the study is
    open, than its trials not yet done; more than this machine holds (a core and spawned.WORKER_BYTES of available
    memory each) is refused before any worker starts, unless oversubscribe. Several workers are started before the
    study is opened, so that their imports overlap its opening; an error before they are given it ends them.
    devices: the GPUs that spec.launcher.gpus_per_run places workers on (default: the ones this machine shows).
    keep_going: no fail-fast; retry_failed: re-run the failed trials' failed seeds; allow_code_change: continue a
    study whose code changed (rlvrlab.sweep.failfast, retry, guard). The exit code: rlvrlab.sweep.exits.outcome."""
    _check_storage(storage, workers, warn)
    check_locations(spec, storage, status_only=status_only)
    if status_only:
        return open_sweep(spec, storage, create=False)
    launch, started = spec.launcher, None
    placed: Optional[list[str]] = None
    if launch.type == "slurm":  # Slurm's workers are jobs on other machines, each given its GPUs
        check_slurm(spec, storage, warn)
    else:
        workers = _workers_here(spec, workers, oversubscribe)
        if launch.gpus_per_run:
            placed = assign(workers, launch.gpus_per_run, visible_devices() if devices is None else list(devices))
    deadline = time.time() + spec.timeout if spec.timeout else None
    try:  # ends the pool on any error before it is given the study (a no-op after that)
        if launch.type != "slurm" and workers > 1:  # placed on GPUs, each has its devices set before it imports torch
            started = WorkerPool(workers, warm=not launch.child, visible=placed)
        opened = open_sweep(spec, storage, create=True)
        _before_trials(opened, allow_code_change=allow_code_change, retry_failed=retry_failed,
                       keep_going=keep_going, warn=warn)
        started = _fit_pool(started, opened)
        _study_run_status(opened, "RUNNING")  # continued after a stop: its study run (KILLED) runs again
        _run_workers_of(opened, workers, storage, deadline, started, placed, on_progress, warn)
    finally:
        if started is not None:
            started.cancel()
    stop = failfast.stopped(opened.study, opened.epoch or "")
    if stop is not None:  # trials are left: its study run ends FAILED with the reason, until the next invocation
        _study_run_status(opened, "FAILED", failfast.stop_line(stop))
    finish_study_run(opened)
    if spec.pruner.type == SEQUENTIAL:  # the seed runs it saved, on the study run for `rlvrlab report --study`
        opened.client().set_tag(opened.study_run_id, T.SEQUENTIAL_LINE, sequential_line(spec, summarize(opened)))
    if stop is None and spec.confirm is not None:  # here, once every worker is done (rlvrlab.sweep.confirmation)
        confirm_sweep(opened)
    return opened


def _check_storage(storage: Optional[str], workers: int, warn: Callable[[str], None]) -> None:
    """sqlite storage can hand one trial to two workers: refused with several, warned of with one."""
    if not (storage or "").startswith("sqlite"):
        return
    if workers > 1:
        raise RlvrlabError("--storage sqlite:// can hand one trial to two workers (sqlite ignores SELECT ... FOR "
                           "UPDATE; bench/sweep_storage.py); with --workers use the default journal file or "
                           "PostgreSQL")
    warn("with sqlite storage run one worker at a time (two processes can claim the same trial); the default "
         "journal file is safe for several")


def _before_trials(opened: Sweep, *, allow_code_change: bool, retry_failed: bool, keep_going: bool,
                   warn: Callable[[str], None]) -> None:
    """Before any trial of this invocation: its code checked, the failed trials re-enqueued (--retry-failed) and
    fail-fast armed (unless keep_going)."""
    guard.check(opened, allow=allow_code_change, warn=warn)
    if retry_failed:
        from rlvrlab.sweep.retry import enqueue_failed

        if not enqueue_failed(opened):
            warn(f"--retry-failed: study {opened.spec.name!r} has no failed trial to re-run")
    opened.epoch = failfast.arm(opened.study, not keep_going)


def _fit_pool(started: Optional[WorkerPool], opened: Sweep) -> Optional[WorkerPool]:
    """A continued study with fewer trials not yet done than started workers: the extra ones are ended (all of them,
    for this process's work, when at most one trial is left). A sampler without budget.trials keeps them all."""
    total = opened.spec.total_trials()
    left = None if total is None else max(0, total - finished_trials(opened))
    if started is None or left is None or left >= len(started):
        return started
    if left > 1:
        started.trim(left)
        return started
    started.cancel()
    return None


def _run_workers_of(opened: Sweep, workers: int, storage: Optional[str], deadline: Optional[float],
                    started: Optional[WorkerPool], placed: Optional[list[str]], on_progress: Optional[OnProgress],
                    warn: Callable[[str], None]) -> None:
    """Run the study's trials in the launcher's workers: Slurm jobs, this process, or the started pool. A stop
    (Ctrl-C or SIGTERM) re-enqueues the interrupted trials, ends the study run KILLED and exits 130 or 143."""
    report = on_progress or (lambda done, total, status: None)
    try:
        if opened.spec.launcher.type == "slurm":
            _run_jobs(opened, workers, storage, deadline, report, warn)
        elif started is None:
            with _devices(placed[0] if placed else None):
                _run_here(opened, deadline, report)
        else:
            orders = [(opened.spec, storage, deadline, index) for index in range(len(started))]
            _run_workers(opened, started, orders, report, warn)
    except KeyboardInterrupt:
        _study_run_status(opened, "KILLED")
        asked = stop_requested() or signal.SIGINT
        raise SweepExit(f"sweep stopped by {signal_name(asked)} before the study was done; its MLflow study run "
                        f"{opened.study_run_id} ended KILLED; re-run the same command to continue it (interrupted "
                        "trials are re-run)", interrupted_code(asked)) from None


def _workers_here(spec: SweepSpec, requested: int, oversubscribe: bool) -> int:
    """The worker processes to start on this machine: `requested`, at most the sweep's trials; refused (one line)
    beyond what the machine holds unless oversubscribe."""
    total = spec.total_trials()
    workers = requested if total is None else max(1, min(requested, total))
    if workers == 1 or oversubscribe:  # one worker is this process: nothing is started
        return workers
    limit, has = machine_limit()
    if workers > limit:
        capped = f" (capped at the sweep's {total} trials)" if workers < requested else ""
        raise RlvrlabError(f"--workers {requested}{capped}: {workers} worker processes need {workers} cores and "
                           f"~{workers * WORKER_BYTES / 2**30:.1f} GiB of memory ({WORKER_BYTES >> 20} MiB each), and "
                           f"this machine has {has}; give --workers {limit} or fewer, or add --oversubscribe to "
                           "start them anyway")
    return workers


def check_locations(spec: SweepSpec, storage: Optional[str], *, status_only: bool) -> None:
    """Before any work: the base config's output_dir (MLflow store, run folders) can be written, and the journal
    file can be (or, for --status, exists: looking at a study creates nothing)."""
    from rlvrlab.sweep.storage import storage_url
    from rlvrlab.tracking.store import check_reachable, store

    base = spec.base()
    url = storage_url(base.output_dir, storage)
    if not status_only:
        outputs.check_dir(base.output_dir, f"output_dir={base.output_dir}")
    check_reachable(store(base.output_dir, base.tracking.uri).uri, write=not status_only)  # --status only reads
    if "://" in url:
        return
    if status_only and not Path(url).expanduser().is_file():
        raise RlvrlabError(f"no study {spec.name!r}: the journal file {url} does not exist (run the sweep without "
                           "--status to start it, or pass --storage / output_dir= of the study)")
    if not status_only:
        outputs.check_file_target(url, f"--storage {url}" if storage else f"the journal file {url}")


def _study_run_status(opened: Sweep, status: str, reason: str = "") -> None:
    """End the study's MLflow run (KILLED: the sweep was stopped; FAILED: by fail-fast, with the reason) or mark it
    running again (continued)."""
    try:
        client = opened.client()
        run_id = opened.study_run_id
        if status == "RUNNING":
            if client.get_run(run_id).info.status in ("KILLED", "FAILED"):  # a finished study stays FINISHED
                client.update_run(run_id, status="RUNNING")
        else:
            if reason:
                client.set_tag(run_id, T.FAIL_REASON, reason[:T.FAIL_REASON_CHARS])
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


@contextmanager
def _devices(visible: Optional[str]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES of this process (and the seed runs it starts) while its worker runs."""
    if visible is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def _run_workers(opened: Sweep, started: WorkerPool, orders: list[tuple], report: OnProgress,
                 warn: Callable[[str], None]) -> None:
    """The started workers claim the study's trials; progress polls the study."""
    import multiprocessing.connection

    procs, workers = started.procs, len(started.procs)
    total = opened.spec.total_trials()
    status = f"{workers} workers"
    report(0, total, status)
    try:
        with stop_at_safe_points():
            started.give(orders)
            while any(proc.is_alive() for proc in procs):
                # wakes at once when a worker exits (the last one's end is the sweep's), else after 1 s
                multiprocessing.connection.wait([proc.sentinel for proc in procs if proc.is_alive()], timeout=1.0)
                if stop_requested() is not None:
                    _stop_workers(procs, pass_on=stop_requested() == signal.SIGTERM)
                report(finished_trials(opened), total, status)
            report(finished_trials(opened), total, status)
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
    if failed:
        _workers_failed(opened, f"{len(failed)} of {workers} sweep workers exited with an error (exit codes "
                        f"{failed})", warn)


def _workers_failed(opened: Sweep, message: str, warn: Callable[[str], None]) -> None:
    """Some workers failed: an error while trials are left (the next invocation runs them), else a warning."""
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


# ------------------------------------------------------------------------------------------------- Slurm workers
def check_slurm(spec: SweepSpec, storage: Optional[str], warn: Callable[[str], None]) -> None:
    """Before anything is opened: submitit is there, and so is sbatch (cluster slurm); workers on other machines
    need a shared storage and MLflow store."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise RlvrlabError("--launcher slurm needs submitit; pip install submitit") from None
    jobs = spec.launcher.slurm
    if jobs.cluster == "slurm":
        import shutil

        if shutil.which("sbatch") is None:
            raise RlvrlabError("--launcher slurm: sbatch is not on PATH; run on a Slurm login node (or set "
                               "slurm.cluster: local to run the same worker jobs on this machine)")
        if not spec.base().tracking.uri:
            warn("--launcher slurm with the default sqlite MLflow store: every node writes one file; point "
                 "tracking.uri= at a shared mlflow server (docs/scaling.md)")
        if not storage:
            warn("--launcher slurm with the default journal file: it must be on a file system every node shares; "
                 "PostgreSQL (--storage postgresql://...) is the robust choice (docs/scaling.md)")


def _run_jobs(opened: Sweep, workers: int, storage: Optional[str], deadline: Optional[float], report: OnProgress,
              warn: Callable[[str], None]) -> None:
    """N worker jobs through submitit (sbatch, or its local executor); each claims trials from the shared storage
    and runs its seed runs as child processes. A job that is preempted or runs out of time is a dead worker: its
    trial is failed and retried by the liveness check (rlvrlab.sweep.liveness). Progress polls the study; a stop
    cancels the jobs (their workers stop at the end of the step and re-enqueue their trials)."""
    import submitit

    spec, jobs = opened.spec, opened.spec.launcher.slurm
    folder = opened.output_dir / "slurm" / spec.name
    executor = submitit.AutoExecutor(folder=folder, cluster=jobs.cluster)
    options: dict = dict(name=f"rlvrlab-{spec.name}", timeout_min=jobs.time, nodes=1, tasks_per_node=1,
                         gpus_per_node=jobs.gpus_per_node)
    if jobs.cpus_per_task:
        options["cpus_per_task"] = jobs.cpus_per_task
    if jobs.partition:
        options["slurm_partition"] = jobs.partition
    if jobs.account:
        options["slurm_account"] = jobs.account
    executor.update_parameters(**options)
    try:
        submitted = [executor.submit(slurm_worker, spec, storage, deadline, index) for index in range(workers)]
    except Exception as error:  # sbatch refused (partition, account, limits): its own message
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RlvrlabError(f"--launcher slurm: submitting the worker jobs failed: {first}") from None
    total = spec.total_trials()
    status = f"{workers} jobs ({', '.join(job.job_id for job in submitted)})"
    report(0, total, status)
    try:
        with stop_at_safe_points():
            while not all(job.done() for job in submitted):
                time.sleep(2.0)
                if stop_requested() is not None:
                    raise KeyboardInterrupt
                report(finished_trials(opened), total, status)
            report(finished_trials(opened), total, status)
    except KeyboardInterrupt:
        for job in submitted:
            if not job.done():
                job.cancel(check=False)
        end = time.monotonic() + STOP_GRACE_SECONDS
        while not all(job.done() for job in submitted) and time.monotonic() < end:
            time.sleep(1.0)
        raise
    failed = [f"{job.job_id}: {_job_error(job)}" for job in submitted if job.exception() is not None]
    if failed:
        _workers_failed(opened, f"{len(failed)} of {workers} worker jobs failed ({'; '.join(failed)[:2000]}; logs "
                        f"in {folder})", warn)


def _job_error(job) -> str:
    error = job.exception()
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


def slurm_worker(spec: SweepSpec, storage: Optional[str], deadline: Optional[float], index: int) -> int:
    """One worker job (pickled by submitit, run on a cluster node): claim and run trials until none is left.
    SIGTERM (scancel) stops it at the end of the step with its trial re-enqueued; submitit's own signal for a
    time limit or preemption ends the job, and its trial is retried as a dead worker's. Returns the trials run."""
    from rlvrlab.procs import install_stop_handlers

    install_stop_handlers(announce=False)
    try:
        return len(work(open_sweep(spec, storage, create=False, worker=index), deadline=deadline))
    except KeyboardInterrupt:  # its trial is already re-enqueued and its runs closed KILLED (run_trial)
        raise RlvrlabError("stopped by a signal; its trial was re-enqueued") from None
