"""The exact sign-flip p counts ties that float sums miss (issue 45, item 7): a pattern that flips a subset of the
differences summing to 0 reaches exactly the observed |sum|, but the float sums of the same exact values can differ
in their last bit. stats.signflip_p counts a pattern within stats.TIE_TOLERANCE · Σ|d| of the observed |sum|;
checked here by hand and against enumeration in exact rational arithmetic."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from rlvrlab import stats


def _exact_p(d: np.ndarray) -> float:
    """All 2^S sign patterns of d, each value its exact binary rational (Fraction of a double), ties counted."""
    values = [Fraction(float(v)) for v in d]
    observed = abs(sum(values))
    patterns = list(itertools.product((1, -1), repeat=len(values)))
    return sum(abs(sum(e * v for e, v in zip(signs, values))) >= observed for signs in patterns) / len(patterns)


def test_ties_by_hand() -> None:
    """d = (0.1, 0.2, 0.3, -0.6) sums to 0 exactly in the decimals: every one of the 16 patterns reaches |sum| >= 0,
    so p = 1 (the float sums give 0.875 with a comparison at the observed float value). d = (0.1, 0.2, -0.3, 0.5):
    the first three sum to 0, so the signed sums x of (0.1, 0.2, -0.3) are 0 (twice), ±0.2, ±0.4, ±0.6, and
    |x ± 0.5| >= 0.5 for x of the same sign as 0.5's or 0: 5 of 8 for each sign of 0.5, p = 10/16. The committed
    tiny_algorithms row grpo_seq_mean vs grpo, pass@64 (differences 4, 5, 1, -8, -2 problems of 102 solved, sum
    0): p = 1, where the report wrote 0.9375."""
    assert stats.signflip_p(np.array([0.1, 0.2, 0.3, -0.6])) == 1.0
    assert stats.signflip_p(np.array([0.1, 0.2, -0.3, 0.5])) == 10 / 16
    assert stats.signflip_p(np.array([4.0, 5.0, 1.0, -8.0, -2.0]) / 102) == 1.0
    assert stats.signflip_p(np.array([4.0, 5.0, 1.0, -8.0, -2.0])) == 1.0  # integers: the float sums are exact


def test_grid_data_with_many_ties_match_exact_enumeration() -> None:
    """Seed means of pass@k-like data (k of P problems solved, P = 102; and multiples of 1/(64·102)), where subsets
    summing to 0 are common: equal to exact rational enumeration on every draw; and on continuous data too."""
    rng = np.random.default_rng(45)
    ties = 0
    for draw in range(300):
        s = int(rng.integers(3, 9))
        step = 102 if draw % 2 else 64 * 102
        d = rng.integers(-4, 5, s) / step
        exact = _exact_p(d)
        ties += int(exact == 1.0)
        assert stats.signflip_p(d) == exact, d
    assert ties > 10  # draws where ties decide the value were exercised
    for s in (4, 7, 10):
        d = rng.normal(0.01, 0.02, s)
        assert stats.signflip_p(d) == pytest.approx(_exact_p(d), abs=1e-12)


def test_the_tolerance_is_relative_to_the_datas_scale() -> None:
    """Scaling d by any power of 2 changes no tie (the float sums scale exactly) and the p stays the same. A real
    difference of 1e-6 of the data's scale is not a tie: d = (1, -1 + δ, 3) has signed sums ±(3 + δ), ±(5 - δ),
    ±(3 - δ), ±(1 + δ): p = 4/8 for δ = 1e-6, 6/8 for δ = 0."""
    d = np.array([4.0, 5.0, 1.0, -8.0, -2.0]) / 102
    for scale in (2.0 ** -30, 1.0, 2.0 ** 30):
        assert stats.signflip_p(d * scale) == 1.0
    assert stats.signflip_p(np.array([1.0, -1.0 + 1e-6, 3.0])) == 4 / 8 == _exact_p(np.array([1.0, -1.0 + 1e-6, 3.0]))
    assert stats.signflip_p(np.array([0.1, -0.1, 0.3])) == 6 / 8


def test_results_recompute_counts_the_same_ties_in_integer_arithmetic() -> None:
    """results/recompute.py's own sign-flip (exact integer subset sums, no float comparison) agrees with the report's
    on tied and untied data, and gives 1 for the committed tiny_algorithms row that was written as 0.9375."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("recompute", Path(__file__).resolve().parents[2] / "results" /
                                                  "recompute.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.signflip_p(np.array([4.0, 5.0, 1.0, -8.0, -2.0]) / 102) == 1.0
    assert script.signflip_p(script.problem_sums(np.array([[1.0, 0.0], [0.0, -1.0], [1.0, 1.0]]))) == 6 / 8
    rng = np.random.default_rng(7)
    for draw in range(100):
        d = rng.integers(-3, 4, int(rng.integers(3, 10))) / (102 if draw % 2 else 6528)
        assert script.signflip_p(d) == stats.signflip_p(d)
