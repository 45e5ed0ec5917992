"""rlvrlab.stats.design: variance components, the MDE of a design and the smallest design, checked by Monte Carlo
(vectorised over replications, each test with its own seed). The long version prints the figures of docs/sweeps.md,
"Planning a study":  .venv/bin/pytest -q -s -m slow tests/stats/test_design.py"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlvrlab import stats
from rlvrlab.stats.design import (
    Components,
    bernoulli_variance,
    components,
    design_mde,
    noncentrality,
    problems_needed,
    smallest_design,
)


def _truth(rng, problems: int, seed_sd: float, seed_problem_sd: float, problem_sd: float):
    """A benchmark's problem rates (symmetric about 0.5, so β does not depend on Δ to first order), each arm's seed
    and seed×problem sds, arm A's problem-by-arm sd, and the components of the paired difference A - B."""
    rates = rng.uniform(0.2, 0.8, problems)
    spread = seed_sd ** 2 + seed_problem_sd ** 2
    beta = 2 * float(np.mean(rates * (1 - rates)) - spread) - problem_sd ** 2  # E[q(1 - q)] = π(1 - π) - Var(q - π)
    return rates, Components(seed=2 * seed_sd ** 2, problem=problem_sd ** 2, seed_problem=2 * seed_problem_sd ** 2,
                             bernoulli=beta)


def _rejections(rng, rates, sds, design, deltas, level, reps):
    """[len(deltas)] rejection rates of the report's paired crossed comparison (stats.crossed_moments) at `level`,
    data drawn from the model: binomial samples of per-cell rates clipped to [0, 1], arm A = B + Δ + a
    problem-by-arm effect drawn afresh for each replication (the problems a draw from the benchmark)."""
    seed_sd, seed_problem_sd, problem_sd = sds
    seeds, samples, problems = design.seeds, design.samples, design.problems
    base, shape = rates[:problems], (len(deltas), reps, seeds, problems)
    cell = lambda: rng.normal(0, seed_sd, shape[:3] + (1,)) + rng.normal(0, seed_problem_sd, shape)  # noqa: E731
    q_b = np.clip(base + cell(), 0, 1)
    shift = np.asarray(deltas)[:, None, None, None] + rng.normal(0, problem_sd, (len(deltas), reps, 1, problems))
    q_a = np.clip(base + shift + cell(), 0, 1)
    moments = stats.crossed_moments((rng.binomial(samples, q_a) - rng.binomial(samples, q_b)) / samples)
    t = moments.estimate / moments.se
    return (np.abs(t) > stats.t_ppf(1 - level / 2, moments.df)).mean(axis=-1)


def _simulated_mde(rng, rates, sds, design, level, reps, factors=(0.8, 0.9, 1.0, 1.1, 1.2)):
    """The Δ the simulated test detects with power 0.8: linear interpolation of the power over Δ = predicted ×
    factors (power increasing in Δ; np.maximum.accumulate smooths the Monte Carlo noise)."""
    deltas = design.mde * np.asarray(factors)
    chunks = [min(1000, reps - start) for start in range(0, reps, 1000)]  # vectorised 1,000 at a time (memory)
    power = sum(n * _rejections(rng, rates, sds, design, deltas, level, n) for n in chunks) / reps
    power = np.maximum.accumulate(power)
    assert power[0] < stats.POWER < power[-1], f"the grid misses power 0.8: {power}"
    return float(np.interp(stats.POWER, power, deltas)), power


def _check(seed: int, cases, reps: int, show: bool = False) -> list[float]:
    """predicted / simulated MDE at the recommended design of each case (target, M, seed sd, seed×problem sd,
    problem-by-arm sd), from 200 problems × 64 samples at most."""
    rng = np.random.default_rng(seed)
    ratios = []
    for target, comparisons, *sds in cases:
        rates, truth = _truth(rng, 200, *sds)
        design = smallest_design(truth, target, comparisons=comparisons, samples=64, problems=200)
        level = stats.ALPHA / comparisons
        simulated, _ = _simulated_mde(rng, rates, sds, design, level, reps)
        normal = stats.scipy_stats().norm.ppf
        z_mde = (normal(1 - level / 2) + normal(stats.POWER)) * math.sqrt(
            truth.mean_var(design.seeds, design.samples, design.problems))
        ratios.append(design.mde / simulated)
        if show:
            print(f"target {target} M={comparisons} sds {sds}: {design.seeds} seeds × {design.samples} samples × "
                  f"{design.problems} problems; predicted MDE {design.mde:.4f}, simulated {simulated:.4f} "
                  f"(ratio {design.mde / simulated:.3f}); normal approximation {z_mde:.4f} "
                  f"(ratio {z_mde / simulated:.3f})")
    return ratios


