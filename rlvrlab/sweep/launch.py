"""A seed run as its own job: a child `rlvrlab train` process, started through `torchrun` when it has several ranks
(`run_seed_child`), or a command sweep's command (rlvrlab.sweep.command); both through `run_process`.

The child gets the seed run's experiment and overrides (the same config the worker would train in-process) and
the trial's MLflow tags (`--tag`), so it nests under the trial run in the same store. Its failure (a non-zero
exit, a signal, a non-finite loss: `rlvrlab train` exits 1 with an `error:` line) comes back as a reason that
fails the seed and its trial; the worker goes on.

Each child runs under a supervisor (rlvrlab.sweep.supervisor) in a process group and session of its own: a stop
(SIGTERM or Ctrl-C to the worker, passed on to the group; a limit of rlvrlab.sweep.limits) reaches every process
the child started, which get `stop_grace` seconds before SIGKILL, and a worker that dies, even SIGKILLed, takes
them all along. Its stdout and stderr go to a capped log file (rlvrlab.sweep.seedlog), attached to its MLflow run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.procs import raise_if_stop_requested, signal_name, stop_requested
from rlvrlab.sweep import seedlog
from rlvrlab.sweep.limits import Limits
from rlvrlab.sweep.objective import objective_of
from rlvrlab.sweep.seedlog import CappedLog, log_path, pump
from rlvrlab.sweep.space import format_value
from rlvrlab.tracking import tags as T

SUPERVISOR = Path(__file__).with_name("supervisor.py")  # run as a script: rlvrlab.sweep.supervisor
POLL_SECONDS = 0.05
METRIC_POLL_SECONDS = 5.0  # at most this long between two looks at a seed's MLflow run (first_metric_within)
BACKSTOP_SECONDS = 30.0  # beyond stop_grace: the supervisor itself is SIGKILLed with the group
NO_LIMITS = Limits()
STOP, TIMEOUT, FIRST_METRIC = "stop", "timeout", "first_metric"  # Ended.stopped


def train_command(spec: Any, overrides: Sequence[str], tags: dict[str, str]) -> list[str]:
    """`rlvrlab train` of one seed run, as argv (no shell): through torchrun with launcher.nproc ranks when > 1."""
    train = ["-m", "rlvrlab.cli.main", "train", *([spec.experiment] if spec.experiment else []), *overrides,
             *(f"--tag={key}={value}" for key, value in tags.items()),
             *(spec.testbed.options() if spec.testbed is not None else [])]
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


def run_seed_child(sweep: Any, client: Any, number: int, seed: int, overrides: Sequence[str], tags: dict[str, str],
                   trial_run: str) -> tuple[Optional[str], Optional[float], Optional[str]]:
    """One seed of trial `number` as a child `rlvrlab train` (sweep: an opened rlvrlab.sweep.study.Sweep): (its
    MLflow run, its objective, None) or (its run or None, None, why it failed: one line, ending with its log).
    The run's status is the one rlvrlab decides: FAILED with the reason for a failure or a limit (seed_timeout,
    first_metric_within); KILLED, and KeyboardInterrupt raised, when the worker was asked to stop."""
    spec = sweep.spec
    log = log_path(sweep.output_dir, spec.name, number, seed)

    def find() -> Optional[str]:
        return child_run(client, sweep.experiment_id, trial_run, seed)

    def first_metric() -> bool:
        run_id = find()
        return run_id is not None and bool(client.get_run(run_id).data.metrics)

    try:
        ended = run_process(train_command(spec, overrides, tags), child_env(spec.launcher.nproc),
                            limits=spec.launcher.limits, log=log, first_metric=first_metric)
    except BaseException:  # a second signal: the child is gone; its run ends KILLED
        end_stopped(client, _quietly(find), log, signalled=True)
        raise
    run_id = find()
    if stop_requested() is not None:
        end_stopped(client, run_id, log, signalled=ended.stopped == STOP)
        raise_if_stop_requested()
    reason = None
    if ended.stopped is not None:
        reason = limit_reason(ended, spec.launcher.limits, "the seed run's process",
                              f"its MLflow run {run_id}" if run_id else "no MLflow run under its trial yet",
                              sweep.mlflow_uri)
    elif ended.returncode != 0:
        reason = failure_reason(ended.returncode, ended.tail)
    elif run_id is None:
        reason = "the seed run's process ended without an MLflow run under its trial"
    if run_id is not None:
        attach_log(client, run_id, log)
    return settle(client, run_id, spec.objective, reason, log)


def settle(client: Any, run_id: Optional[str], objective: Any, reason: Optional[str], log: Optional[Path] = None,
           chars: int = T.FAIL_REASON_CHARS) -> tuple[Optional[str], Optional[float], Optional[str]]:
    """A seed run's end as rlvrlab decides it: where nothing failed, its objective (a rlvrlab.sweep.objective.
    Objective) read back and tagged; else (or with no objective, or a non-finite one) its run ends FAILED with the
    reason (and its log; a reason its own process gave stays). (run, objective, None) or (run, None, reason)."""
    if reason is None and run_id is not None:
        try:
            value = objective_of(client, run_id, objective.metric, objective.window)
            client.set_tag(run_id, T.OBJECTIVE, format_value(value))
            return run_id, value, None
        except RlvrlabError as error:
            reason = str(error)
    reason = f"{reason}; log: {log}" if log is not None else str(reason)
    if run_id is not None:
        run = client.get_run(run_id)
        if run.info.status != "FAILED" or T.FAIL_REASON not in run.data.tags:  # the process's own reason stays
            client.set_tag(run_id, T.FAIL_REASON, reason[:chars])
            client.set_terminated(run_id, status="FAILED")
    return run_id, None, reason


def child_run(client: Any, experiment_id: str, trial_run: str, seed: int) -> Optional[str]:
    """The MLflow run a child `rlvrlab train` made for this seed under its trial, once it has one."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`{T.PARENT}` = '{trial_run}' and "
                                                              f"tags.seed = '{seed}'", max_results=1)
    return found[0].info.run_id if found else None


