"""The pairs task: the verifier agrees with its own list of correct answers on the whole answer space, problems
are distinct and fixed by the seed, and the warm-start targets have the shares the task promises."""

import itertools

import pytest

from rlvrlab.data.pairs import CORRECT_SHARE, make_problems, warm_start_targets
from rlvrlab.rewards import VERIFIERS
from rlvrlab.rewards.pairs import correct_answers, pairs, preferred_pair


@pytest.mark.parametrize("level", [1, 2])
def test_the_listed_answers_are_exactly_what_the_verifier_accepts(level: int) -> None:
    for problem in make_problems(30, seed=0, level=level):
        listed = set(correct_answers(problem.answer))
        accepted = {f"{a} {b}" for a, b in itertools.product(range(10), repeat=2)
                    if pairs(f"{a} {b}", problem.answer).score == 1.0}
        assert listed == accepted
        assert len(listed) == (1 if level == 2 else len(listed)) and (level == 2 or len(listed) >= 8)


def test_verdicts_and_malformed_input() -> None:
    truth = "digits=8,3,0,5,9,2,7,4"
    assert pairs("3 8", truth).reason == "correct" and pairs(" 3 8\n", truth).score == 1.0
    assert pairs("8 3", truth).reason == "wrong"  # not ascending
    assert pairs("3 7", truth).reason == "wrong"  # even sum
    assert pairs("1 2", truth).reason == "wrong"  # 1 is not given
    assert pairs("3,8", truth).reason == "no_answer" and pairs("", truth).reason == "no_answer"
    assert pairs("3 8", "digits=1,1").reason == "error" and pairs("3 8", "garbage").reason == "error"
    assert preferred_pair((8, 3, 0, 5, 9, 2, 7, 4)) == "0 3"
    assert pairs("0 3", truth + ";only=preferred").score == 1.0 and pairs("3 8", truth + ";only=preferred").score == 0
    assert "pairs" in VERIFIERS and not VERIFIERS["pairs"].isolated


def test_problems_are_distinct_and_seeded() -> None:
    a, b = make_problems(200, seed=0), make_problems(200, seed=0)
    assert [p.prompt for p in a] == [p.prompt for p in b]
    assert len({p.prompt for p in a}) == 200
    assert [p.prompt for p in make_problems(50, seed=0, level=2)] == [p.prompt for p in a[:50]]
    with pytest.raises(ValueError, match="level"):
        make_problems(3, seed=0, level=3)


def test_warm_start_targets_are_skewed_and_mixed() -> None:
    for problem in make_problems(20, seed=0):
        targets = warm_start_targets(problem)
        correct = correct_answers(problem.answer)
        share = sum(t in correct for t in targets) / len(targets)
        assert share == pytest.approx(CORRECT_SHARE, abs=0.05)
        top = targets.count(correct[0]) / sum(t in correct for t in targets)
        assert top > 0.4 and all(targets.count(c) >= 1 for c in correct)  # skewed, but every answer reachable
    control = make_problems(5, seed=0, level=2)
    assert [warm_start_targets(p) for p in control] == [warm_start_targets(p) for p in make_problems(5, seed=0)]
