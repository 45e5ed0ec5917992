"""Countdown: the verifier's rules and safety, the solution enumerator and the problem generator."""

import time

import pytest

from rlvrlab.data.countdown import (
    MIN_SOLUTIONS,
    make_problems,
    problem_solutions,
)
from rlvrlab.rewards import VERIFIERS
from rlvrlab.rewards.countdown import (
    canonical,
    countdown,
    format_answer,
    parse_answer,
    same_answer,
    solutions,
)

ANSWER = "target=22;numbers=3,5,7"


def score(response: str, answer: str) -> float:
    """The score of countdown's Verdict (the cases below were written against the score)."""
    verdict = countdown(response, answer)
    assert verdict.reason in ("correct", "wrong", "no_answer", "error")
    assert (verdict.score == 1.0) == (verdict.reason == "correct")
    return verdict.score


@pytest.mark.parametrize(
    "response, reward",
    [
        ("3*5+7", 1.0),  # correct
        ("7+5*3", 1.0),  # operand order is free
        ("(3*5)+7", 1.0),  # redundant parentheses are fine
        ("  3 * 5 + 7 \n", 1.0),  # whitespace around and inside
        ("3*5+7 = 22", 1.0),  # "expr = target" form
        ("3*5+7=22", 1.0),
        ("3*5+7 = 23", 0.0),  # stated result is not the target
        ("3*5+7 = 2x", 0.0),
        ("3*5+7 == 22", 0.0),
        ("3*5+7 = 22 = 22", 0.0),
        ("3*5-7", 0.0),  # wrong value
        ("3*5", 0.0),
        ("3*7+5-3", 0.0),  # 3 used twice (value 23 anyway) ...
        ("3*3+7+5+1", 0.0),  # ... and a reused number even when the value is right (3*3+7+5+1 = 22)
        ("2*11", 0.0),  # numbers not given
        ("22", 0.0),  # the target itself is not a given number
        ("7/(5-5)", 0.0),  # division by zero (and 5 reused)
        ("7/(3-3)+5", 0.0),
        ("-3+5*5", 0.0),  # 5 reused
        ("-(3-5)*7+8", 0.0),  # 8 not given
        ("5*(7-3)+7", 0.0),  # 7 reused
        ("(7*3)+5/5", 0.0),
        ("3.0*5+7", 0.0),  # floats are not integer literals
        ("3*5+7.", 0.0),
        ("3_0", 0.0),
        ("0x3*5+7", 0.0),
        ("3*5+7;", 0.0),
        ("3*5++7", 0.0),  # unary plus is not allowed (only unary minus)
        ("3**5", 0.0),  # power
        ("9**9**9", 0.0),
        ("7//3", 0.0),  # floor division
        ("7%3", 0.0),
        ("x", 0.0),  # a name
        ("abs(-22)", 0.0),  # a call
        ("__import__('os')", 0.0),
        ("__import__('os').system('true')", 0.0),
        ("", 0.0),
        ("   ", 0.0),
        ("()", 0.0),
        ("3*5+", 0.0),
        ("[3, 5, 7]", 0.0),
        ("lambda: 22", 0.0),
        ("3 5 7", 0.0),
        ("3*5+7 and 22", 0.0),
    ],
)
def test_verifier_cases(response: str, reward: float) -> None:
    assert score(response, ANSWER) == reward


def test_verifier_rational_arithmetic_unary_minus_and_repeats() -> None:
    assert score("8/(3-8/3)", "target=24;numbers=8,3,8,3") == 1.0  # needs exact fractions
    assert score("8/(3-8/3)", "target=24;numbers=8,3,8") == 0.0  # the second 3 is not given
    assert score("7/2*2", "target=7;numbers=7,2,2") == 1.0  # a number given twice may be used twice
    assert score("-3+5", "target=2;numbers=3,5") == 1.0  # unary minus is allowed
    assert score("--3+5", "target=8;numbers=3,5") == 1.0
    assert score("3+5", "target=8;numbers=3,5,7") == 1.0  # not all numbers need to be used
    assert score("7/2", "target=3;numbers=7,2") == 0.0  # 3.5 is not 3


def test_verifier_malformed_answers_score_zero() -> None:
    for answer in ["", "22", "target=22", "numbers=3,5", "target=x;numbers=3", "target=22;numbers=", "a=1;b=2"]:
        assert score("3*5+7", answer) == 0.0


def test_verifier_never_raises_on_odd_inputs() -> None:
    for response in ["\x00", "\u0663*5+7", "３*5+7", "(" * 30 + "3" + ")" * 30, "-" * 199 + "3", "1e9", "'22'"]:
        assert score(response, ANSWER) in (0.0, 1.0)
    assert score(None, ANSWER) == 0.0  # type: ignore[arg-type]
    assert score("3*5+7", None) == 0.0  # type: ignore[arg-type]


def test_verifier_refuses_deep_and_long_inputs_quickly() -> None:
    start = time.perf_counter()
    assert score("(" * 10_000 + "22" + ")" * 10_000, "target=22;numbers=22") == 0.0
    assert score("-" * 10_000 + "22", "target=22;numbers=22") == 0.0
    assert score("3+" * 5_000 + "3", "target=3;numbers=3") == 0.0
    assert score("(" * 60 + "22" + ")" * 60, "target=22;numbers=22") == 0.0  # short but > 50 deep
    assert score("(" * 10 + "22" + ")" * 10, "target=22;numbers=22") == 1.0
    assert time.perf_counter() - start < 1.0


