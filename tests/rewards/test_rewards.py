"""Verifiers (rlvrlab.rewards) and the RewardPool that runs them.

- The UCPO probe (tests/vectors/ucpo_verifier_probe.json) through the ``math`` verifier in both math-verify
  argument orders. The UCPO repo calls ``verify(parsed response, parsed truth)``; rlvrlab calls the documented
  ``verify(gold, prediction)``. On the probe they disagree on one case only, ``ineq_pred_interval_gt``
  (response ``\\boxed{1<x<2}``, truth ``(1,2)``: UCPO 1, rlvrlab 0); the mirror case (response ``(1,2)``, truth
  ``1<x<2``: UCPO 0, rlvrlab 1) is a hand case below. tests/algorithms/test_reference_vectors.py checks the probe file
  case by case as well (parses and both scores).
- Hand cases: 1/2 vs 0.5, \\dfrac vs \\frac, boxed extraction, no answer, the extraction settings.
- The adversarial corpus tests/fixtures/adversarial_responses.jsonl, scored through the pool with a 2 s limit.
  Each line: name, truth, expect (1 only where the answer is genuinely correct), note, and either ``response``
  or ``build`` ([[text, repeat], ...], concatenated: how the megabyte inputs are stored compactly).
- The pool's guarantees: a hung item is killed at the limit without delaying the others, a verifier that
  raises or a worker that dies gives "error", the cache, both cores used.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rlvrlab.config.rules import CHOICES, validate
from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import ConfigError
from rlvrlab.rewards import VERIFIERS, Verdict, VerifierSpec, math as math_verifier, verifier_spec
from rlvrlab.rewards.pool import RewardPool

HERE = Path(__file__).parents[1]  # tests/
PROBE = json.loads((HERE / "vectors" / "ucpo_verifier_probe.json").read_text())["cases"]
CORPUS = [json.loads(line) for line in (HERE / "fixtures" / "adversarial_responses.jsonl").read_text().splitlines()]
TIMEOUT = 2.0
SLACK = 1.0  # kill, reap and respawn a worker, on a busy 2-core machine


def build(row: dict) -> str:
    return row["response"] if "response" in row else "".join(text * n for text, n in row["build"])


@pytest.fixture(scope="module")
def math_pool():
    with RewardPool("math", workers=2, timeout_s=TIMEOUT) as pool:
        yield pool


# ---------------------------------------------------------------- the UCPO probe, both argument orders


def test_probe_documented_order_through_the_pool(math_pool: RewardPool) -> None:
    verdicts = math_pool.score([c["response"] for c in PROBE], [c["ground_truth"] for c in PROBE])
    for case, verdict in zip(PROBE, verdicts):
        assert verdict.score == case["score_if_verify_called_gold_first"], case["name"]
        assert verdict.reason == ("correct" if verdict.score else "wrong"), case["name"]
        assert verdict.answer == case["parsed_response"][-1], case["name"]  # the normalised extracted text


def test_probe_reversed_order_reproduces_the_ucpo_repo() -> None:
    differ = set()
    for case in PROBE:
        ucpo = math_verifier.check_ucpo_order(case["response"], case["ground_truth"], "mathverify").score
        ours = math_verifier.check(case["response"], case["ground_truth"], "mathverify").score
        assert ucpo == case["ucpo_score"], case["name"]
        assert ours == case["score_if_verify_called_gold_first"], case["name"]
        if ucpo != ours:
            differ.add(case["name"])
    # The only probe case where the repo's reversed order changes the verdict (a relation against an interval).
    assert differ == {"ineq_pred_interval_gt"}


def test_reversed_order_mirror_case() -> None:
    """Response (1,2) against truth 1<x<2: the documented order accepts it, the UCPO repo's order does not."""
    assert math_verifier.check("\\boxed{(1,2)}", "1<x<2").score == 1.0
    assert math_verifier.check_ucpo_order("\\boxed{(1,2)}", "1<x<2").score == 0.0
    assert math_verifier.check("\\boxed{1<x<2}", "(1,2)").score == 0.0
    assert math_verifier.check_ucpo_order("\\boxed{1<x<2}", "(1,2)").score == 1.0


# ---------------------------------------------------------------- hand cases


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("\\boxed{1/2}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("The answer is $\\frac12$.", "0.5", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
        ("\\boxed{\\frac{3}{4}}", "\\dfrac{3}{4}", 1.0),
        ("\\boxed{0.76}", "\\frac{3}{4}", 0.0),
        ("<think>maybe 5</think> so \\boxed{6}", "6", 1.0),  # the box wins over earlier numbers
        ("\\boxed{5}", "x=5", 1.0),  # an assignment truth
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("\\boxed{843}", "\\boxed{843}", 1.0),  # an already boxed truth is not wrapped again
        ("\\boxed{843}", "$843$", 1.0),
        ("\\boxed{842}", "843", 0.0),
    ],
)
def test_hand_cases(response: str, truth: str, score: float) -> None:
    assert math_verifier.check(response, truth).score == score


