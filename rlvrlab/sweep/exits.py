"""`rlvrlab sweep`'s exit codes (the table is in docs/sweeps.md):

    0    the study ran (or --status showed it) and none of its trials failed
    1    a usage or config error, a store that refused a write: one `error:` line, nothing (more) ran
    2    the sweep ran and some of the study's trials failed (a failed trial that --retry-failed re-ran counts by
         its retry): the failed trials are listed and --retry-failed re-runs them
    3    stopped by fail-fast (rlvrlab.sweep.failfast): the first seed runs failed the same way
    130  stopped by Ctrl-C (SIGINT), 143 by SIGTERM: 128 + the signal, as shells report it; the interrupted trials
         are re-enqueued and the same command continues the study
"""

from __future__ import annotations

import signal
from typing import Any, Optional

from rlvrlab.errors import RlvrlabError

OK, USAGE, FAILED, FAIL_FAST = 0, 1, 2, 3


def interrupted_code(signum: Optional[int]) -> int:
    """128 + the signal that stopped the sweep (130: Ctrl-C, 143: SIGTERM)."""
    return 128 + int(signum or signal.SIGINT)


class SweepExit(RlvrlabError):
    """A sweep that ends with one `error:` line and an exit code other than 1 (rlvrlab.cli.main prints it)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def outcome(opened: Any, *, status_only: bool = False) -> tuple[int, Optional[str]]:
    """The exit code of a sweep that returned, and the line that explains one other than 0."""
    from rlvrlab.sweep import failfast
    from rlvrlab.sweep.summary import failed_rows

    if status_only:
        return OK, None
    stop = failfast.stopped(opened.study, opened.epoch or "")
    if stop is not None:
        return FAIL_FAST, failfast.stop_line(stop)
    failed = failed_rows(opened)
    if failed:
        shown = "; ".join(f"trial {row.number}: {row.reason}" for row in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        return FAILED, (f"{len(failed)} trial{'s' if len(failed) != 1 else ''} of study {opened.spec.name!r} "
                        f"failed ({shown}{more})"[:3000]
                        + "; fix the cause, then run the same command with --retry-failed to re-run their failed "
                          "seeds")
    return OK, None
