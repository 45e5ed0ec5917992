"""Fail-fast: a sweep whose first seed runs fail the same way stops before it spends more seeds (docs/sweeps.md,
"When seed runs fail": the rule, what a signature is, what never counts, `--keep-going`).

The record lives in the study's storage (Optuna study user attrs), so that worker processes and jobs share it:
`rlvrlab.failfast.epoch` names the invocation (the parent sets it before its workers are given the study; empty
with --keep-going), each counted seed run adds one key `rlvrlab.failfast.<epoch>.<trial>.<seed>` (at most
FIRST_FAILURES failures and one success per invocation: after that the rule has decided) and a stop adds
`rlvrlab.failfast.<epoch>.stop`, which every worker checks before each seed run and each trial."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Optional

from rlvrlab.tracking import tags as T

FIRST_FAILURES = 2  # the first failed seed runs of an invocation that must share a signature to stop it
EPOCH = T.attr("failfast.epoch")
PREFIX = T.attr("failfast.")
STOP = "stop"

_HOW = re.compile(r"\((exit code -?\d+|killed by [^)]*)\)")
_NO_METRIC = re.compile(r"logged no ('[^']*'|\"[^\"]*\")")
_DIVERGED = re.compile(r"\b(nan|inf|non-?finite|not finite)\b", re.IGNORECASE)
_LOG = re.compile(r";\s*log:\s*\S+\s*$")
_NORMALISE = [
    (re.compile(r"(?:[A-Za-z]:)?(?:~|\.{1,2})?(?:/[^\s/:'\",;()\[\]]+)+/?"), "<path>"),  # paths
    (re.compile(r"\b[0-9a-f]{32}\b"), "<run>"),  # MLflow run ids
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b"), "<hex>"),  # commits, uuids, object ids
    (re.compile(r"\d+(\.\d+)?([eE][-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def signature(reason: str) -> Optional[str]:
    """The signature of a seed run's failure reason (see the module); None for a divergence, which never counts."""
    text = reason.strip()
    if _DIVERGED.search(text):
        return None
    missing = _NO_METRIC.search(text)
    if missing:
        return f"logged no {missing.group(1)}"
    how = _HOW.search(text)
    status = how.group(1) if how else ""
    rest = text[how.end():] if how else text
    rest = _LOG.sub("", rest.removeprefix(":").strip())
    last = [part.strip() for part in re.split(r" \| |\n", rest) if part.strip()]
    line = last[-1] if last else ""
    for pattern, replacement in _NORMALISE:
        line = pattern.sub(replacement, line)
    return f"{status}: {line.strip()}" if status else line.strip()


def arm(study: Any, enabled: bool) -> str:
    """A new invocation's epoch, recorded on the study before its workers start ("" with --keep-going)."""
    epoch = uuid.uuid4().hex[:12] if enabled else ""
    study.set_user_attr(EPOCH, epoch)
    return epoch


def epoch_of(study: Any) -> str:
    """The invocation a worker counts its seed runs for ("": fail-fast is off, e.g. work() called directly)."""
    return str(study.user_attrs.get(EPOCH) or "")


def stopped(study: Any, epoch: str) -> Optional[dict]:
    """The fail-fast stop of this invocation ({reason, signature, seeds}), or None."""
    if not epoch:
        return None
    found = study.user_attrs.get(f"{PREFIX}{epoch}.{STOP}")
    return found if isinstance(found, dict) else None


def record(study: Any, epoch: str, trial: int, seed: int, reason: Optional[str]) -> Optional[dict]:
    """Count one seed run of this invocation (reason None: it succeeded) and decide: the stop record when the rule
    stops the sweep (written on the study for the other workers), else None."""
    if not epoch:
        return None
    if reason is not None and signature(reason) is None:  # a divergence
        return None
    events = _events(study.user_attrs, epoch)
    if any(e.get("ok") for e in events) or sum(1 for e in events if not e.get("ok")) >= FIRST_FAILURES:
        return stopped(study, epoch)  # decided already: nothing more is recorded
    event: dict[str, Any] = {"ok": reason is None, "trial": trial, "seed": seed, "at": time.time()}
    if reason is not None:
        event.update(signature=signature(reason), reason=reason[:T.FAIL_REASON_CHARS])
    study.set_user_attr(f"{PREFIX}{epoch}.{trial}.{seed}", event)
    if reason is None:
        return None
    return _decide(study, epoch)


def _events(attrs: dict, epoch: str) -> list[dict]:
    start = f"{PREFIX}{epoch}."
    return sorted((v for k, v in attrs.items() if k.startswith(start) and not k.endswith(f".{STOP}")
                   and isinstance(v, dict)), key=lambda e: e.get("at", 0.0))


def _decide(study: Any, epoch: str) -> Optional[dict]:
    events = _events(study.user_attrs, epoch)
    failures = [e for e in events if not e.get("ok")][:FIRST_FAILURES]
    if len(failures) < FIRST_FAILURES or len({e.get("signature") for e in failures}) != 1:
        return None
    last = failures[-1]["at"]
    if any(e.get("ok") and e.get("at", 0.0) <= last for e in events):
        return None
    decided = stopped(study, epoch)
    if decided is not None:
        return decided
    stop = {"signature": failures[0]["signature"], "reason": failures[-1]["reason"],
            "seeds": [f"trial {e['trial']} seed {e['seed']}" for e in failures]}
    study.set_user_attr(f"{PREFIX}{epoch}.{STOP}", stop)
    return stop


def stop_line(stop: dict) -> str:
    """The one line a sweep stopped by fail-fast ends with."""
    return (f"sweep stopped by fail-fast: the first {len(stop['seeds'])} failed seed runs "
            f"({', '.join(stop['seeds'])}) failed the same way and none succeeded: {stop['reason']}; fix the cause, "
            "then run the same command with --retry-failed (the trials not run yet run then too), or add "
            "--keep-going to run every seed anyway")
