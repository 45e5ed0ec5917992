"""What a verifier returns and how it is described; the process pool (rlvrlab.rewards.pool) runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

REASONS = ("correct", "wrong", "no_answer", "timeout", "error")


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one response against its ground truth.

    score:  the reward, in [0, 1].
    reason: one of REASONS ("timeout" comes from the pool only; "error" from the pool when a verifier raises or
            its worker dies, and from a verifier whose ground truth is malformed, e.g. countdown's).
    answer: the final answer extracted from the response as normalised text, None when there is none;
            maj@k groups responses by it (through VerifierSpec.same_answer).
    form:   the canonical form of the whole solution, for the diversity of correct answers (Countdown: the
            canonical equation); None means `answer`.
    """

    score: float
    reason: str
    answer: str | None = None
    form: str | None = None


@dataclass(frozen=True)
class VerifierSpec:
    check: Callable[[str, str], Verdict]  # (response, ground truth) -> Verdict; must never execute the response
    same_answer: Callable[[str, str], bool]  # are two extracted answers equivalent (maj@k grouping)
    isolated: bool = True  # run in worker processes with a wall-clock timeout (False: cheap and safe in-process)
