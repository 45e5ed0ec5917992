"""pass@k and coverage@k over k (rlvrlab.algorithms.passk curves, rlvrlab.report.passk_curve) and the intervals
`rlvrlab eval pass-at-k` prints: hand-worked cases, the n >= 4k rule, brute force, and a Monte Carlo coverage."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from rich.console import Console
from scipy import stats as sps

from rlvrlab import stats
from rlvrlab.algorithms.passk import (
    SAMPLES_PER_K,
    exact_curves,
    exact_problem_metrics,
    pass_at_k,
    problem_interval,
    reportable_ks,
    sampled_curves,
    too_few_samples,
)
from rlvrlab.cli.options import print_table
from rlvrlab.eval.run import aggregate
from rlvrlab.eval.view import seeds_table, summary_table
from rlvrlab.report.passk_curve import COLUMNS, curve_points, to_csv


def test_exact_curves_by_hand_on_a_two_answer_problem():
    """p = (0.3, 0.1) on the correct set, Z = 0.4: pass@k = 1 - 0.6^k; coverage@k = mean of 1 - 0.7^k, 1 - 0.9^k."""
    passes, coverage = exact_curves([0.3, 0.1], 3)
    assert passes == pytest.approx([0.4, 0.64, 0.784], abs=1e-15)
    assert coverage == pytest.approx([0.2, (0.51 + 0.19) / 2, (0.657 + 0.271) / 2], abs=1e-15)
    same = exact_problem_metrics([0.3, 0.1], ks=[3], group_size=2)  # the logged exact metrics, at every k
    assert (passes[2], coverage[2]) == pytest.approx((same["pass_at_3"], same["coverage_at_3"]), abs=1e-15)


def test_sampled_curves_by_hand_and_by_brute_force():
    """n = 8 samples, c = 2 correct, two distinct correct answers (one each), |C| = 3.
    pass@1 = 2/8, pass@2 = 1 - C(6,2)/C(8,2) = 13/28; coverage@1 = (1/8 + 1/8)/3 = 1/12,
    coverage@2 = 2 (1 - C(7,2)/C(8,2)) / 3 = 1/6; k >= 3 has n < 4k: NaN."""
    passes, coverage = sampled_curves(8, 2, [1, 1], 3, 4)
    assert passes[:2] == pytest.approx([0.25, 13 / 28], abs=1e-15)
    assert coverage[:2] == pytest.approx([1 / 12, 1 / 6], abs=1e-15)
    assert np.isnan(passes[2:]).all() and np.isnan(coverage[2:]).all()
    # every k-subset of n = 16 samples (answers a a a b, two wrong-but-answered, the rest no answer), |C| = 4
    samples = ["a"] * 3 + ["b"] + ["x"] * 2 + [None] * 10
    passes, coverage = sampled_curves(16, 4, [3, 1], 4, 4)
    for k in (1, 2, 3, 4):
        subsets = list(itertools.combinations(samples, k))
        assert passes[k - 1] == pytest.approx(np.mean([any(s in "ab" for s in sub if s) for sub in subsets]))
        assert coverage[k - 1] == pytest.approx(np.mean([len({s for s in sub if s in ("a", "b")}) / 4
                                                         for sub in subsets]))
        assert passes[k - 1] == pytest.approx(pass_at_k(16, 4, k), abs=1e-14)
    assert np.isnan(sampled_curves(16, 4, [3, 1], None, 4)[1]).all()  # no |C|: no coverage


def test_the_n_at_least_4k_rule():
    assert SAMPLES_PER_K == 4
    assert reportable_ks(64, 64) == list(range(1, 17)) and reportable_ks(None, 64) == list(range(1, 65))
    assert reportable_ks(256, 64) == list(range(1, 65)) and reportable_ks(3, 64) == []
    passes, _ = sampled_curves(64, 10, [], None, 64)
    assert np.isfinite(passes[:16]).all() and np.isnan(passes[16:]).all()
    note = too_few_samples(64, 64)
    assert note is not None and "k = 17..64 left out" in note and "raise --n to 256" in note and "\n" not in note
    assert too_few_samples(256, 64) is None


def _exact_row(p):
    return {"n": 8, "c": 0, "p_correct": list(p)}


def test_report_curve_on_a_tiny_pairs_like_distribution():
    """2 seeds x 2 problems, exact: the mean at k = 2 is the hand-computed mean of 1 - (1 - Z)^2 and of the
    coverage; the band is the report's crossed interval of the seeds x problems matrix; all 64 ks are reported."""
    seeds = [[(0.3, 0.1), (0.2, 0.2)], [(0.4, 0.0), (0.1, 0.1)]]
    points, note = curve_points({"ucpo": [[_exact_row(p) for p in seed] for seed in seeds]}, "pairs")
    assert note is None
    assert {(p.metric, p.k) for p in points} == {(m, k) for m in ("pass_at_k", "coverage_at_k") for k in range(1, 65)}
    at = {(p.metric, p.k): p for p in points}
    z = np.array([[0.4, 0.4], [0.4, 0.2]])
    x = 1 - (1 - z) ** 2
    assert at[("pass_at_k", 2)].mean == pytest.approx((0.64 * 3 + 0.36) / 4, abs=1e-15)
    iv = stats.crossed_interval(x)
    assert (at[("pass_at_k", 2)].ci_low, at[("pass_at_k", 2)].ci_high) == pytest.approx((iv.low, iv.high), abs=1e-12)
    cover = np.array([[(0.51 + 0.19) / 2, 0.36], [0.64 / 2, 0.19]])
    assert at[("coverage_at_k", 2)].mean == pytest.approx(cover.mean(), abs=1e-15)
    assert at[("pass_at_k", 1)].estimate == "exact" and at[("pass_at_k", 1)].n_seeds == 2
    text = to_csv(points)
    assert text.splitlines()[0] == ",".join(COLUMNS)
    first = text.splitlines()[1].split(",")
    assert first[:4] == ["ucpo", "pairs", "1", "pass_at_k"] and float(first[4]) == pytest.approx(0.35, abs=1e-15)
    assert first[7:] == ["2", "exact"] and len(text.splitlines()) == 1 + 2 * 64


