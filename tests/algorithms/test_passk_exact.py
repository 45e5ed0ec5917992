"""Exact metrics from the probabilities of every correct answer (rlvrlab.algorithms.passk.exact_metrics): a
hand-worked case, and agreement with the sampled estimators they replace (Monte Carlo, fixed seed)."""

import math

import numpy as np
import pytest

from rlvrlab.algorithms.passk import exact_metrics, exact_problem_metrics, pass_at_k


def test_a_hand_worked_problem() -> None:
    # two correct answers with p = 0.3 and 0.1: Z = 0.4, q = (0.75, 0.25)
    m = exact_problem_metrics([0.3, 0.1], ks=[4], group_size=2)
    assert m["pass_at_1"] == pytest.approx(0.4)
    assert m["pass_at_4"] == pytest.approx(1 - 0.6**4)
    assert m["coverage_at_4"] == pytest.approx(((1 - 0.7**4) + (1 - 0.9**4)) / 2)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert m["correct_entropy"] == pytest.approx(h)
    assert m["uniformity"] == pytest.approx(h / math.log(2))
    assert m["max_q"] == pytest.approx(0.75)
    assert m["signal"] == pytest.approx(1 - 0.4**2 - 0.6**2)  # one correct and one wrong of two: 2 * 0.4 * 0.6


def test_one_answer_problems_have_no_uniformity_and_zero_mass_has_no_q() -> None:
    one = exact_problem_metrics([0.5], ks=[], group_size=4)
    assert math.isnan(one["uniformity"]) and one["max_q"] == 1.0
    zero = exact_problem_metrics([0.0, 0.0], ks=[], group_size=4)
    assert zero["pass_at_1"] == 0.0 and math.isnan(zero["max_q"]) and zero["signal"] == 0.0
    mean = exact_metrics([[0.5], [0.2, 0.2]], ks=[], group_size=4)
    assert mean["uniformity"] == pytest.approx(1.0)  # the one-answer problem is skipped, not counted as 0
    assert mean["pass_at_1"] == pytest.approx((0.5 + 0.4) / 2)


def test_the_sampled_estimators_converge_to_the_exact_values() -> None:
    rng = np.random.default_rng(0)
    problems = [rng.dirichlet(np.ones(6)) * z for z in (0.2, 0.5, 0.8)]  # 6 correct answers, mass z; rest wrong
    exact = exact_metrics(problems, ks=[4], group_size=8)
    n, draws = 64, 400
    passes, covers, signal = [], [], []
    for p in problems:
        probs = np.append(p, 1 - p.sum())  # the last category: any wrong response
        for _ in range(draws):
            x = rng.choice(len(probs), size=n, p=probs)
            c = int((x < len(p)).sum())
            passes.append(pass_at_k(n, c, 4))
            covers.append(len(set(x[:4][x[:4] < len(p)])) / len(p))
            signal.append(0 < int((x[:8] < len(p)).sum()) < 8)
    se = 3 / math.sqrt(len(passes))  # 3 standard errors of a [0, 1] mean at worst
    assert np.mean(passes) == pytest.approx(exact["pass_at_4"], abs=se)
    assert np.mean(covers) == pytest.approx(exact["coverage_at_4"], abs=se)
    assert np.mean(signal) == pytest.approx(exact["signal"], abs=se)