def test_no_answer_and_wrong_reasons(math_pool: RewardPool) -> None:
    no, wrong, right = math_pool.score(["I could not solve it.", "\\boxed{7}", "\\boxed{6}"], ["6", "6", "6"])
    assert no == Verdict(0.0, "no_answer", None)
    assert wrong == Verdict(0.0, "wrong", "7")
    assert right == Verdict(1.0, "correct", "6")


def test_truths_are_wrapped_in_a_box() -> None:
    assert math_verifier.wrap_truth("\\frac{3}{4}") == "\\boxed{\\frac{3}{4}}"
    assert math_verifier.wrap_truth("\\boxed{7}") == "\\boxed{7}"
    assert math_verifier.wrap_truth("$7$") == "$7$"
    # unwrapped, \frac{3}{4} would not be found as LaTeX at all
    assert [str(x) for x in math_verifier.parse_truth("\\frac{3}{4}")] == ["3/4", "\\frac{3}{4}"]


def test_extraction_settings() -> None:
    response = "So \\boxed{6}. The final answer is 5"  # a box, then a "final answer is" anchor
    assert math_verifier.check(response, "6", "boxed").score == 1.0  # the box first
    assert math_verifier.check(response, "6", "mathverify").score == 0.0  # math-verify's default: the anchor
    assert math_verifier.check("I pick C", "C", "any").score == 1.0  # strings (multiple choice) only in "any"
    assert math_verifier.check("I pick C", "C", "boxed").reason == "no_answer"
    with pytest.raises(ValueError, match="unknown math extraction"):
        verifier_spec("math", math_extraction="latex")
    assert CHOICES["dataset.math_extraction"] == math_verifier.EXTRACTIONS


def test_same_answer(math_pool: RewardPool) -> None:
    pairs = [("\\frac{1}{2}", "0.5"), ("1", "2"), ("2\\sqrt{2}", "\\sqrt{8}"), ("x=5", "5"), ("7", "7")]
    assert math_pool.same_answer(pairs) == [True, False, True, True, True]
    assert VERIFIERS["math"].same_answer("\\frac{1}{2}", "0.5")


def test_registry() -> None:
    assert {"exact", "countdown", "math", "pairs"} <= set(VERIFIERS)  # with every task's own (tests/data/test_tasks.py)
    assert VERIFIERS["math"].isolated and not VERIFIERS["exact"].isolated and not VERIFIERS["countdown"].isolated
    assert not VERIFIERS["pairs"].isolated
    assert VERIFIERS["exact"].check("  b ", "a|b") == Verdict(1.0, "correct", "b")
    assert VERIFIERS["exact"].check("", "a").reason == "no_answer"
    with pytest.raises(KeyError):
        RewardPool("nope")


# ---------------------------------------------------------------- the adversarial corpus


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 30
    assert len({row["name"] for row in CORPUS}) == len(CORPUS)
    assert max(len(build(row)) for row in CORPUS) >= 1_000_000


@pytest.mark.slow
def test_adversarial_corpus(math_pool: RewardPool) -> None:
    """Every item finishes within the limit, scores 0 unless genuinely correct, and no payload ran."""
    pwned = [Path(f"/tmp/rlvrlab_PWNED_x{i}") for i in range(1, 8)]
    for path in pwned:
        path.unlink(missing_ok=True)
    responses = [build(row) for row in CORPUS]
    tic = time.perf_counter()
    verdicts = math_pool.score(responses, [row["truth"] for row in CORPUS])
    total = time.perf_counter() - tic
    timeouts = 0
    for row, verdict, seconds in zip(CORPUS, verdicts, math_pool.last_seconds):
        assert verdict.score == row["expect"], (row["name"], verdict)
        assert verdict.reason in ("correct", "wrong", "no_answer", "timeout"), (row["name"], verdict)
        assert seconds <= TIMEOUT + SLACK, (row["name"], seconds)
        assert verdict.answer is None or len(verdict.answer) <= math_verifier.MAX_ANSWER_CHARS + 3
        timeouts += verdict.reason == "timeout"
    assert timeouts >= 2  # the nested parentheses at least (minutes each without the pool)
    # two workers share the items: the hung ones cost about timeouts * limit / 2, the rest is quick
    assert total <= timeouts * TIMEOUT / 2 + 15, total
    assert not [p for p in pwned if p.exists()]


# ---------------------------------------------------------------- pool guarantees (custom verifiers)


def _misbehaving(response: str, truth: str) -> Verdict:
    if response == "hang":
        time.sleep(600)
    if response == "raise":
        raise RuntimeError("verifier bug")
    if response == "exit":
        os._exit(3)  # the worker dies mid-item (as on a segfault or an OOM kill)
    return Verdict(float(response == truth), "correct" if response == truth else "wrong", str(os.getpid()))


