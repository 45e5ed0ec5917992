"""The pairs task's rules (rlvrlab.data.pairs generates its problems): pick two of the given digits whose sum is odd.

Ground truth: "digits=8,3,0,5,9,2,7,4" (the prompt's digits) or "digits=...;only=preferred" (the negative control of
results/protocols/ucpo_pairs.md: only the preferred pair counts, so every prompt has exactly one correct answer).
A correct response is "a b": two digits of the prompt, a < b, a + b odd, separated by one space (surrounding
whitespace is ignored). The answer space of a response that parses is every "a b" with digits a < b (45 strings),
so every correct answer is one string, and `correct_answers` lists them all: the probability the policy gives each
one is a teacher-forced forward pass (rlvrlab.policy.exact), which makes pass@1, q over the correct set and coverage
exact instead of sampled.

The preferred pair is the first correct pair in ascending order: the warm start prefers it
(rlvrlab.data.pairs.warm_start_targets), which gives the skewed start UCPO's claim is about.
"""

from __future__ import annotations

import re

from rlvrlab.rewards.base import Verdict

_RESPONSE = re.compile(r"(\d) (\d)")
ONLY_PREFERRED = "only=preferred"


def parse_truth(truth: str) -> tuple[tuple[int, ...], bool]:
    """(the prompt's digits, only the preferred pair counts); ValueError when malformed."""
    fields = truth.split(";")
    if not fields[0].startswith("digits=") or any(f != ONLY_PREFERRED for f in fields[1:]):
        raise ValueError(f"not a pairs ground truth: {truth!r}")
    digits = tuple(int(d) for d in fields[0].removeprefix("digits=").split(","))
    if len(set(digits)) != len(digits) or not all(0 <= d <= 9 for d in digits) or len(digits) < 2:
        raise ValueError(f"not a pairs ground truth: {truth!r}")
    return digits, ONLY_PREFERRED in fields[1:]


def preferred_pair(digits: tuple[int, ...]) -> str:
    """The first correct pair in ascending order (the smallest digit that is in one, with its smallest partner)."""
    return next(f"{a} {b}" for a in sorted(digits) for b in sorted(digits) if a < b and (a + b) % 2)


def correct_answers(truth: str) -> list[str]:
    """Every correct response string for this ground truth, in ascending order."""
    digits, only = parse_truth(truth)
    if only:
        return [preferred_pair(digits)]
    return [f"{a} {b}" for a in sorted(digits) for b in sorted(digits) if a < b and (a + b) % 2]


def pairs(response: str, truth: str) -> Verdict:
    """1.0 when `response` is one of `correct_answers(truth)`. reason "no_answer" when it is not "a b" with two
    digits, "wrong" when it is but breaks a rule, "error" when `truth` is malformed. Never raises."""
    try:
        digits, only = parse_truth(truth)
    except Exception:  # noqa: BLE001 - malformed reference answer: not the response's fault
        return Verdict(0.0, "error")
    match = _RESPONSE.fullmatch(response.strip()) if isinstance(response, str) else None
    if match is None:
        return Verdict(0.0, "no_answer")
    a, b = int(match[1]), int(match[2])
    text = f"{a} {b}"
    ok = a < b and a in digits and b in digits and (a + b) % 2 == 1
    if only:
        ok = ok and text == preferred_pair(digits)
    return Verdict(float(ok), "correct" if ok else "wrong", text, text)


def same_answer(a: str, b: str) -> bool:
    return a.strip() == b.strip()
