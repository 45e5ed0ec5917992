"""The supervisor of one seed's process tree, run by rlvrlab.sweep.launch.run_process as a script of its own
(`python -I -S supervisor.py WORKER_PID GRACE COMMAND...`: the standard library only, no rlvrlab import). It leads
a new session and process group and is the subreaper of the command's tree, so a seed's processes never outlive it,
nor the sweep (docs/sweeps.md, "Process trees"). Its protocol: it exits with the command's exit code (or dies of its
signal); a signal to the group reaches the command itself, and the supervisor SIGKILLs what is left GRACE seconds
later; SIGUSR1 from the worker means "kill everything now"; a dead worker (its parent pid changes) or the command's
end stops the rest of the tree the same way."""

from __future__ import annotations

import os
import signal
import sys
import time

POLL = 0.05
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux: the group is still signalled; orphans go to init
        pass


def _others() -> list[int]:
    """The processes of the seed other than this one: its process group, and children of this subreaper that left
    it (setsid)."""
    me, group, found = os.getpid(), os.getpgrp(), []
    try:
        names = os.listdir("/proc")
    except OSError:  # not Linux: the group alone
        return [-group]
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and (int(fields[1]) == me or int(fields[2]) == group):
            found.append(int(name))
    return found


def _signal_all(sig: int) -> None:
    for pid in _others():  # -group: os.kill signals the group (this process too, where nothing else can be seen)
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _say(text: str) -> None:
    try:
        os.write(2, f"rlvrlab: {text}\n".encode())
    except OSError:  # nobody reads the pipe any more (the worker died)
        pass


def main(argv: list[str]) -> None:
    worker, grace, command = int(argv[1]), float(argv[2]), argv[3:]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stopping: list[float] = []  # when a stop began; the SIGKILL comes GRACE seconds later
    now_please: list[bool] = []

    def on_stop(signum, frame) -> None:  # noqa: ARG001 - the signal module's signature
        if not stopping:
            stopping.append(time.monotonic())

    def on_kill(signum, frame) -> None:  # noqa: ARG001
        now_please.append(True)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGUSR1, on_kill)
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; an exec'd command expects the default
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # a supervisor that dies (OOM) takes the command along
        try:
            os.execvp(command[0], command)
        except OSError as error:
            _say(f"cannot run {command[0]}: {error}")
            os._exit(127)
    status = None
    killing = False
    while True:
        try:
            while True:
                pid, code = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid == child:
                    status = code
        except ChildProcessError:  # no descendant left
            if status is not None:
                break
        if os.getppid() != worker and not stopping:  # the worker died: stop the whole tree
            stopping.append(time.monotonic())
            _signal_all(signal.SIGTERM)
        elif status is not None and not stopping:  # the command ended and left processes behind
            stopping.append(time.monotonic())
            _signal_all(signal.SIGTERM)
        if stopping and (now_please or time.monotonic() - stopping[0] >= grace):
            if not killing:
                killing = True
                _say(f"the seed's processes are still running {grace:g} s after SIGTERM (stop_grace); SIGKILL")
            _signal_all(signal.SIGKILL)
        time.sleep(POLL)
    assert status is not None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the command's crash, not this process's: no core
            if sig != signal.SIGKILL:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv)