@dataclass(frozen=True)
class Ended:
    """How a child process (and its whole process tree) ended."""

    returncode: int  # negative: the signal that ended it
    tail: list[str]  # the last lines of its stderr
    stopped: Optional[str] = None  # rlvrlab stopped it: STOP (the worker's stop passed on), TIMEOUT or FIRST_METRIC
    log: Optional[Path] = None  # its stdout and stderr


def run_process(argv: Sequence[str], env: dict[str, str], cwd: Optional[str] = None, *, limits: Limits = NO_LIMITS,
                log: Optional[Path] = None, first_metric: Optional[Callable[[], bool]] = None) -> Ended:
    """Run a child process tree (no stdin) and wait for it, under a supervisor (rlvrlab.sweep.supervisor) that
    leads its own process group and session, so that nothing the command starts outlives it or this worker, even
    SIGKILLed. stdout and stderr go to `log` (capped: rlvrlab.sweep.seedlog) and stderr's last lines come back.

    It is stopped (its group gets SIGTERM, or SIGINT for Ctrl-C; SIGKILL after limits.stop_grace) when this worker
    is asked to stop (rlvrlab.procs: Ended.stopped STOP; the caller ends the run KILLED and then calls
    raise_if_stop_requested), after limits.seed_timeout seconds (TIMEOUT), or when `first_metric()` (polled every
    few seconds) is still False limits.first_metric_within seconds after the start (FIRST_METRIC). An exception in
    this worker (a second Ctrl-C) kills the whole tree at once and is raised."""
    supervisor = [sys.executable, "-I", "-S", str(SUPERVISOR), str(os.getpid()), f"{limits.stop_grace:g}", *argv]
    capped = CappedLog(log) if log is not None else None
    pipes = [os.pipe(), os.pipe()]  # stdout, stderr: read in chunks by two threads (seedlog.pump)
    try:
        proc = subprocess.Popen(supervisor, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=pipes[0][1],
                                stderr=pipes[1][1], start_new_session=True)
    except BaseException:
        for read, write in pipes:
            os.close(read)
            os.close(write)
        if capped is not None:
            capped.close()
        raise
    for _, write in pipes:
        os.close(write)
    kept = bytearray()
    readers = [threading.Thread(target=pump, args=(pipes[0][0], capped), name="rlvrlab-child-stdout", daemon=True),
               threading.Thread(target=pump, args=(pipes[1][0], capped, kept), name="rlvrlab-child-stderr",
                                daemon=True)]
    for reader in readers:
        reader.start()
    stopped = None
    try:
        stopped = _wait(proc, limits, first_metric)
    finally:
        if proc.poll() is None:  # an exception in this worker (a second signal, a job's time limit): no orphan
            _end_now(proc)
        for reader in readers:
            reader.join(timeout=10)
        if capped is not None:
            capped.close()
    return Ended(proc.returncode, seedlog.last_lines(bytes(kept)), stopped, log)


