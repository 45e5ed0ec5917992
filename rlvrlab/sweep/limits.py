"""A seed run's limits: how long it may run (`seed_timeout:`, or `--seed-timeout`), how soon its MLflow run must log
a first metric (`first_metric_within:`), and how long a stopped seed's processes get between SIGTERM and SIGKILL
(`stop_grace:`). They bound a process (a `launcher: process` child, a command sweep's command: rlvrlab.sweep.launch),
never a seed run inside the worker, so they need a launcher that runs processes.

Like the launcher they say how seeds run, not what they train: they are not part of the study's fingerprint, and a
study continues under other limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from rlvrlab.errors import ConfigError

KEYS = ("seed_timeout", "first_metric_within", "stop_grace")  # top-level keys of a sweep file
STOP_GRACE = 30.0  # default seconds between SIGTERM and SIGKILL of a stopped seed's processes
MAX_STOP_GRACE = 600.0  # a stopping sweep waits this long for each worker (rlvrlab.sweep.workers)
MAX_SECONDS = 1e9  # ~30 years: beyond any real run, and a float (inf and nan are refused)


@dataclass(frozen=True)
class Limits:
    """Seconds; None: no limit."""

    seed_timeout: Optional[float] = None  # a seed's processes are stopped after this long; the seed fails
    first_metric_within: Optional[float] = None  # ... or when its MLflow run has logged no metric by then
    stop_grace: float = STOP_GRACE  # SIGTERM, then SIGKILL of the whole process group after this long

    @property
    def any(self) -> bool:
        return self.seed_timeout is not None or self.first_metric_within is not None


def parse_limits(body: dict[str, Any], where: str, *, seed_timeout: Optional[float | str] = None,
                 launcher: str = "process") -> Limits:
    """The limits of a sweep file's top-level keys (KEYS), `--seed-timeout` (seed_timeout) over the file's; one
    ConfigError line for a value that is not a number of seconds, or for limits on the in-process launcher."""
    timeout = _seconds(body.get("seed_timeout"), "seed_timeout", where, positive=True)
    if seed_timeout is not None:
        timeout = _seconds(seed_timeout, "--seed-timeout", "", positive=True)
    first = _seconds(body.get("first_metric_within"), "first_metric_within", where, positive=True)
    grace = _seconds(body.get("stop_grace", STOP_GRACE), "stop_grace", where, positive=False)
    if grace is None or grace > MAX_STOP_GRACE:
        raise ConfigError(f"stop_grace in {where} must be a number of seconds from 0 to {MAX_STOP_GRACE:g}, "
                          f"e.g. stop_grace: {STOP_GRACE:g}")
    limits = Limits(timeout, first, grace)
    if limits.any and launcher == "inprocess":
        given = "seed_timeout" if timeout is not None else "first_metric_within"
        raise ConfigError(f"{given} in {where} needs a launcher that runs each seed as a process (launcher: process, "
                          "or --launcher process): a seed run inside the worker cannot be stopped on its own")
    return limits


def _seconds(value: Any, name: str, where: str, *, positive: bool) -> Optional[float]:
    if value is None:
        return None
    given = value
    if isinstance(value, str):  # --seed-timeout 90 arrives as a number; a file's "90" or "1h" does not
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0) or value > MAX_SECONDS:
        raise ConfigError(f"{name}{f' in {where}' if where else ''} must be a number of seconds "
                          f"{'> 0' if positive else '>= 0'} (at most "
                          f"{MAX_SECONDS:.0e}), e.g. {name.lstrip('-').replace('-', '_')}: 3600; got {given!r}")
    return float(value)
