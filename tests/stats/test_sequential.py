"""Sequential seeds (rlvrlab/stats/sequential.py, issue 48 item 3): the boundaries, the pruning error and the sweep
simulation whose figures docs/sweeps.md ("Sequential seeds") prints. The slow versions print them:
`.venv/bin/pytest -q -s -p no:cacheprovider -m slow tests/stats/test_sequential.py`."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from rlvrlab import stats
from rlvrlab.errors import RlvrlabError
from rlvrlab.stats.sequential import (
    BETA,
    BETTER,
    COMPLETE,
    CONTINUE,
    PRUNE,
    SEQUENTIAL_DECISIONS,
    SPENDING_RHO,
    SequentialDesign,
    running_t,
    sequential_decision,
    sequential_stops,
)

GRID = Path(__file__).resolve().parents[2] / "results" / "tiny_tau_eps_staleness_grid" / "per_seed.csv"
METRIC = "policy/correct_entropy:mean:20"  # the metric the folder's table leads with


def mc_margin(p: float, reps: int) -> float:
    """Two Monte Carlo standard errors of a rate p estimated from reps replications."""
    return 2.0 * math.sqrt(p * (1 - p) / reps)


def test_design_spends_beta_and_alpha_over_the_looks_and_refuses_a_look_before_3_seeds():
    design = SequentialDesign(3, 10)
    assert design.spent(BETA).sum() == pytest.approx(BETA)
    assert np.all(design.spent(BETA) > 0)
    assert design.critical(BETA)[0] == pytest.approx(sps.t.ppf(1 - BETA * 0.09, 2))
    assert np.all(np.isinf(SequentialDesign(3, 5, alpha=0.0).critical(0.0)))
    with pytest.raises(RlvrlabError, match="n_min"):
        SequentialDesign(2, 5)
    with pytest.raises(RlvrlabError, match="delta"):
        sequential_stops(np.zeros(3), -1.0, SequentialDesign(3, 5))
    assert sequential_decision([1.0, 2.0], [0.0, 0.0], 0.1, SequentialDesign(3, 5)) == (CONTINUE, 2)


def test_stops_is_the_first_look_whose_one_sided_t_test_rejects():
    """The vectorised rule against scipy's one-sided t-tests, look by look."""
    rng = np.random.default_rng(4801)
    design, delta = SequentialDesign(3, 8), 0.5
    d = rng.normal(0.3, 1.0, size=(200, 8)) * rng.choice([0.2, 1.0, 3.0], size=(200, 1))
    code, used = sequential_stops(d, delta, design)
    for row, c, u in zip(d, code, used):
        expected, at = COMPLETE, 8
        for n, b, a in zip(design.looks, design.spent(design.beta), design.spent(design.alpha)):
            if sps.ttest_1samp(row[:n], 0.0, alternative="greater").pvalue < a:
                expected, at = BETTER, n
                break
            if sps.ttest_1samp(row[:n], delta, alternative="less").pvalue < b:
                expected, at = PRUNE, n
                break
        assert (SEQUENTIAL_DECISIONS[c], u) == (expected, at)
    assert {PRUNE, BETTER, COMPLETE} <= {SEQUENTIAL_DECISIONS[c] for c in code}


def test_running_t_is_the_t_statistic_of_each_prefix_even_under_a_large_offset():
    rng = np.random.default_rng(4809)
    d = rng.normal(0.1, 0.01, size=(50, 7))
    for offset in (0.0, 1e6):
        t = running_t(d + offset, 0.05 + offset)
        for n in range(2, 8):
            expected = sps.ttest_1samp(d[:, :n], 0.05, axis=1).statistic
            np.testing.assert_allclose(t[:, n - 1], expected, rtol=1e-6 if offset else 1e-10)


def test_decide_on_one_trial_uses_the_shared_seeds():
    incumbent = [1.0, 1.1, 0.9, 1.0, 1.05]
    assert sequential_decision([0.5, 0.55, 0.45, 0.5], incumbent, 0.1, SequentialDesign(3, 5))[0] == PRUNE
    assert sequential_decision([2.0, 2.2, 1.9, 2.1, 2.0], incumbent, 0.1, SequentialDesign(3, 5)) == (BETTER, 3)
    assert sequential_decision([1.2, 1.0, 1.1], incumbent, 0.1, SequentialDesign(3, 5)) == (CONTINUE, 3)


