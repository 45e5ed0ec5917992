"""The peak comparison (rlvrlab.stats.peak): the swap-permutation test of max-over-steps differences holds its
level with identical arms; the naive per-arm best-step paired t is printed beside it; a truly better arm is found.

Simulated benchmark: 30 problems (logit success probability drawn per problem), pass@1 of 32 samples per problem per
seed per evaluation point, 20 points on a shared learning curve, a seed-level offset and random-walk drift shared by
both arms of a seed (paired seeds) plus a per-run drift of each arm. Vectorised over replications.
Figures: `.venv/bin/pytest -q -s -m slow -p no:cacheprovider tests/stats/test_peak.py` (docs/report.md, "Peaks").
"""

import math

import numpy as np
import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.stats.peak import naive_peak_p, peak_p, peak_statistic, peak_test, swap_patterns

ALPHA = 0.05
PROBLEMS, STEPS, SAMPLES = 30, 20, 32


def simulate(rng, reps: int, seeds: int, effect: float = 0.0):
    """Curves a, b [reps, seeds, STEPS] of pass@1; a is `effect` higher on the logit scale at every point."""
    base = rng.normal(-0.5, 1.5, size=(reps, 1, 1, PROBLEMS))
    curve = 1.2 * (1.0 - np.exp(-np.arange(STEPS) / 4.0))[None, None, :, None]
    seed = rng.normal(0.0, 0.3, size=(reps, seeds, 1, 1))
    walk = np.cumsum(rng.normal(0.0, 0.08, size=(reps, seeds, STEPS, 1)), axis=2)

    def arm(shift: float) -> np.ndarray:
        run = np.cumsum(rng.normal(0.0, 0.05, size=(reps, seeds, STEPS, 1)), axis=2)
        logit = base + curve + seed + walk + run + shift
        return rng.binomial(SAMPLES, 1.0 / (1.0 + np.exp(-logit))).mean(axis=-1) / SAMPLES

    return arm(effect), arm(0.0)


def margin(reps: int, rate: float = ALPHA) -> float:
    """Three Monte Carlo standard errors of a rejection rate near `rate`."""
    return 3.0 * math.sqrt(rate * (1.0 - rate) / reps)


def rates(seed: int, reps: int, seeds: int, effect: float = 0.0) -> tuple[float, float]:
    a, b = simulate(np.random.default_rng(seed), reps, seeds, effect)
    return float((peak_p(a, b) < ALPHA).mean()), float((naive_peak_p(a, b) < ALPHA).mean())


@pytest.mark.parametrize("seeds", [3, 5])
def test_peak_test_cannot_reject_below_six_seeds(seeds):
    peak, naive = rates(4800 + seeds, 300, seeds)
    print(f"\n{seeds} seeds: peak test rejects {peak:.3f}, naive peak t {naive:.3f}")
    assert peak == 0.0  # smallest exact p is 2/2^S >= 0.0625


@pytest.mark.parametrize("seeds", [6, 10])
def test_peak_test_rejects_at_most_five_percent_with_identical_arms(seeds):
    reps = 1000
    peak, naive = rates(4810 + seeds, reps, seeds)
    print(f"\n{seeds} seeds, {reps} null experiments: peak test rejects {peak:.3f}, naive peak t {naive:.3f}")
    assert peak <= ALPHA + margin(reps)
    if seeds == 10:  # exact, not vacuous: P(p < 0.05) = 50/1024 less ties
        assert peak >= ALPHA - margin(reps)


def test_peak_test_finds_an_arm_better_at_every_point():
    reps, seeds = 1000, 10
    null, _ = rates(4830, reps, seeds)
    power, naive = rates(4831, reps, seeds, effect=0.15)
    print(f"\n+0.15 logit at every point, {seeds} seeds: peak test rejects {power:.3f} (null {null:.3f}), "
          f"naive peak t {naive:.3f}")
    assert power > null + margin(reps) + margin(reps, power)


@pytest.mark.slow
def test_peak_test_level_and_naive_rate_over_seed_counts():
    reps = 4000
    for seeds in (3, 5, 6, 8, 10):
        peak, naive = rates(4850 + seeds, reps, seeds)
        power, naive_power = rates(4870 + seeds, reps, seeds, effect=0.15)
        print(f"\n{seeds} seeds, {reps} experiments: identical arms: peak test {peak:.4f}, naive peak t "
              f"{naive:.4f}; a +0.15 logit: peak test {power:.4f}, naive {naive_power:.4f}")
        assert peak <= ALPHA + margin(reps)


def test_exact_p_matches_a_loop_over_swaps():
    rng = np.random.default_rng(48)
    a, b = rng.normal(size=(5, 7)), rng.normal(size=(5, 7))
    observed = abs(peak_statistic(a, b))
    hits = 0
    for bits in range(2 ** 5):
        swap = ((bits >> np.arange(5)) & 1).astype(bool)[:, None]
        hits += abs(peak_statistic(np.where(swap, b, a), np.where(swap, a, b))) >= observed - 1e-12
    assert peak_p(a, b) == pytest.approx(hits / 32)
    result = peak_test(a, b)
    assert result.exact and result.n_seeds == 5 and result.p == pytest.approx(hits / 32)
    assert result.delta == pytest.approx(a.mean(0).max() - b.mean(0).max())
    assert result.step_a == int(a.mean(0).argmax()) and result.step_b == int(b.mean(0).argmax())


def test_random_swaps_beyond_sixteen_seeds_include_the_observed():
    patterns, exact = swap_patterns(17)
    assert not exact and len(patterns) == 2 ** 16 + 1 and not patterns[0].any()
    rng = np.random.default_rng(49)
    a = rng.normal(size=(17, 4)) + 5.0
    b = rng.normal(size=(17, 4))
    extreme = int((patterns.sum(axis=1) % 17 == 0).sum())  # no swap or all swapped (|D*| = |D|), the observed too
    assert extreme >= 1 and peak_p(a, b) == pytest.approx(extreme / (2 ** 16 + 1))


def test_naive_p_is_a_paired_t_at_each_arms_best_step():
    from scipy import stats

    rng = np.random.default_rng(50)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    expected = stats.ttest_rel(a[:, a.mean(0).argmax()], b[:, b.mean(0).argmax()]).pvalue
    assert naive_peak_p(a, b) == pytest.approx(expected)


@pytest.mark.parametrize("a, b, message", [
    (np.zeros((3, 4)), np.zeros((3, 5)), "one shape"),
    (np.zeros((1, 4)), np.zeros((1, 4)), ">= 2 paired seeds"),
    (np.zeros(4), np.zeros(4), "one shape"),
    (np.full((3, 4), np.nan), np.zeros((3, 4)), "NaN"),
])
def test_mismatched_curves_are_one_line_errors(a, b, message):
    with pytest.raises(RlvrlabError, match=message) as error:
        peak_test(a, b)
    assert "\n" not in str(error.value)