def test_report_curve_from_samples_leaves_out_k_above_n_over_4():
    rows = [[{"n": 16, "c": c, "correct_forms": [c] if c else [], "correct_set": 2} for c in (0, 3, 8)]
            for _ in range(3)]
    points, note = curve_points({"grpo": rows}, "pairs")
    assert {p.k for p in points} == {1, 2, 3, 4} and {p.estimate for p in points} == {"unbiased"}
    assert note is not None and "raise --n to 256" in note
    one_seed, _ = curve_points({"grpo": rows[:1]}, "pairs")
    assert all(math.isnan(p.ci_low) and p.n_seeds == 1 for p in one_seed)  # a band needs 2 seeds
    no_set, _ = curve_points({"grpo": [[{"n": 16, "c": 3, "correct_forms": [3]}] * 2] * 2}, "countdown")
    assert {p.metric for p in no_set} == {"pass_at_k"}  # coverage needs the correct set's size


def test_problem_interval_by_hand():
    """x = (0, 0.5, 1, 0.5): mean 0.5, sd = sqrt(1/6), se = sd/2, half-width t_{.975,3} se."""
    mean, se, low, high = problem_interval([0, 0.5, 1, 0.5, math.nan])
    assert (mean, se) == pytest.approx((0.5, math.sqrt(1 / 6) / 2), abs=1e-15)
    assert high - mean == pytest.approx(sps.t.ppf(0.975, 3) * se, abs=1e-12) and mean - low == pytest.approx(high - mean)
    assert math.isnan(problem_interval([0.3])[1])


def test_problem_interval_covers_the_population_pass_at_k():
    """Monte Carlo (seed 7, 5,000 benchmarks of 40 problems, p ~ Beta(0.6, 1.2), n = 16 samples, pass@4): the
    t-interval over problems covers the population pass@4 E[1 - (1 - p)^4] = 0.614 in 0.943 of the benchmarks
    (seeds 8, 9: 0.940, 0.956; binomial SE 0.003; skewed per-problem values keep it a little under 0.95); the
    assertion fails below 0.93 or above 0.965."""
    rng = np.random.default_rng(7)
    n, k, reps, problems = 16, 4, 5000, 40
    a, b = 0.6, 1.2
    truth = 1 - math.exp(math.lgamma(a + b) + math.lgamma(b + k) - math.lgamma(b) - math.lgamma(a + b + k))
    table = np.array([pass_at_k(n, c, k) for c in range(n + 1)])
    c = rng.binomial(n, rng.beta(a, b, size=(reps, problems)))
    covered = [low <= truth <= high for _, _, low, high in (problem_interval(table[row]) for row in c)]
    assert 0.93 <= np.mean(covered) <= 0.965, np.mean(covered)