def noise(kind: str, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed values of (trial, incumbent) about their means, unit-scale, with a seed effect shared by the arms
    (it cancels in the paired difference; the arm noise decides the law of d)."""
    def lognormal(size):
        return (np.exp(rng.standard_normal(size)) - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)

    def gamma(size):
        return (rng.gamma(2.0, size=size) - 2.0) / math.sqrt(2.0)

    law = {"normal": rng.standard_normal, "lognormal": lognormal, "gamma": gamma,
           "collapse": lognormal, "right-skew": lognormal}[kind]
    seed_effect = 2.0 * law((shape[0], 1)) * np.ones(shape)
    if kind == "collapse":  # the trial sometimes collapses on a seed: d skewed left
        return seed_effect - lognormal(shape), seed_effect + rng.standard_normal(shape)
    if kind == "right-skew":  # the trial sometimes soars on a seed: d skewed right (not covered, docs/sweeps.md)
        return seed_effect + lognormal(shape), seed_effect + 0.5 * rng.standard_normal(shape)
    return seed_effect + law(shape), seed_effect + law(shape)


COVERED = ("normal", "lognormal", "gamma", "collapse")


def prune_rates(reps: int, seed: int, kinds=COVERED) -> dict[tuple[str, int], float]:
    """P(prune | μ_d = δ) at n_max = 3..10 for each noise law, reps replications each."""
    rng, delta, out = np.random.default_rng(seed), 0.4, {}
    for kind in kinds:
        for n_max in range(3, 11):
            trial, incumbent = noise(kind, rng, (reps, n_max))
            code, _ = sequential_stops(delta + trial - incumbent, delta, SequentialDesign(3, n_max))
            out[kind, n_max] = float(np.mean(code == SEQUENTIAL_DECISIONS.index(PRUNE)))
    return out


def test_prune_probability_of_a_trial_delta_better_is_at_most_beta_at_3_to_10_seeds():
    reps = 20_000
    for (kind, n_max), rate in prune_rates(reps, 4802).items():
        assert rate <= BETA + mc_margin(BETA, reps), (kind, n_max, rate)


def better_rates(reps: int, seed: int) -> list[float]:
    """P(better | μ_d = 0) at n_max = 3..10, normal differences, reps replications each."""
    rng, out = np.random.default_rng(seed), []
    for n_max in range(3, 11):
        d = rng.standard_normal((reps, n_max)) - rng.standard_normal((reps, n_max))
        code, _ = sequential_stops(d, 0.5, SequentialDesign(3, n_max))
        out.append(float(np.mean(code == SEQUENTIAL_DECISIONS.index(BETTER))))
    return out


def test_better_probability_of_an_equal_trial_is_at_most_alpha_at_3_to_10_seeds():
    reps = 20_000
    assert max(better_rates(reps, 4803)) <= stats.ALPHA + mc_margin(stats.ALPHA, reps)


@pytest.mark.slow
def test_prune_and_better_probabilities_slow_and_the_prune_limit_under_right_skew():
    reps = 200_000
    rates = prune_rates(reps, 4804, COVERED + ("right-skew",))
    for kind in COVERED + ("right-skew",):
        print(kind, " ".join(f"{rates[kind, n]:.4f}" for n in range(3, 11)))
    assert max(rates[kind, n] for kind in COVERED for n in range(3, 11)) <= BETA + mc_margin(BETA, reps)
    assert min(rates["right-skew", n] for n in range(3, 11)) > BETA  # the limit docs/sweeps.md states
    better = better_rates(reps, 4810)
    print("better at 0", " ".join(f"{rate:.4f}" for rate in better))
    assert max(better) <= stats.ALPHA + mc_margin(stats.ALPHA, reps)


def grid_noise() -> tuple[np.ndarray, float, float]:
    """The committed grid's cell means of METRIC, its arm noise SD σ_e and seed-effect SD σ_u (two-way ANOVA, cells
    × seeds: σ_e² = MS_residual, σ_u² = (MS_seeds - MS_residual)/cells)."""
    rows = [r for r in csv.DictReader(GRID.open()) if r["metric"] == METRIC]
    cells, seeds = sorted({r["group"] for r in rows}), sorted({int(r["seed"]) for r in rows})
    y = np.full((len(cells), len(seeds)), np.nan)
    for r in rows:
        y[cells.index(r["group"]), seeds.index(int(r["seed"]))] = float(r["value"])
    c, s = y.shape
    residual = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    ms_e = float((residual ** 2).sum() / ((c - 1) * (s - 1)))
    ms_s = float(c * ((y.mean(0) - y.mean()) ** 2).sum() / (s - 1))
    return y.mean(1), math.sqrt(ms_e), math.sqrt(max(ms_s - ms_e, 0.0) / c)


def sweep(n_max: int, reps: int, seed: int, rho: float = SPENDING_RHO) -> dict[str, float]:
    """A sweep of the grid's cells plus one planted cell δ above the best (δ = MDE of the paired t at n_max seeds),
    visited in random order; the incumbent is the best so far (mean over its n_max seeds); each trial runs its seeds
    in order under the sequential rule (no efficacy stop: an incumbent needs all its seeds), or all of them. "bound":
    the saving of an oracle that prunes, at the first look, exactly the trials that would not become incumbent."""
    means, sd_e, sd_u = grid_noise()
    delta = stats.mde(math.sqrt(2.0) * sd_e / math.sqrt(n_max), n_max - 1)
    mu = np.append(means, means.max() + delta)
    cells, planted = mu.size, mu.size - 1
    rng = np.random.default_rng(seed)
    y = mu[None, :, None] + sd_u * rng.standard_normal((reps, 1, n_max)) + sd_e * rng.standard_normal(
        (reps, cells, n_max))
    order = np.argsort(rng.random((reps, cells)), axis=1)
    rows, design = np.arange(reps), SequentialDesign(3, n_max, alpha=0.0, rho=rho)
    incumbent, runs, planted_pruned = order[:, 0], np.full(reps, n_max), np.zeros(reps, dtype=bool)
    for k in range(1, cells):
        cell = order[:, k]
        code, used = sequential_stops(y[rows, cell] - y[rows, incumbent], delta, design)
        pruned = code == SEQUENTIAL_DECISIONS.index(PRUNE)
        runs += np.where(pruned, used, n_max)
        planted_pruned |= pruned & (cell == planted)
        wins = ~pruned & (y[rows, cell].mean(1) > y[rows, incumbent].mean(1))
        incumbent = np.where(wins, cell, incumbent)
    records = sum(1.0 / k for k in range(1, cells + 1))  # expected new incumbents in a random order
    return {"delta": delta, "fixed": float(np.mean(y.mean(2).argmax(1) == planted)),
            "sequential": float(np.mean(incumbent == planted)), "planted_pruned": float(planted_pruned.mean()),
            "saving": 1.0 - float(runs.mean()) / (cells * n_max),
            "bound": (cells - records) * (n_max - 3) / (cells * n_max)}


def test_sweep_grid_picks_the_planted_cell_as_often_as_the_fixed_design_with_fewer_seed_runs():
    reps = 20_000
    five, ten = sweep(5, reps, 4805), sweep(10, reps, 4806)
    for r in (five, ten):
        assert r["fixed"] - r["sequential"] <= 0.02 + mc_margin(0.02, reps), r
    assert five["saving"] >= 0.8 * five["bound"] and five["bound"] < 0.30  # 5 seeds: near what any rule can save
    assert ten["saving"] >= 0.30


@pytest.mark.slow
def test_sweep_grid_slow_planted_cell_within_0_02_of_the_fixed_design_at_rho_2_and_3():
    reps = 200_000
    for n_max, seed in ((5, 4807), (10, 4808)):
        for rho in (1.0, SPENDING_RHO, 3.0):  # the spending power trades seeds saved against the planted cell's pruning
            r = sweep(n_max, reps, seed, rho)
            print(n_max, rho, {k: round(v, 4) for k, v in r.items()})
            assert r["planted_pruned"] <= BETA
            if rho >= SPENDING_RHO:  # ρ = 1 misses 0.02 at 5 seeds (0.021): why the default is 2 (docs/sweeps.md)
                assert r["fixed"] - r["sequential"] <= 0.02 + mc_margin(0.02, reps)
