"""The worker processes of `rlvrlab sweep --workers N` on this machine (rlvrlab.sweep.workers starts and runs them).

A worker's start-up is its imports (torch, MLflow, Optuna and the training loop: ~4 s of CPU each here,
bench/README.md). The pool is started before the study is opened, so that those imports overlap the parent's
opening or creation of the study; each worker then waits for its orders (the sweep, sent once the study is open) or
for the pool's cancel. This module imports nothing heavy itself: a spawned worker imports it to unpickle its entry
point, before the imports it is started early for.

Spawned, not forked: no CUDA state, thread or open store of the parent reaches them. A fork server preloading torch
saves no wall time on the grid and its own ~1 s exit delays the workers' stop when the sweep is killed
(bench/README.md, "Why spawn and not a fork server").
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

# A worker's own memory before its first trial's runs grow it: 312 MB private after a warm worker's imports (torch,
# MLflow, Optuna, the training loop) and 368 MB after a 20-step toy seed run, here (/proc/self/smaps_rollup); the
# ~200 MB of shared library pages are counted once for all workers, not per worker.
WORKER_BYTES = 400 * 2**20


def machine_limit() -> tuple[int, str]:
    """(the most workers this machine holds: one core and WORKER_BYTES of available memory each, at least 1; what
    it has, in words)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = available_memory()
    if free is None:
        return max(1, cores), f"{cores} cores"
    return max(1, min(cores, free // WORKER_BYTES)), f"{cores} cores and {free / 2**30:.1f} GiB of available memory"


def available_memory() -> Optional[int]:
    """Bytes this process's children can still take: /proc/meminfo's MemAvailable, lowered to what a cgroup v2
    memory limit leaves; None where neither can be read."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            left = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = left if free is None else min(free, left)
    except (OSError, ValueError):
        pass
    return free


class WorkerPool:
    """N spawned worker processes waiting for their orders.

    warm: each also imports the training loop and what torch.optim imports on first use, for in-process seed runs;
    a `process` launcher's workers only start `rlvrlab train` children and skip them. visible: worker i's
    CUDA_VISIBLE_DEVICES (GPU placement), set before it imports torch (which may read the devices at import)."""

    def __init__(self, workers: int, *, warm: bool = True, visible: Optional[Sequence[str]] = None):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        threads = max(1, (os.cpu_count() or 1) // workers)
        self.given = False
        self.procs, self._pipes = [], []
        for index in range(workers):
            ours, theirs = context.Pipe()
            proc = context.Process(target=_main, args=(theirs, threads, warm, visible[index] if visible else None),
                                   daemon=False)
            proc.start()
            theirs.close()  # the worker's end lives in the worker: its exit closes the pipe
            self.procs.append(proc)
            self._pipes.append(ours)

    def __len__(self) -> int:
        return len(self.procs)

    def trim(self, count: int) -> None:
        """End the workers beyond the first `count` before the study is given (they hold nothing yet): fewer trials
        are left than workers were started."""
        assert not self.given, "workers given the study are ended by their own work"
        for pipe, proc in zip(self._pipes[count:], self.procs[count:]):
            pipe.close()
            if proc.is_alive():
                proc.kill()
            proc.join()
        del self._pipes[count:], self.procs[count:]

    def give(self, orders: Sequence[tuple[Any, ...]]) -> None:
        """Worker i works on the study: orders[i] = (spec, storage, deadline, worker index)."""
        self.given = True
        for pipe, order in zip(self._pipes, orders):
            try:
                pipe.send(order)
            except (BrokenPipeError, EOFError, OSError):  # a worker that died at start-up: its exit code says so
                pass
            pipe.close()

    def cancel(self) -> None:
        """No orders will come (the study could not be opened, this process was stopped first):
        the workers are ended at once, before they touch anything. Idempotent; after give() it leaves the workers to
        their work."""
        if not self.given:  # they hold nothing yet (no store, run or file opened): no need to wait for their imports
            self.trim(0)
            self.given = True


def _main(pipe, threads: int, warm: bool, visible: Optional[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch: the seed runs it starts as processes share them too
    if visible is not None:  # before anything reads the devices: this worker and its seed runs see only these
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    from rlvrlab.procs import die_with_parent, end_without_teardown, exit_now, install_stop_handlers

    end_without_teardown()  # before the imports whose atexit handlers must still run (rlvrlab.procs)
    install_stop_handlers(announce=False)  # the parent prints the one stop message
    die_with_parent(signal.SIGTERM)  # a killed `rlvrlab sweep` takes its workers with it
    try:
        import torch

        torch.set_num_threads(threads)
        import rlvrlab.sweep.trials  # noqa: F401  (MLflow, Optuna)

        if warm:  # what its first seed run imports: the loop, and what an optimizer's first step imports (~1.3 s)
            import rlvrlab.train.loop  # noqa: F401

            weight = torch.zeros(1, requires_grad=True)
            weight.grad = torch.zeros(1)
            torch.optim.AdamW([weight]).step()
        try:
            order: Optional[tuple[Any, ...]] = pipe.recv()
        except EOFError:  # the parent ended without a word
            order = None
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group, or the sweep was stopped during start-up
        exit_now(130)
    pipe.close()
    if order is None:
        exit_now(0)
    _work(*order)


def _work(spec, storage: Optional[str], deadline: Optional[float], index: int) -> None:
    """Once the parent has opened the study: claim and run trials until none is left; ends the process."""
    import sys

    from rlvrlab.errors import RlvrlabError
    from rlvrlab.procs import exit_now
    from rlvrlab.sweep.study import open_sweep
    from rlvrlab.sweep.trials import work

    code = 0
    try:
        work(open_sweep(spec, storage, create=False, worker=index), deadline=deadline)
    except RlvrlabError as error:
        print(f"error: {error}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:  # its trial is already re-enqueued and its runs closed KILLED (run_trial)
        code = 130
    exit_now(code)  # its runs are closed and its trials told to the study: skip the interpreter's teardown
