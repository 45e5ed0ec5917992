"""The unit of data every task produces and every verifier reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One prompt of a task.

    id:     stable identifier; the group id of the responses sampled for it.
    prompt: the question as text (before any template or chat template).
    answer: the reference the verifier checks a response against, in the task's own encoding
            (Countdown: "target=24;numbers=3,4,2,1"; toy: the correct response ids, "r0|r3").
    source: where the problem comes from, for per-source breakdowns: a verl file's data_source column, else the
            dataset's name (load_problems fills it in); "" when built outside load_problems.
    """

    id: str
    prompt: str
    answer: str
    source: str = ""