def test_sampled_coverage_is_unbiased_for_the_exact_coverage():
    """Monte Carlo (seed 3, 20,000 draws of n = 16 samples from p = (0.3, 0.1, 0.05) on |C| = 3 and 0.55 wrong):
    the mean sampled coverage@4 is the exact one within 4 standard errors."""
    rng = np.random.default_rng(3)
    p = np.array([0.3, 0.1, 0.05])
    counts = rng.multinomial(16, [*p, 1 - p.sum()], size=20_000)
    values = np.array([sampled_curves(16, int(row[:3].sum()), row[:3], 3, 4)[1][3] for row in counts])
    exact = exact_curves(p, 4)[1][3]
    assert abs(values.mean() - exact) < 4 * values.std() / math.sqrt(len(values)), (values.mean(), exact)


def test_the_printed_table_has_the_per_problem_se_and_interval():
    """`rlvrlab eval pass-at-k` prints each mean with its per-problem se and 95% t-interval, and marks k > n/4."""
    records = [{"dataset": "pairs", "id": str(i), "source": "pairs", "n": 4, "c": c, "avg@n": c / 4,
                "pass@1": c / 4, "pass@4": float(c > 0), "maj@1": c / 4, "maj@4": float(c > 2), "diversity": None,
                "correct_distinct": 0, "no_answer": 0, "reasons": {"correct": c}} for i, c in enumerate((0, 2, 4, 2))]
    console = Console(record=True, width=200)
    print_table(console, summary_table(aggregate(records, [1, 4]), [1, 4], 4))
    text = console.export_text()
    half = sps.t.ppf(0.975, 3) * math.sqrt(1 / 6) / 2
    assert f"0.500 (se 0.204) [{0.5 - half:.3f}, {0.5 + half:.3f}]" in text  # pass@1 = (0, 0.5, 1, 0.5)
    assert "pass@4 †" in text and "pass@1 †" not in text and "raise --n to 16" in text


def test_report_writes_the_curve_csv_and_plot(tmp_path, capsys):
    """passk_curve.write over the evaluation runs the report used: the CSV, a PNG per dataset, the note on stderr."""
    import csv

    from rlvrlab.report.collect import EvalRecords
    from rlvrlab.report.passk_curve import write

    def rows(shift: float) -> list[dict]:
        return [{"dataset": "pairs", "id": f"p{i}", "n": 32, "c": 3 + i, "correct_forms": [2, 1 + i],
                 "correct_set": 4, "p_correct": [0.1 + shift, 0.05 * i]} for i in range(3)]

    seeds = [rows(0.01 * s) for s in range(4)]
    evals = EvalRecords({"pairs": ["p0", "p1", "p2"]}, {}, {"grpo": ["e0", "e1"], "ucpo": ["e2", "e3"]}, [],
                        {"pairs": {"grpo": seeds[:2], "ucpo": seeds[2:]}})
    written = write(evals, tmp_path)
    assert [p.name for p in written] == ["passk_curve.csv", "passk_curve_pairs.png"]
    table = list(csv.DictReader((tmp_path / "passk_curve.csv").open()))
    assert len(table) == 2 * 2 * 64 and {r["estimate"] for r in table} == {"exact"}
    for row in table:
        assert float(row["ci_low"]) <= float(row["mean"]) <= float(row["ci_high"]) and row["n_seeds"] == "2"
    del seeds[1][0]["p_correct"]  # one record without exact values: the group falls back to samples
    write(evals, tmp_path, plot=False)
    grpo = [r for r in csv.DictReader((tmp_path / "passk_curve.csv").open()) if r["group"] == "grpo"]
    assert max(int(r["k"]) for r in grpo) == 8 and {r["estimate"] for r in grpo} == {"unbiased"}
    assert "note: pairs: pass@k and coverage@k for k = 9..64 left out" in capsys.readouterr().err


