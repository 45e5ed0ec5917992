"""A seed run as its own job: a child `rlvrlab train` process, started through `torchrun` when it has several ranks,
or a command sweep's command (rlvrlab.sweep.command); both through `run_process`.

The child gets the seed run's experiment and overrides (the same config the worker would train in-process) and
the trial's MLflow tags (`--tag`), so it nests under the trial run in the same store. Its failure (a non-zero
exit, a signal, a non-finite loss: `rlvrlab train` exits 1 with an `error:` line) comes back as a reason that
fails the seed and its trial; the worker goes on. A stop reaches it: SIGTERM to the worker is passed on (the child
stops at the end of its step and ends its run KILLED; Ctrl-C reaches it through the process group), and a worker
that dies takes it along (PR_SET_PDEATHSIG, rlvrlab.procs.die_with_parent).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Optional

from rlvrlab.procs import die_with_parent, raise_if_stop_requested, signal_name, stop_requested
from rlvrlab.sweep.spec import SweepSpec

STOP_GRACE_SECONDS = 600  # how long a stopping worker waits for its child to finish its step
POLL_SECONDS = 0.05


def train_command(spec: SweepSpec, overrides: Sequence[str], tags: dict[str, str]) -> list[str]:
    """`rlvrlab train` of one seed run, as argv (no shell): through torchrun with launcher.nproc ranks when > 1."""
    train = ["-m", "rlvrlab.cli.main", "train", *([spec.experiment] if spec.experiment else []), *overrides,
             *(f"--tag={key}={value}" for key, value in tags.items())]
    if spec.launcher.nproc == 1:
        return [sys.executable, *train]
    # --standalone: a rendezvous on localhost with a free port of its own, so that runs of several workers on one
    # machine never meet
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={spec.launcher.nproc}",
            *train]


def child_env(nproc: int) -> dict[str, str]:
    """The worker's environment (CUDA_VISIBLE_DEVICES of its placement included); threads shared by the ranks."""
    env = dict(os.environ)
    threads = int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    env["OMP_NUM_THREADS"] = str(max(1, threads // nproc))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_seed_process(spec: SweepSpec, overrides: Sequence[str], tags: dict[str, str]) -> Optional[str]:
    """Run one seed run as a child process and wait for it; None when it finished, else why it failed (one line).
    A stop asked of this worker (rlvrlab.procs) is passed on and then raised here as KeyboardInterrupt."""
    returncode, tail = run_process(train_command(spec, overrides, tags), child_env(spec.launcher.nproc))
    return None if returncode == 0 else failure_reason(returncode, tail)


def run_process(argv: Sequence[str], env: dict[str, str], cwd: Optional[str] = None) -> tuple[int, list[str]]:
    """Run a child process (no stdin, stdout discarded) and wait for it: its exit code (negative: the signal that
    ended it) and the last 200 lines of its stderr. A stop asked of this worker is passed on (SIGTERM; Ctrl-C
    reaches it through the process group) and raised here as KeyboardInterrupt once it has ended; a worker that
    dies takes it along (PR_SET_PDEATHSIG)."""
    proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
                            preexec_fn=lambda: die_with_parent(signal.SIGTERM))  # noqa: PLW1509 - prctl only
    tail: collections.deque[str] = collections.deque(maxlen=200)
    reader = threading.Thread(target=_read_lines, args=(proc, tail), name="rlvrlab-child-stderr", daemon=True)
    reader.start()
    try:
        _wait(proc)
    finally:
        if proc.poll() is None:  # an exception in this worker (a second signal, a job's time limit): no orphan
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
    raise_if_stop_requested()  # the child stopped because this worker was asked to: the trial is re-enqueued
    return proc.returncode, list(tail)


def _wait(proc: subprocess.Popen) -> None:
    passed_on = None
    while proc.poll() is None:
        asked = stop_requested()
        if asked is not None and passed_on is None:
            passed_on = time.monotonic()
            if asked == signal.SIGTERM:  # Ctrl-C reached the child through the terminal's process group
                proc.send_signal(signal.SIGTERM)
        if passed_on is not None and time.monotonic() - passed_on > STOP_GRACE_SECONDS:
            proc.kill()
        time.sleep(POLL_SECONDS)


def _read_lines(proc: subprocess.Popen, tail: collections.deque) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        tail.append(line.rstrip("\n"))


def how_it_ended(returncode: int) -> str:
    """`exit code 1`, `killed by SIGKILL`, ... of a child's return code."""
    return (f"killed by {signal_name(-returncode)}" if returncode < 0 and -returncode in (2, 15)
            else f"killed by signal {signal.Signals(-returncode).name}" if returncode < 0
            else f"exit code {returncode}")


def last_lines(stderr_lines: list[str], count: int = 5, chars: int = 1000) -> str:
    """The last `count` non-empty lines of a child's stderr, joined by " | " (at most their last `chars`)."""
    kept = [line.strip() for line in stderr_lines if line.strip()][-count:]
    return " | ".join(kept)[-chars:]


def failure_reason(returncode: int, stderr_lines: list[str]) -> str:
    """The child's own `error:` line (rlvrlab's one-line errors; with torchrun, a rank's), else how it ended."""
    how = how_it_ended(returncode)
    errors = [line.split("error: ", 1)[1] for line in stderr_lines if "error: " in line]
    if errors:
        return f"the seed run's process failed ({how}): {errors[-1].strip()}"
    last = next((line.strip() for line in reversed(stderr_lines) if line.strip()), "")
    return f"the seed run's process failed ({how})" + (f": {last[-500:]}" if last else "")
