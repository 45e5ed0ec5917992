"""The report's statistics: hand-worked values, agreement with rliable's stratified bootstrap where both apply,
coverage near 95% on synthetic data with known variance, pairing, Holm, and reproducibility from the seed."""

from __future__ import annotations

import numpy as np
import pytest

from rlvrlab.report import stats


def test_probability_of_improvement_and_holm_by_hand() -> None:
    a, b = np.array([3.0, 1.0, 2.0]), np.array([2.0, 0.0])
    # pairs (x > y): 3>2, 3>0, 1>0, 2>0 -> 4 of 6; ties: 2=2 -> 1 of 6, counted half
    assert stats.probability_of_improvement(a, b) == pytest.approx(4.5 / 6)
    # seed scores of [S, P] inputs are means over problems
    assert stats.probability_of_improvement(np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]])) == 1.0
    # Holm: sorted p (0.01, 0.02, 0.04) x (3, 2, 1) -> 0.03, 0.04, 0.04 (monotone), in input order
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_same_seed_same_numbers() -> None:
    x = np.random.default_rng(3).normal(size=(5, 40))
    first = stats.two_level_interval(x, np.random.default_rng(7))
    again = stats.two_level_interval(x, np.random.default_rng(7))
    assert first == again
    assert stats.two_level_interval(x, np.random.default_rng(8)) != first


def test_seed_interval_matches_rliable_stratified_bootstrap() -> None:
    """With one task, rliable's stratified bootstrap of the mean resamples runs: the same estimator."""
    from rliable import library as rly
    from rliable import metrics

    rng = np.random.default_rng(0)
    for seeds in (5, 10):
        scores = rng.normal(0.4, 0.1, size=seeds)
        (_, cis) = rly.get_interval_estimates({"a": scores[:, None]},
                                              lambda s: np.array([metrics.aggregate_mean(s)]), reps=20_000)
        theirs = cis["a"][:, 0]
        ours = stats.seed_interval(scores, np.random.default_rng(1), reps=20_000)
        width = theirs[1] - theirs[0]
        assert ours.low == pytest.approx(theirs[0], abs=0.05 * width)
        assert ours.high == pytest.approx(theirs[1], abs=0.05 * width)
        # the two-level interval of a [S, 1] matrix is the same estimator again
        two = stats.two_level_interval(scores[:, None], np.random.default_rng(2), reps=20_000)
        assert two.low == pytest.approx(theirs[0], abs=0.05 * width)


def test_two_level_interval_width_matches_the_analytic_variance() -> None:
    """Crossed design x[s, p] = mu + a_s + b_p + e_sp: Var(grand mean) = sa²/S + sb²/P + se²/(SP). The two-way
    bootstrap estimates sa²/S + sb²/P + ~2 se²/(SP) (it counts the noise in both margins), so with se small
    its standard error matches the analytic one."""
    rng = np.random.default_rng(0)
    seeds, problems, sa, sb, se = 40, 400, 0.05, 0.2, 0.02
    x = 0.5 + rng.normal(0, sa, (seeds, 1)) + rng.normal(0, sb, (1, problems)) + rng.normal(0, se, (seeds, problems))
    reps = stats._replicates(x, np.random.default_rng(1), 20_000)
    analytic = np.sqrt(sa**2 / seeds + sb**2 / problems + se**2 / (seeds * problems))
    assert reps.std() == pytest.approx(analytic, rel=0.15)
    # seeds only: the bootstrap SE of a mean over S iid normal seeds ~ sigma/sqrt(S) * sqrt((S-1)/S)
    scores = rng.normal(0, 1.0, 400)
    assert stats._replicates(scores, np.random.default_rng(2), 20_000).std() == pytest.approx(1 / 20, rel=0.1)


@pytest.mark.slow
def test_coverage_near_95_percent_over_repeated_draws() -> None:
    """Draw seeds and problems afresh 300 times from a population with known mean; the two-level interval must
    contain it about 95% of the time (percentile bootstraps under-cover a little with few seeds)."""
    rng = np.random.default_rng(123)
    mu, seeds, problems, hits, draws = 0.5, 10, 60, 0, 300
    for _ in range(draws):
        x = mu + rng.normal(0, 0.05, (seeds, 1)) + rng.normal(0, 0.15, (1, problems)) + \
            rng.normal(0, 0.1, (seeds, problems))
        interval = stats.two_level_interval(x, rng, reps=1000)
        hits += interval.low <= mu <= interval.high
    assert 0.90 <= hits / draws <= 0.99
    # seed-only intervals on seed-level data (20 seeds)
    hits = 0
    for _ in range(draws):
        interval = stats.seed_interval(rng.normal(mu, 0.1, 20), rng, reps=1000)
        hits += interval.low <= mu <= interval.high
    assert 0.88 <= hits / draws <= 0.99