def test_predicted_mde_is_within_15_percent_of_the_simulated_mde_at_the_recommended_design():
    # small S (3-6 seeds, where the noncentral t matters most) and a larger one, Holm levels 0.05 and 0.005,
    # without and with a problem-by-arm term
    cases = [(0.08, 1, 0.02, 0.05, 0.0), (0.05, 10, 0.01, 0.05, 0.02), (0.025, 10, 0.005, 0.06, 0.01)]
    ratios = _check(4801, cases, reps=1000)
    assert all(0.85 <= r <= 1.15 for r in ratios), ratios


@pytest.mark.slow
def test_predicted_mde_is_within_15_percent_of_the_simulated_mde_long():
    cases = [(0.08, 1, 0.02, 0.05, 0.0), (0.05, 1, 0.02, 0.05, 0.02), (0.05, 10, 0.01, 0.05, 0.02),
             (0.03, 10, 0.01, 0.05, 0.0), (0.025, 10, 0.005, 0.06, 0.01), (0.02, 30, 0.005, 0.04, 0.005)]
    ratios = _check(4802, cases, reps=10000, show=True)
    assert all(0.85 <= r <= 1.15 for r in ratios), ratios


def test_components_recover_the_simulated_components_on_average():
    """Unbiased on average over 4,000 simulated pilots of 5 seeds × 60 problems × 32 samples (one arm)."""
    rng = np.random.default_rng(4803)
    reps, seeds, problems, samples = 4000, 5, 60, 32
    rates = rng.uniform(0.2, 0.8, problems)
    seed_sd, problem_sd, seed_problem_sd = 0.03, 0.1, 0.06
    offsets = rng.normal(0, problem_sd, (reps, 1, problems))
    q = np.clip(rates + offsets + rng.normal(0, seed_sd, (reps, seeds, 1))
                + rng.normal(0, seed_problem_sd, (reps, seeds, problems)), 0, 1)
    x = rng.binomial(samples, q) / samples
    found = components(x, bernoulli_variance(x, samples), samples)  # every pilot at once: fields [reps]
    cells = stats.mean_squares(q)  # the rates' own two-way ANOVA: what the estimates target, clipping included
    assert np.mean(found.seed) == pytest.approx(np.mean(cells.seeds - cells.resid) / problems, rel=0.1)
    assert np.mean(found.seed) == pytest.approx(seed_sd ** 2, rel=0.15)
    assert np.mean(found.seed_problem) == pytest.approx(np.mean(cells.resid), rel=0.05)
    assert np.mean(found.bernoulli) == pytest.approx(np.mean(q * (1 - q)), rel=0.01)


def test_design_mde_is_the_noncentral_t_mde_and_not_the_normal_one():
    parts = Components(seed=0.01 ** 2, problem=0.0, seed_problem=0.05 ** 2, bernoulli=0.4)
    var = parts.per_seed_var(64, 100)
    assert design_mde(parts, 3, 64, 100, comparisons=10) == pytest.approx(
        stats.mde(math.sqrt(var / 3), 2, alpha=0.005))
    wider = Components(seed=0.01 ** 2, problem=0.02 ** 2, seed_problem=0.05 ** 2, bernoulli=0.4)
    assert design_mde(wider, 3, 64, 100) == pytest.approx(
        stats.mde(math.sqrt(var / 3 + 0.02 ** 2 / 100), 2))  # the problem term of the crossed comparison
    normal = stats.scipy_stats().norm.ppf
    assert noncentrality(3, 0.005) > 2 * (normal(1 - 0.0025) + normal(0.8))  # t on 2 df: far wider than z
    assert design_mde(parts, 1, 64, 100) == math.inf


def test_smallest_design_is_the_fewest_seeds_then_the_fewest_samples():
    parts = Components(seed=0.01 ** 2, problem=0.0, seed_problem=0.05 ** 2, bernoulli=0.4)
    design = smallest_design(parts, 0.03, comparisons=10, samples=64, problems=200)
    assert design.mde <= 0.03
    assert design_mde(parts, design.seeds - 1, 64, 200, comparisons=10) > 0.03  # one seed fewer cannot
    assert design_mde(parts, design.seeds, design.samples, design.problems - 1, comparisons=10) > 0.03
    assert problems_needed(parts, design.seeds, design.samples, 0.03, 0.005) == design.problems
    for n in (1, 2, 4, 8, 16, 32, 64):  # no other samples per problem evaluates fewer responses at this S
        p = problems_needed(parts, design.seeds, n, 0.03, 0.005)
        assert p is None or p > 200 or n * p >= design.samples * design.problems


def test_a_seed_term_wider_than_the_target_needs_more_seeds_or_none():
    parts = Components(seed=0.05 ** 2, problem=0.0, seed_problem=0.0, bernoulli=0.0)
    assert smallest_design(parts, 0.01, max_seeds=10) is None
    assert problems_needed(parts, 3, 64, 0.01, 0.05) is None
    with pytest.raises(ValueError):
        smallest_design(parts, 0.0)
