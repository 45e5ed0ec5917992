"""Verifiers: (response text, reference answer) -> reward in [0, 1], looked up by name in VERIFIERS."""

from __future__ import annotations

from collections.abc import Callable

Verifier = Callable[[str, str], float]

from rlvrlab.rewards.countdown import countdown  # noqa: E402


def exact(response: str, answer: str) -> float:
    """1.0 when the stripped response equals one of the '|'-separated reference answers, else 0.0."""
    return float(response.strip() in answer.split("|"))


VERIFIERS: dict[str, Verifier] = {
    "exact": exact,
    "countdown": countdown,
}
