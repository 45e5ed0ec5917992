"""Process signals: SIGTERM stops rlvrlab the way Ctrl-C does, at a safe point, and child processes do not outlive
their parent."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

_graceful = 0  # depth of stop_at_safe_points() sections in this process
_requested: int | None = None  # the signal that asked for a stop, once one did
_stopping_now = False  # a second signal raised KeyboardInterrupt in a section: its cleanup is not interrupted again
_announce = True  # print the stop message (the one process a user signalled; its workers stay quiet)
_exit_code: int | None = None  # set by exit_now: the code a process that skips its teardown ends with


def signal_name(signum: int | None) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else "SIGTERM" if signum == signal.SIGTERM else f"signal {signum}"


def install_stop_handlers(*, announce: bool = True) -> None:
    """SIGTERM (`kill`, a scheduler's time limit, a sweep stopping its workers) and SIGINT (Ctrl-C) stop the process.

    Inside a stop_at_safe_points() section (a training loop, a sweep worker) the first one only sets a flag that
    the section checks at its safe points (between steps, between trials), so that no record or checkpoint is
    interrupted half-written: the run then ends KILLED in MLflow with its checkpoints kept, a sweep's trial is
    re-enqueued. A second one, or one outside such a section, raises KeyboardInterrupt at once. Once a stop is under
    way, later signals are ignored, so that the cleanup it started (the MLflow run ended KILLED with every step
    trained so far, the message naming the checkpoint) runs to its end.

    announce: print the one stop message (naming the signal); worker processes of a sweep stay quiet, their parent
    speaks for them."""
    global _announce
    _announce = announce

    def handler(signum, frame):  # noqa: ARG001 - the signal module's signature
        global _requested, _stopping_now
        if _graceful and _requested is None:
            _requested = signum
            if _announce:
                print(f"rlvrlab: {signal_name(signum)} received: stopping at the end of this step (Ctrl-C again to "
                      "stop now)", file=sys.stderr, flush=True)
            return
        if _stopping_now or (_requested is not None and not _graceful):
            return  # already stopping: the records are being written, or the process is on its way out
        if _graceful:
            _stopping_now = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup that follows runs to its end
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@contextmanager
def stop_at_safe_points() -> Iterator[None]:
    """A section that checks stop_requested() at its safe points (see install_stop_handlers)."""
    global _graceful, _stopping_now
    _graceful += 1
    try:
        yield
    finally:
        _graceful -= 1
        if not _graceful:
            _stopping_now = False


def stop_requested() -> int | None:
    """The signal (SIGINT or SIGTERM) that asked this process to stop, or None."""
    return _requested


def raise_if_stop_requested() -> None:
    """A safe point: raise KeyboardInterrupt when a stop was asked for (the cleanup that follows is not interrupted
    by a second signal)."""
    global _stopping_now
    if _requested is not None:
        _stopping_now = bool(_graceful)
        raise KeyboardInterrupt


def ignore_further_signals() -> None:
    """The process is on its way out after a stop: a late Ctrl-C or SIGTERM must not kill it half-way through its
    exit (Python restores the default handlers at shutdown; ignored signals stay ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def die_with_parent(sig: int) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies (PR_SET_PDEATHSIG), so that a
    killed parent leaves no orphans training or writing records. Best effort elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG = 1
        except Exception:  # noqa: BLE001, S110 - best effort: without it an orphan runs to its natural end
            pass


def end_without_teardown() -> None:
    """Make this process, once it ends through exit_now, skip the interpreter's teardown of torch, MLflow and
    Optuna (~1-1.3 s of CPU a process, bench/README.md "The full toy grid"), which a sweep's wall time would wait for
    at its end, once per worker and on the same cores as the last trials. Only sweep worker processes call it
    (rlvrlab.sweep.spawned); every other process exits normally.

    Call it first thing in the process: atexit runs its handlers in reverse order of registration, so the one
    registered here runs after every handler registered later (MLflow's, Optuna's, torch's, logging's flush of
    handlers created since) and then ends the process with os._exit, as multiprocessing ends its forked children.
    logging.shutdown, registered when logging was imported (before this), is called here; multiprocessing's own
    exit function has already run (its process bootstrap calls it before the interpreter exits)."""
    import atexit

    atexit.register(_end_after_handlers)


def _end_after_handlers() -> None:
    if _exit_code is None:  # an exit that did not come through exit_now: the interpreter's own teardown
        return
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(_exit_code)


def exit_now(code: int | str | None) -> NoReturn:
    """End this process with `code` (as SystemExit takes it: None is 0, a string is printed to stderr and is 1); in a
    process that called end_without_teardown, right after its atexit handlers. A signal that arrives while it is
    exiting (a stopped sweep ending a worker that is already on its way out) is ignored, so that no atexit handler
    is broken by a KeyboardInterrupt and its traceback; the exit goes on either way."""
    import threading

    global _exit_code
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    if threading.current_thread() is threading.main_thread():
        ignore_further_signals()
    _exit_code = code or 0
    sys.exit(_exit_code)


def quiet_library_bars() -> None:
    """No tqdm bars from transformers or huggingface_hub in this process or the processes it starts (a sweep's
    seed runs), unless the user set HF_HUB_DISABLE_PROGRESS_BARS. huggingface_hub reads that variable when it is
    first imported and transformers takes its initial setting from there (transformers.utils.logging); a library
    imported already is told through its public switch."""
    if "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
        return
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # turns huggingface_hub's bars off too
    elif "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