def test_paired_difference_uses_shared_problems() -> None:
    """Two groups that differ by a constant 0.05 on every problem, with large problem-to-problem spread: pairing
    cancels the spread, so the interval of the difference is narrow and excludes 0; unpaired it would not."""
    rng = np.random.default_rng(0)
    problems = rng.uniform(0, 1, size=(1, 200))
    a = np.repeat(problems + 0.05, 4, axis=0) + rng.normal(0, 0.005, (4, 200))
    b = np.repeat(problems, 4, axis=0) + rng.normal(0, 0.005, (4, 200))
    result = stats.difference(a, b, np.random.default_rng(1), reps=5000)
    assert result.delta == pytest.approx(0.05, abs=0.002)
    assert 0.04 < result.low < result.high < 0.06 and result.p < 0.01 and result.prob_improvement == 1.0
    # the unpaired width (independent problem resampling) is ~50x larger
    unpaired = stats._replicates(a, np.random.default_rng(2), 5000) - stats._replicates(b, np.random.default_rng(3),
                                                                                          5000)
    assert np.percentile(unpaired, 97.5) - np.percentile(unpaired, 2.5) > 10 * (result.high - result.low)
    # no difference: p is large
    same = stats.difference(b, b + rng.normal(0, 0.005, b.shape), np.random.default_rng(4), reps=5000)
    assert same.p > 0.05
    with pytest.raises(ValueError, match="same problems"):
        stats.difference(a, b[:, :10], rng)


def test_curve_band_contains_the_mean() -> None:
    x = np.random.default_rng(0).normal(size=(6, 30))
    mean, low, high = stats.curve_band(x, np.random.default_rng(1))
    assert mean.shape == low.shape == high.shape == (30,)
    assert np.all(low <= mean) and np.all(mean <= high)


def test_failed_seeds_are_counted_not_hidden(tmp_path):
    """Runs that ended FAILED stay out of the means, but each group says how many of its seeds failed, and a
    configuration none of whose seeds finished is named in the notes (a diverging algorithm must not vanish)."""
    from mlflow.tracking import MlflowClient

    from rlvrlab.report.collect import select
    from rlvrlab.report.render import markdown
    from rlvrlab.report.table import build

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("study", artifact_location=str(tmp_path / "art"))

    def run(config_hash: str, algorithm: str, seed: int, status: str) -> None:
        r = client.create_run(experiment, tags={"config_hash": config_hash, "seed": str(seed)})
        client.log_param(r.info.run_id, "algorithm.name", algorithm)
        client.log_param(r.info.run_id, "seed", str(seed))
        for step in range(3):
            client.log_metric(r.info.run_id, "train/reward", 0.1 * seed, step=step)
        client.set_terminated(r.info.run_id, status)

    for seed in range(3):
        run("aaa", "dapo", seed, "FINISHED")
        run("bbb", "up_dapo", seed, "FINISHED")
        run("ccc", "offpolicy_reinforce", seed, "FAILED")
    run("aaa", "dapo", 3, "FAILED")
    run("aaa", "dapo", 4, "FAILED")
    run("bbb", "up_dapo", 2, "FAILED")  # an earlier failure of a seed that later finished: not counted
    selection = select(uri, experiment="study")
    assert {g.label: g.seeds_text for g in selection.groups} == {"dapo": "3 (+2 failed)", "up_dapo": "3"}
    assert selection.failed_only == ["config ccc (offpolicy_reinforce): all 3 seeds FAILED"]
    report = build(client, selection, metrics=["train/reward"], last=2, reduce="mean", evals=None, eval_stats=[],
                   baseline=None, seed=0, reps=200)
    text = markdown(report)
    assert "| dapo | 3 (+2 failed) |" in text and "all 3 seeds FAILED" in text


def test_a_study_with_variants_labels_groups_by_variant_name(tmp_path):
    """Seed runs are named by their trial's variant (plus other swept keys that differ), not by config keys."""
    from mlflow.tracking import MlflowClient

    from rlvrlab.report.collect import select

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("s", artifact_location=str(tmp_path / "art"))
    study = client.create_run(experiment, tags={"rlvrlab.role": "study"})
    (tmp_path / "sweep.yaml").write_text("variants: {a: [algorithm=grpo]}\nspace: {trainer.staleness: [1, 4]}\n")
    client.log_artifact(study.info.run_id, str(tmp_path / "sweep.yaml"))
    for variant, algorithm in (("grpo", "grpo"), ("ent_reg 0.05", "ent_reg")):
        for staleness in (1, 4):
            trial = client.create_run(experiment, tags={"rlvrlab.role": "trial",
                                                        "mlflow.parentRunId": study.info.run_id})
            client.log_param(trial.info.run_id, "variant", variant)
            for seed in range(2):
                r = client.create_run(experiment, tags={"rlvrlab.role": "seed", "config_hash": f"{algorithm}{staleness}",
                                                        "seed": str(seed), "mlflow.parentRunId": trial.info.run_id})
                for key, value in (("algorithm.name", algorithm), ("trainer.staleness", staleness),
                                   ("algorithm.entropy_coef", 0.05 if algorithm == "ent_reg" else 0.0)):
                    client.log_param(r.info.run_id, key, str(value))
                client.set_terminated(r.info.run_id, "FINISHED")
    labels = sorted(g.label for g in select(uri, study="s").groups)
    assert labels == ["ent_reg 0.05 staleness=1", "ent_reg 0.05 staleness=4", "grpo staleness=1", "grpo staleness=4"]
