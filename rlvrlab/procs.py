"""Process signals: SIGTERM stops rlvrlab the way Ctrl-C does, and child processes do not outlive their parent."""

from __future__ import annotations

import signal
import sys


def stop_on_sigterm() -> None:
    """Make SIGTERM (`kill`, a scheduler's time limit, a sweep stopping its workers) raise KeyboardInterrupt in the
    main thread, as Ctrl-C does: the run in progress ends KILLED in MLflow, its checkpoints stay, and a sweep's
    interrupted trial is re-run by the next invocation. After the first SIGINT or SIGTERM, further SIGTERMs are
    ignored so that this cleanup finishes (a second Ctrl-C still interrupts it)."""

    def handler(signum, frame):  # noqa: ARG001 - the signal module's signature
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def die_with_parent(sig: int) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies (PR_SET_PDEATHSIG), so that a
    killed parent leaves no orphans training or writing records. Best effort elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG = 1
        except Exception:  # noqa: BLE001, S110 - best effort: without it an orphan runs to its natural end
            pass
