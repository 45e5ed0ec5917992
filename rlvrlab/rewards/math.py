"""The math verifier: math-verify (Hugging Face) parses the response and the ground truth and compares them.

Argument order. math-verify's ``verify(gold, target)`` is asymmetric (assignments such as ``x=5`` are simplified
only on the gold side, and a relation such as ``1<x<2`` is compared with an interval only when the *prediction*
is the set). rlvrlab calls it in the documented order, ``verify(parsed ground truth, parsed response)``. The UCPO
repo (``ucpo/trainer/fn_score.py::compute_score``, also what its training uses) passes the response as gold; with
math-verify 0.9.0 that changes the verdict on relations against intervals:

- response ``\\boxed{1<x<2}``, truth ``(1,2)``: UCPO 1, rlvrlab 0 (probe case ``ineq_pred_interval_gt``);
- response ``\\boxed{(1,2)}``, truth ``1<x<2``: UCPO 0, rlvrlab 1.

Every other case of tests/vectors/ucpo_verifier_probe.json scores the same in both orders
(tests/rewards/test_rewards.py).

Ground truths. A truth with neither ``$`` nor ``\\boxed`` is wrapped as ``\\boxed{...}`` before parsing (as
the UCPO repo does). Datasets store bare LaTeX (``\\frac{3}{4}``, ``(1,2)``, ``x=5``); without a delimiter
math-verify's LaTeX extractor finds nothing, and the plain-expression extractor would take a fragment (the
``3`` of ``\\frac{3}{4}``) or nothing. Inside ``\\boxed{}`` the whole string is one LaTeX expression.

Timeouts. math-verify's own timeouts (``parsing_timeout``, ``timeout_seconds``) use ``signal.alarm``: they fail
off the main thread and re-arm process-wide alarms. They are disabled here; the wall clock is enforced by
`rlvrlab.rewards.pool.RewardPool`, which runs this verifier in worker processes and kills a worker that runs
past the limit. Called directly, `check` has no time limit (10k nested parentheses take over a minute).

Extraction settings (``dataset.math_extraction``), what is looked for in the response:

- ``boxed``: LaTeX with ``\\boxed{}`` matched first (priority 0), then "final answer is ..." anchors and other
  LaTeX; plain expressions (``843``, ``1/2``) as a fallback. The default.
- ``mathverify``: math-verify's own defaults (LaTeX with ``\\boxed`` at priority 50, after the "final answer"
  anchors, + plain expressions): exactly what the UCPO repo parses with.
- ``any``: as ``mathverify`` plus literal strings (multiple-choice letters A-D, lower-cased).

The ground truth is parsed with the same setting (it is boxed, so ``\\boxed`` always wins for it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from rlvrlab.rewards.base import Verdict, VerifierSpec

EXTRACTIONS = ("boxed", "mathverify", "any")
MAX_ANSWER_CHARS = 1000  # a longer extracted answer is cut (a degenerate response must not fill the cache)


@functools.cache
def _mv():
    """math_verify, imported on first use (about 1 s) with its "timeout disabled" warnings silenced: the
    pool owns the timeout."""
    import math_verify
    import math_verify.grader
    import math_verify.parser

    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@functools.cache
def extraction_config(extraction: str) -> tuple:
    """The math-verify extraction targets of a named setting (see the module docstring)."""
    mv = _mv()
    if extraction == "boxed":
        return (mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig())
    if extraction == "mathverify":
        return (mv.LatexExtractionConfig(), mv.ExprExtractionConfig())
    if extraction == "any":
        return (mv.LatexExtractionConfig(), mv.ExprExtractionConfig(), mv.StringExtractionConfig())
    raise ValueError(f"unknown math extraction {extraction!r}; expected one of {', '.join(EXTRACTIONS)}")


def wrap_truth(truth: str) -> str:
    """``\\frac{3}{4}`` -> ``\\boxed{\\frac{3}{4}}``; a truth that already has ``$`` or ``\\boxed`` is kept."""
    return truth if ("$" in truth or "\\boxed" in truth) else "\\boxed{" + truth + "}"


def parse_response(response: str, extraction: str = "boxed") -> list:
    """math-verify's parse of a response ([] when nothing is found), with its internal timeout disabled."""
    return _mv().parse(response, extraction_config(extraction), parsing_timeout=None)


@functools.lru_cache(maxsize=4096)  # a ground truth is parsed once per group, not once per response
def parse_truth(truth: str, extraction: str = "boxed") -> list:
    return _mv().parse(wrap_truth(truth), extraction_config(extraction), parsing_timeout=None)


def equivalent(gold: Sequence, prediction: Sequence) -> bool:
    """math-verify's ``verify`` in its documented order (gold first), internal timeout disabled."""
    return bool(_mv().verify(list(gold), list(prediction), timeout_seconds=None))


def answer_text(parsed: Sequence) -> str | None:
    """The extracted answer as normalised text: math-verify's normalised LaTeX / expression string (the last,
    string element of a parse), else ``str`` of the parsed object; None when nothing was extracted."""
    if not parsed:
        return None
    last = parsed[-1]
    text = last if isinstance(last, str) else str(parsed[0])
    return text if len(text) <= MAX_ANSWER_CHARS else text[:MAX_ANSWER_CHARS] + "..."


def check(response: str, truth: str, extraction: str = "boxed") -> Verdict:
    """Score 1.0 when the answer extracted from `response` is equivalent to `truth` (documented order)."""
    prediction = parse_response(response, extraction)
    if not prediction:
        return Verdict(0.0, "no_answer")
    correct = equivalent(parse_truth(truth, extraction), prediction)
    return Verdict(float(correct), "correct" if correct else "wrong", answer_text(prediction))


def check_ucpo_order(response: str, truth: str, extraction: str = "mathverify") -> Verdict:
    """As the UCPO repo scores: ``verify(parsed response, parsed truth)`` (response as gold). For comparisons
    and the reference-vector tests only; training uses `check`."""
    prediction = parse_response(response, extraction)
    if not prediction:
        return Verdict(0.0, "no_answer")
    correct = bool(_mv().verify(prediction, parse_truth(truth, extraction), timeout_seconds=None))
    return Verdict(float(correct), "correct" if correct else "wrong", answer_text(prediction))


def same_answer(a: str, b: str, extraction: str = "boxed") -> bool:
    """Are two extracted answers (`Verdict.answer` texts) equivalent? Each is parsed as a ground truth and
    math-verify must accept them in both orders (symmetric, so maj@k groups do not depend on order)."""
    if a == b:
        return True
    pa, pb = parse_truth(a, extraction), parse_truth(b, extraction)
    if not pa or not pb:
        return False
    return equivalent(pa, pb) and equivalent(pb, pa)


@functools.cache
def warm_up() -> None:
    """Import math-verify and its LaTeX parser and compile its patterns (once; about 1-2 s)."""
    for extraction in EXTRACTIONS:
        check("$x = \\frac{1}{2}$, so \\boxed{\\frac{1}{2}}", "0.5", extraction)


def spec(extraction: str = "boxed") -> VerifierSpec:
    """The math VerifierSpec for an extraction setting (picklable: module functions and partials)."""
    if extraction not in EXTRACTIONS:
        raise ValueError(f"unknown math extraction {extraction!r}; expected one of {', '.join(EXTRACTIONS)}")
    return VerifierSpec(check=functools.partial(check, extraction=extraction),
                        same_answer=functools.partial(same_answer, extraction=extraction), isolated=True)