def test_registered() -> None:
    spec = VERIFIERS["countdown"]
    assert spec.check is countdown and spec.same_answer is same_answer
    assert not spec.isolated  # a bounded AST walk: runs in-process


def test_verdict_reasons_answer_and_form() -> None:
    v = countdown("7+5*3", ANSWER)
    assert (v.score, v.reason, v.answer, v.form) == (1.0, "correct", "22", "3*5+7")
    assert countdown("(3*5)+7 = 22", ANSWER).form == "3*5+7"  # the same canonical equation
    v = countdown("3*5-7", ANSWER)
    assert (v.score, v.reason, v.answer, v.form) == (0.0, "wrong", "8", "3*5-7")
    assert countdown("7/2", "target=3;numbers=7,2").answer == "7/2"
    assert countdown("3*5+7 = 23", ANSWER).reason == "wrong"  # an expression with a wrong stated result
    assert countdown("3*3+7+5+1", ANSWER).reason == "wrong"  # the right value with reused numbers
    v = countdown("7/(3-3)+5", ANSWER)
    assert (v.reason, v.answer) == ("wrong", None)  # division by zero: no value reached
    for response in ["", "   ", "x", "abs(-22)", "__import__('os')", "3**5", "3*5+", "The answer is 22", None]:
        v = countdown(response, ANSWER)  # type: ignore[arg-type]
        assert (v.score, v.reason, v.answer, v.form) == (0.0, "no_answer", None, None), response
    assert countdown("3*5+7", "target=22").reason == "error"  # a malformed ground truth is not a wrong answer
    assert same_answer("22", "44/2") and not same_answer("22", "23") and same_answer("x", "x")


def test_answer_round_trip() -> None:
    assert parse_answer(ANSWER) == ((3, 5, 7), 22)
    assert format_answer((3, 5, 7), 22) == ANSWER


def test_solutions_hand_worked() -> None:
    assert solutions([3, 5, 7], 22) == ["3*5+7"]
    assert solutions([2, 4, 6], 12) == ["2*6", "2+4+6", "4*6/2", "6*(4-2)"]
    assert solutions([6, 4, 2], 12) == solutions([2, 4, 6], 12)  # order of the numbers does not matter
    assert "8/(3-8/3)" in solutions([8, 3, 8, 3], 24)
    assert solutions([2, 3, 5], 1000) == []


def test_canonical_identifies_reorderings_and_regroupings() -> None:
    assert canonical("7+5*3") == canonical("(3*5)+7") == canonical("5*3+7") == "3*5+7"
    assert canonical("6-(4-2)") == canonical("6+2-4") == canonical("2-4+6")
    assert canonical("4*6/2") == canonical("6/2*4") == canonical("4/(2/6)")
    assert canonical("6-4") != canonical("4-6")
    assert canonical("__import__('os')") is None


def test_make_problems_deterministic_and_well_formed() -> None:
    first = make_problems(200, seed=3)
    assert first == make_problems(200, seed=3)
    assert first != make_problems(200, seed=4)
    assert [p.id for p in first] == [f"countdown-{i}" for i in range(200)]
    assert len({(p.prompt, p.answer) for p in first}) == 200  # distinct problems
    assert make_problems(50, seed=3) == first[:50]  # a prefix does not depend on the count
    for p in first:
        numbers, target = parse_answer(p.answer)
        assert p.prompt == f"{' '.join(map(str, numbers))} -> {target}:"
        assert len(numbers) == 3 and target not in numbers
        assert len(p.prompt) <= 16


def test_solutions_all_verify_and_are_distinct() -> None:
    problems = make_problems(300, seed=0)
    counts = []
    for p in problems:
        sols = problem_solutions(p)
        counts.append(len(sols))
        assert len(set(sols)) == len(sols)
        assert len({canonical(s) for s in sols}) == len(sols)  # distinct even up to reordering
        for s in sols:
            assert canonical(s) == s
            assert score(s, p.answer) == 1.0, (p, s)
            assert score(f"{s} = {parse_answer(p.answer)[1]}", p.answer) == 1.0
    # Most (here: all) problems have several distinct correct answers.
    assert sum(c >= 2 for c in counts) >= 0.9 * len(counts)
    assert min(counts) >= MIN_SOLUTIONS


def test_solutions_are_complete_against_brute_force() -> None:
    """Every expression over the numbers that verifies has its canonical form among the solutions."""
    import itertools

    numbers, ops = (2, 4, 6), "+-*/"
    found: set[str] = set()
    for a, b, c in itertools.permutations(numbers):
        candidates = [f"{a}{o}{b}" for o in ops]
        for o1, o2 in itertools.product(ops, ops):
            candidates += [f"({a}{o1}{b}){o2}{c}", f"{a}{o1}({b}{o2}{c})"]
        for expr in candidates:
            if score(expr, format_answer(numbers, 12)) == 1.0:
                found.add(canonical(expr))
    assert found == set(solutions(numbers, 12))
