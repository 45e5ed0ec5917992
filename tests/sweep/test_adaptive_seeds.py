"""Adaptive seeds (rlvrlab.sweep.seeds): Stein's (1945) two-stage rule as the sweep runs it, its interval's coverage
under normality, the objective's bounds on that interval, and the file's validation."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from rlvrlab.errors import ConfigError
from rlvrlab.sweep.objective import AGGREGATES, seed_summary
from rlvrlab.sweep.seeds import AdaptiveSeeds, seed_count, stein_interval, wanted
from rlvrlab.sweep.spec import SweepSpec, load_sweep
from rlvrlab.sweep.trials import more_seeds

SWEEP = """\
experiment: toy
overrides: [algorithm=ucpo, steps=12]
seeds: {initial: 5, max: 20, halfwidth: 0.02}
space: {algorithm.tau: [0.0]}
objective: {metric: policy/toy_correct_uniformity, aggregate: lcb95}
"""
T4 = 2.7764451051977987  # t_{.975, 4}: stage one of 5 seeds


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> SweepSpec:
    path = tmp_path_factory.mktemp("adaptive") / "adaptive.yaml"
    path.write_text(SWEEP)
    return load_sweep(str(path))


def _run_trial(spec: SweepSpec, runs: np.ndarray) -> dict[int, float]:
    """A trial's seed values as rlvrlab.sweep.trials.run_trial collects them: seeds 0..initial-1, then rounds of
    `more_seeds` until it adds none (runs[seed] stands for a seed run's objective)."""
    values: dict[int, float] = {}
    count = len(spec.seeds)
    while len(values) < count:
        for seed in range(len(values), count):
            values[seed] = float(runs[seed])
        count += more_seeds(spec, values)
    return values


@pytest.mark.parametrize("sd_over_h", [0.3, 1.0, 1.67, 2.0])
def test_the_adaptive_interval_covers_95_percent(spec: SweepSpec, sd_over_h: float) -> None:
    """Normal seed values with SD = sd_over_h · halfwidth, 10,000 trials each run by the sweep's own functions
    (more_seeds, then the lcb95/ucb95 objectives): initial 5, max 20, halfwidth 0.02. The Stein interval covers
    0.949/0.948/0.948/0.950 at SD/h 0.3/1/1.67/2 here (0.950/0.951/0.950/0.951 over 100,000 trials, each tail
    0.025); 0.94-0.96 is asserted, each tail at most 0.035, and a half-width <= h wherever the trial stopped below
    max. Mean seeds per trial: 5.0/8.6/15.4/17.2 (31.4 at SD/h 2 without the max).
    The rule it replaced (rounds up to the count the current spread asks for, then the ordinary t-interval over the
    N seeds) covered 0.949/0.916/0.903/0.910 from 3 seeds and 0.950/0.941/0.921/0.924 from 5 (max 20, 200,000
    trials; `test_the_replaced_rounds_under_cover` re-runs it)."""
    assert spec.adaptive is not None
    h, mu, draws = spec.adaptive.halfwidth, 0.4, 10_000
    pool = np.random.default_rng(37).normal(mu, sd_over_h * h, (draws, spec.adaptive.max))
    low, high, n, half = (np.empty(draws) for _ in range(4))
    for i in range(draws):
        values = _run_trial(spec, pool[i])
        low[i] = AGGREGATES["lcb95"].over(values, spec.adaptive)
        high[i] = AGGREGATES["ucb95"].over(values, spec.adaptive)
        n[i], half[i] = len(values), (high[i] - low[i]) / 2
    below, above = float((mu < low).mean()), float((mu > high).mean())
    assert 0.94 <= 1 - below - above <= 0.96, (below, above)
    assert below <= 0.035 and above <= 0.035
    assert (half[n < spec.adaptive.max] <= h * (1 + 1e-12)).all()
    assert abs(float(((low + high) / 2).mean()) - mu) < 4 * sd_over_h * h / math.sqrt(draws * 5)  # unbiased


@pytest.mark.parametrize("first,sd_over_h,most", [(3, 1.67, 0.925), (5, 1.67, 0.935), (5, 2.0, 0.935)])
def test_the_replaced_rounds_under_cover(first: int, sd_over_h: float, most: float) -> None:
    """For contrast, the rule Stein's replaced, vectorised (max 20, 20,000 trials): grow to the smallest n with
    t_{.975, n-1}·s_n/√n <= h for the current s, look again, report the t-interval over the final N seeds. It
    stops early when the spread is underestimated: here 0.904 from 3 seeds at SD/h 1.67, 0.922 and 0.924 from 5 at
    SD/h 1.67 and 2 (200,000 trials: 0.903, 0.921, 0.924). The assertion that holds Stein's interval (>= 0.94)
    fails for it."""
    rng, draws, cap, h = np.random.default_rng(11), 20_000, 20, 1.0
    pool = rng.normal(0.0, sd_over_h * h, (draws, cap))
    counts = np.arange(1, cap + 1)
    prefix_mean = np.cumsum(pool, axis=1) / counts
    prefix_sd = np.sqrt(np.maximum(np.cumsum(pool ** 2, axis=1) - counts * prefix_mean ** 2, 0)
                        / np.maximum(counts - 1, 1))
    sizes = np.arange(2, cap + 1)
    crit = sps.t.ppf(0.975, sizes - 1)
    n, rows = np.full(draws, first), np.arange(draws)
    for _ in range(cap):
        ok = crit[None, :] * prefix_sd[rows, n - 1][:, None] / np.sqrt(sizes)[None, :] <= h
        grown = np.maximum(n, np.where(ok.any(axis=1), sizes[ok.argmax(axis=1)], cap))
        if (grown == n).all():
            break
        n = grown
    half = sps.t.ppf(0.975, n - 1) * prefix_sd[rows, n - 1] / np.sqrt(n)
    assert 0.88 <= float((np.abs(prefix_mean[rows, n - 1]) <= half).mean()) <= most


def test_stein_seed_count_and_interval_by_hand() -> None:
    """Stage one 0.50, 0.52, ..., 0.58: s0 = √0.001 = 0.0316228, t_{.975,4}·s0 = 0.0877970. Half-width 0.03:
    (0.0877970/0.03)² = 8.565 -> N = 9 (0.0877970/√9 = 0.02927 <= 0.03 < 0.0877970/√8 = 0.03104); 0.05: 3.08 ->
    N = initial = 5; 0.02: 19.27 -> 20, capped at max 10. Only the spread decides, never the mean."""
    first = {s: 0.50 + 0.02 * s for s in range(5)}
    rule = AdaptiveSeeds(initial=5, max=10, halfwidth=0.03)
    assert wanted(first, rule) == 9 and seed_count(first, rule) == 9
    assert wanted({s: v + 100.0 for s, v in first.items()}, rule) == 9
    assert wanted(first, dataclasses.replace(rule, halfwidth=0.05)) == 5
    assert wanted(first, dataclasses.replace(rule, halfwidth=0.02)) == 20
    assert seed_count(first, dataclasses.replace(rule, halfwidth=0.02)) == 10
    assert seed_count({0: 0.5, 1: 0.6}, rule) == 5 and wanted({0: 0.5, 1: 0.6}, rule) is None  # stage one runs
    assert seed_count({**first, 2: math.nan}, rule) == 10 and wanted({**first, 2: math.nan}, rule) is None

    values = {**first, **{s: 0.6 for s in range(5, 9)}}
    interval = stein_interval(values, 5)
    mean, half = (sum(first.values()) + 4 * 0.6) / 9, T4 * math.sqrt(0.001) / 3
    assert (interval.mean, interval.low, interval.high) == pytest.approx((mean, mean - half, mean + half), abs=1e-12)
    assert interval.df == 4 and interval.n_seeds == 9 and interval.method == "stein"
    with pytest.raises(ValueError, match="needs seeds 0..4"):
        stein_interval({s: v for s, v in values.items() if s != 3}, 5)


def test_the_objective_bounds_are_the_interval_the_trial_records() -> None:
    """An adaptive trial's lcb95/ucb95 and its recorded summary (what --status shows) are one Stein interval; a
    fixed seed list keeps the report's Student-t interval, in any order of its seeds."""
    rule = AdaptiveSeeds(initial=5, max=20, halfwidth=0.03)
    values = {s: 0.5 + 0.013 * ((7 * s) % 9) for s in range(9)}
    summary, interval = seed_summary(values, rule), stein_interval(values, 5)
    assert summary["low"] == AGGREGATES["lcb95"].over(values, rule) == interval.low
    assert summary["high"] == AGGREGATES["ucb95"].over(values, rule) == interval.high
    assert summary["halfwidth"] == interval.halfwidth and summary["n"] == 9
    fixed = list(values.values())
    t = seed_summary(fixed)
    assert t["low"] == AGGREGATES["lcb95"].over(fixed) == AGGREGATES["lcb95"].over(values) != interval.low
    with pytest.raises(TypeError, match="seed -> value"):
        AGGREGATES["lcb95"].over(fixed, rule)


def test_more_seeds_is_stage_two_in_one_round(spec: SweepSpec) -> None:
    """The sweep's round rule: after stage one the trial grows once to Stein's N (capped at max 20), then adds none."""
    first = {s: 0.50 + 0.02 * s for s in range(5)}  # N = 20 at h 0.02 (by hand above)
    assert more_seeds(spec, first) == 15
    assert more_seeds(spec, {**first, **{s: 9.0 for s in range(5, 20)}}) == 0  # stage two never looks again
    narrow = {s: 0.5 + 0.001 * s for s in range(5)}
    assert more_seeds(spec, narrow) == 0


def test_adaptive_studies_of_another_rule_are_other_studies(spec: SweepSpec) -> None:
    """The rule is in the fingerprint: a study started under the replaced rounds is not resumed by Stein's."""
    assert spec.adaptive is not None and spec.adaptive.rule == "stein1945"
    other = dataclasses.replace(spec, adaptive=dataclasses.replace(spec.adaptive, rule="rounds"))
    assert other.fingerprint() != spec.fingerprint()


@pytest.mark.parametrize("initial", [2, 4])
def test_fewer_than_5_initial_seeds_are_refused(tmp_path: Path, initial: int) -> None:
    path = tmp_path / "few.yaml"
    path.write_text(SWEEP.replace("initial: 5", f"initial: {initial}"))
    with pytest.raises(ConfigError) as error:
        load_sweep(str(path))
    message = str(error.value)
    assert "\n" not in message and "seeds.initial in" in message and "must be an integer >= 5" in message
    assert "e.g. seeds: {initial: 5, max: 20, halfwidth: 0.02}" in message
