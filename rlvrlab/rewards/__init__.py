"""Verifiers: (response text, ground truth) -> `Verdict`, described by a `VerifierSpec` and looked up by name in
VERIFIERS (the only lookup: ``dataset.verifier`` names one of its keys). `rlvrlab.rewards.pool.RewardPool`
runs them: isolated ones in worker processes with a wall-clock timeout, the others in-process.

- ``exact``: the stripped response equals one of the '|'-separated ground truths (in-process).
- ``countdown``: the Countdown rules of `rlvrlab.rewards.countdown` (a bounded AST walk, in-process).
- ``pairs``: the pairs task's rules (`rlvrlab.rewards.pairs`: two given digits, ascending, odd sum; in-process).
- ``math``: math-verify equivalence (`rlvrlab.rewards.math`; isolated: sympy can take minutes on hostile input).
  Its extraction setting comes from ``dataset.math_extraction``; VERIFIERS holds the default ("boxed").
"""

from __future__ import annotations

from rlvrlab.rewards import math as _math, pairs as _pairs
from rlvrlab.rewards.base import REASONS, Verdict, VerifierSpec
from rlvrlab.rewards.countdown import countdown, same_answer as _countdown_same

__all__ = ["REASONS", "VERIFIERS", "Verdict", "VerifierSpec", "countdown", "exact", "verifier_spec"]


def exact(response: str, truth: str) -> Verdict:
    """1.0 when the stripped response equals one of the '|'-separated ground truths; answer: the stripped
    response (None when empty: reason "no_answer")."""
    answer = response.strip()
    if not answer:
        return Verdict(0.0, "no_answer")
    correct = answer in truth.split("|")
    return Verdict(float(correct), "correct" if correct else "wrong", answer)


def _exact_same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


VERIFIERS: dict[str, VerifierSpec] = {
    "exact": VerifierSpec(check=exact, same_answer=_exact_same, isolated=False),
    "countdown": VerifierSpec(check=countdown, same_answer=_countdown_same, isolated=False),
    "math": _math.spec("boxed"),
    "pairs": VerifierSpec(check=_pairs.pairs, same_answer=_pairs.same_answer, isolated=False),
}


def verifier_spec(name: str, *, math_extraction: str = "boxed") -> VerifierSpec:
    """VERIFIERS[name], with the settings that configure it applied (``math``: the extraction setting).
    KeyError for an unknown name, ValueError for an unknown setting."""
    spec = VERIFIERS[name]
    if name == "math" and math_extraction != "boxed":
        return _math.spec(math_extraction)
    return spec