def _wait(proc: subprocess.Popen, limits: Limits, first_metric: Optional[Callable[[], bool]]) -> Optional[str]:
    started = time.monotonic()
    stopped, signalled = None, None
    within = limits.first_metric_within if first_metric is not None else None
    every = min(METRIC_POLL_SECONDS, max(0.5, (within or 0) / 5))
    seen, next_probe = within is None, started + every
    while proc.poll() is None:
        now = time.monotonic()
        if signalled is None:
            asked, sig = stop_requested(), int(signal.SIGTERM)
            if asked is not None:
                stopped, sig = STOP, asked
            elif limits.seed_timeout is not None and now - started >= limits.seed_timeout:
                stopped = TIMEOUT
            elif not seen and now >= next_probe:
                assert within is not None and first_metric is not None
                seen = _quietly(first_metric) is True
                if not seen and now - started >= within:
                    stopped = FIRST_METRIC
                next_probe = min(now + every, started + within)
            if stopped is not None:
                signalled = now
                _signal_group(proc, sig)
        elif now - signalled > limits.stop_grace + BACKSTOP_SECONDS:  # the supervisor did not end the tree
            _signal_group(proc, signal.SIGKILL)
        time.sleep(POLL_SECONDS)
    return stopped


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the supervisor is not reaped yet (proc.poll() was None): its group is this one
    except ProcessLookupError:
        pass


def _end_now(proc: subprocess.Popen) -> None:
    """Stop the whole tree at once: SIGTERM to the group (so that the command hears it), SIGUSR1 to the supervisor
    (SIGKILL to everything left), then SIGKILL to the group if the supervisor is stuck."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.send_signal(signal.SIGUSR1)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _quietly(probe: Callable[[], Any]) -> Any:
    """A probe of the MLflow store: None when the store does not answer now (a limit then counts it as no answer)."""
    try:
        return probe()
    except Exception:  # noqa: BLE001 - the store's trouble is the seed's own outcome to report, not the worker's
        return None


def limit_reason(ended: Ended, limits: Limits, what: str, where: str, mlflow_uri: str) -> str:
    """Why a seed rlvrlab stopped on a limit failed (without its log)."""
    how = how_it_ended(ended.returncode)
    if ended.stopped == TIMEOUT:
        return f"{what} timed out after {limits.seed_timeout:g} s (seed_timeout) and was stopped ({how})"
    return (f"{what} logged no metric within {limits.first_metric_within:g} s (first_metric_within): {where} has "
            "none; usually the trainer opened its own MLflow run instead of attaching to MLFLOW_RUN_ID, or it cannot "
            f"reach MLflow at {mlflow_uri} from inside it; stopped ({how})")


def end_stopped(client: Any, run_id: Optional[str], log: Optional[Path], *, signalled: bool) -> None:
    """A seed rlvrlab stopped (a signal to the sweep, fail-fast) ends KILLED, whatever status its own process gave
    its run on the way out (a script's `with mlflow.start_run()` ends it FAILED on KeyboardInterrupt): a resumed
    study re-runs it. A run its process ended by itself before the stop reached it keeps its status."""
    if run_id is None:
        return
    try:
        if log is not None:
            attach_log(client, run_id, log)
        if signalled or client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, status="KILLED")
    except Exception:  # noqa: BLE001 - the store's trouble: the liveness check of the next invocation closes it
        pass


def attach_log(client: Any, run_id: str, log: Path) -> None:
    """The seed's log as an artifact of its run (`logs/<file>`); best effort: the file stays where it is."""
    try:
        if log.exists():
            client.log_artifact(run_id, str(log), artifact_path="logs")
    except Exception:  # noqa: BLE001, S110 - an artifact store that refuses: the reason names the file on disk
        pass


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