MISBEHAVING = VerifierSpec(check=_misbehaving, same_answer=lambda a, b: a == b, isolated=True)


def test_a_hung_item_does_not_delay_the_others() -> None:
    with RewardPool(MISBEHAVING, workers=2, timeout_s=TIMEOUT) as pool:
        responses = ["hang"] + [str(i) for i in range(40)]
        tic = time.perf_counter()
        verdicts = pool.score(responses, [str(i - 1) for i in range(41)])
        total = time.perf_counter() - tic
        assert verdicts[0] == Verdict(0.0, "timeout")
        assert all(v.score == 1.0 for v in verdicts[1:])
        assert max(pool.last_seconds[1:]) < 0.5  # the others ran on the other worker meanwhile
        assert TIMEOUT <= pool.last_seconds[0] <= TIMEOUT + SLACK
        assert total <= TIMEOUT + SLACK
        assert pool.score(["a"], ["a"])[0].score == 1.0  # the killed worker was replaced


def test_crashes_give_error_and_spare_the_batch() -> None:
    with RewardPool(MISBEHAVING, workers=2, timeout_s=TIMEOUT) as pool:
        verdicts = pool.score(["a", "raise", "b", "exit", "c"], ["a", "x", "b", "x", "x"])
        assert [v.reason for v in verdicts] == ["correct", "error", "correct", "error", "wrong"]
        assert [v.score for v in verdicts] == [1.0, 0.0, 1.0, 0.0, 0.0]
        assert pool.score(["raise"], ["x"])[0].reason == "error"  # errors are not cached: tried again
        assert pool.stats["respawns"] >= 1


def test_items_are_spread_over_all_workers() -> None:
    with RewardPool(MISBEHAVING, workers=2, timeout_s=TIMEOUT) as pool:
        verdicts = pool.score([str(i) for i in range(1000)], [str(i) for i in range(1000)])
        assert all(v.score == 1.0 for v in verdicts)
        assert len({v.answer for v in verdicts}) == 2  # two worker pids
        pids = [w.process.pid for w in pool._pool]
    for pid in pids:  # closed: the workers are gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_cache_and_in_process_verifiers() -> None:
    pool = RewardPool("countdown", cache_size=2)
    answer = "target=22;numbers=3,5,7"
    first = pool.score(["3*5+7", "7+5*3", "3*5+7"], [answer] * 3)
    assert [v.score for v in first] == [1.0, 1.0, 1.0] and first[0].form == first[1].form == "3*5+7"
    assert not pool._pool  # in-process: no worker started
    assert pool.score(["3*5+7"], [answer])[0] == first[0]
    assert pool.stats["cache_hits"] == 1
    pool.score(["1", "2"], [answer] * 2)  # evicts the older entries (LRU of 2)
    assert len(pool._cache) == 2
    pool.close()


def test_workers_start_lazily_and_restart_after_close() -> None:
    pool = RewardPool("math", workers=2, timeout_s=TIMEOUT)
    assert not pool._pool  # nothing started at construction
    assert pool.score(["\\boxed{1}"], ["1"])[0].score == 1.0
    assert len(pool._pool) == 1  # no more workers than items
    pool.close()
    assert not pool._pool
    assert pool.score(["\\boxed{2}"], ["1"])[0].reason == "wrong"
    pool.close()


# ---------------------------------------------------------------- config


def test_config_fields_and_rules() -> None:
    cfg = RunConfig()
    assert (cfg.dataset.math_extraction, cfg.dataset.verifier_timeout, cfg.dataset.verifier_workers) == ("boxed", 5.0, 0)
    for field, value, message in [("verifier_timeout", 0.0, "out of range"), ("verifier_workers", -1, "out of range"),
                                  ("math_extraction", "latex", "unknown dataset.math_extraction")]:
        bad = RunConfig()
        setattr(bad.dataset, field, value)
        with pytest.raises(ConfigError, match=message):
            validate(bad)
    bad = RunConfig()
    bad.dataset.math_extraction = "any"  # only the math verifier reads it
    with pytest.raises(ConfigError, match="has no effect"):
        validate(bad)


def test_training_builds_the_pool_from_the_dataset_config() -> None:
    from rlvrlab.components import reward_pool

    cfg = RunConfig()
    cfg.dataset.verifier, cfg.dataset.math_extraction = "math", "mathverify"
    cfg.dataset.verifier_timeout, cfg.dataset.verifier_workers = 1.5, 1
    pool = reward_pool(cfg.dataset)
    assert (pool.workers, pool.timeout_s) == (1, 1.5)
    assert pool.spec.check.keywords == {"extraction": "mathverify"}
    assert not pool._pool