@pytest.mark.slow
def test_report_on_pairs_runs_has_exact_curves(tmp_path):
    """Two tiny seed runs on pairs, `rlvrlab eval pass-at-k --runs-of` (top_p = 1: exact p_correct in the records),
    `rlvrlab report`: passk_curve.csv has both metrics at every k = 1..64, exact, with 2-seed crossed bands."""
    import csv
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    runs = tmp_path / "runs"
    for seed in range(2):
        train(compose("pairs", [f"seed={seed}", "model.warm_start_seed=0", f"output_dir={runs}", "experiment=pk",
                                "steps=2", "trainer.checkpoint_every=2", "trainer.eval_every=0",
                                "rollout.prompts_per_step=4", "rollout.group_size=4"]))
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, "RLVRLAB_NO_PROGRESS": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        executable = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))
        return subprocess.run([str(executable), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)

    result = cli("eval", "pass-at-k", "--runs-of", "pk", "--output-dir", str(runs), "--limit", "6", "--n", "8",
                 "--k", "1,4", "--out", str(tmp_path / "evals"))
    assert result.returncode == 0, result.stderr
    assert "pass@4 †" in result.stdout and "(se " in result.stdout
    result = cli("report", "--experiment", "pk", "--output-dir", str(runs), "--out", "rep", "--allow-dirty")
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader((tmp_path / "rep" / "passk_curve.csv").open()))
    assert {(r["metric"], int(r["k"])) for r in rows} == {(m, k) for m in ("pass_at_k", "coverage_at_k")
                                                          for k in range(1, 65)}
    assert {r["estimate"] for r in rows} == {"exact"} and {r["n_seeds"] for r in rows} == {"2"}
    assert all(float(r["ci_low"]) <= float(r["mean"]) <= float(r["ci_high"]) for r in rows)
    assert (tmp_path / "rep" / "passk_curve_pairs.png").is_file()


def test_the_printed_table_over_seeds_has_the_crossed_interval():
    """`rlvrlab eval pass-at-k --study/--runs-of`: per configuration with 2+ seeds, the crossed seeds x problems
    interval of the report (the same numbers as stats.crossed_interval of the seeds x problems matrix)."""
    from rlvrlab.eval.pipeline import EvalOutcome

    matrix = np.array([[0.0, 0.5, 1.0], [0.25, 0.5, 0.75], [0.0, 0.75, 1.0]])

    def outcome(seed_values, config):
        records = [{"dataset": "pairs", "id": f"p{i}", "avg@n": v, "pass@1": v, "maj@1": v}
                   for i, v in enumerate(seed_values)]
        return EvalOutcome("t", {}, [1], 4, records=records, config_hash=config)

    console = Console(record=True, width=200)
    print_table(console, seeds_table([outcome(row, "abc") for row in matrix] + [outcome(matrix[0], "lonely")]))
    text = console.export_text()
    iv = stats.crossed_interval(matrix)
    assert f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]" in text and "pass@1" in text and "lonely" not in text
    assert seeds_table([outcome(matrix[0], "abc"), outcome(matrix[1], "")]) is None  # one seed, one --model


def test_the_curve_plot_draws_coverage_only_where_the_task_lists_its_answers(tmp_path) -> None:
    """Countdown cannot list its correct answers, so it has pass@k and no coverage@k: one panel, not an empty one."""
    from matplotlib import image

    from rlvrlab.report import plots
    from rlvrlab.report.passk_curve import CurvePoint

    def points(metrics):
        return [CurvePoint("grpo", "d", k, m, 0.5, 0.4, 0.6, 2, "unbiased") for m in metrics for k in (1, 2, 4)]

    one = image.imread(plots.passk_coverage_curves(points(["pass_at_k"]), "one", tmp_path))
    two = image.imread(plots.passk_coverage_curves(points(["pass_at_k", "coverage_at_k"]), "two", tmp_path))
    assert two.shape[1] == pytest.approx(2 * one.shape[1], rel=0.02)
