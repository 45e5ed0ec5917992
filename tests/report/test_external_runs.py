"""`rlvrlab report --experiment NAME --group-by KEY --seed-key KEY` over runs rlvrlab did not launch: runs written
with plain `mlflow` calls, as TRL's MLflowCallback or verl's MLflow logger write them (params, tags, metric
histories under the trainer's own names), are grouped by a param, paired by their seed param, and reported with the
statistics of rlvrlab's own runs; runs without a git commit tag are marked and kept out of results/."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from typer.testing import CliRunner

from rlvrlab.cli.main import app
from rlvrlab.errors import RlvrlabError

ROOT = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"
STEPS = 20
LAST = 5  # --metric reward:mean:5
PAIRED_SEEDS = [1, 2, 3, 4, 5]  # lr=1e-05 and lr=3e-05: the same seeds, paired t
OTHER_SEEDS = [11, 12, 13, 14, 15]  # lr=0.0001: other seeds, Welch against the baseline
REWARD, SCORE = f"reward:mean:{LAST}", f"critic/score/mean:max:{LAST}"  # TRL's and verl's names, reduced


def _history(rng: np.random.Generator, level: float, seed_effect: float) -> tuple[list[float], list[float]]:
    """(reward, critic/score/mean) per step: a rising curve, the seed's offset, noise."""
    steps = np.arange(STEPS)
    reward = level * (1 - np.exp(-steps / 6)) + seed_effect + rng.normal(0, 0.02, STEPS)
    return reward.tolist(), (reward + rng.normal(0, 0.05, STEPS)).tolist()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An experiment `trl` in a sqlite store, written as another trainer would (mlflow's fluent API): runs with
    params lr and seed, a commit tag on all but one, a RUNNING run and a FAILED one. Returns the uri and, per run,
    its reward and critic/score/mean histories."""
    import mlflow
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("external")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    rng = np.random.default_rng(38)
    seed_effect = {s: rng.normal(0, 0.1) for s in [*PAIRED_SEEDS, *OTHER_SEEDS]}
    plan = [(1e-5, s, 0.5, "FINISHED") for s in PAIRED_SEEDS] + [(3e-5, s, 0.6, "FINISHED") for s in PAIRED_SEEDS] \
        + [(1e-4, s, 0.55, "FINISHED") for s in OTHER_SEEDS] + [(1e-4, 16, 0.55, "FAILED")]
    histories: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
    ids: dict[tuple[str, int], str] = {}
    try:
        experiment = mlflow.create_experiment("trl", artifact_location=str(folder / "artifacts"))
        for lr, seed, level, status in plan:
            reward, score = _history(rng, level, seed_effect.get(seed, 0.0))
            with mlflow.start_run(experiment_id=experiment, run_name=f"lr{lr}-s{seed}") as run:
                mlflow.log_params({"lr": lr, "seed": seed, "per_device_train_batch_size": 8})
                mlflow.set_tag("trainer", "trl")
                unknown = (lr, seed) == (3e-5, 5)
                if unknown:  # mlflow tags a run started from a git checkout itself: this one is not
                    if "mlflow.source.git.commit" in MlflowClient().get_run(run.info.run_id).data.tags:
                        MlflowClient().delete_tag(run.info.run_id, "mlflow.source.git.commit")
                else:
                    mlflow.set_tag("mlflow.source.git.commit", SHA)
                last = STEPS if status == "FINISHED" else 7
                for step in range(last):
                    mlflow.log_metrics({"reward": reward[step], "critic/score/mean": score[step]}, step=step)
                if status != "FINISHED":
                    mlflow.end_run(status=status)
            histories[(str(lr), seed)] = (reward, score)
            ids[(str(lr), seed)] = run.info.run_id
        running = MlflowClient().create_run(experiment, run_name="still-training")  # RUNNING: being written
        MlflowClient().log_param(running.info.run_id, "lr", 1e-5)
        MlflowClient().log_param(running.info.run_id, "seed", 6)
        MlflowClient().log_metric(running.info.run_id, "reward", 0.1, step=0)
        ids[("running", 6)] = running.info.run_id
    finally:
        mlflow.set_tracking_uri(previous)
    return {"uri": uri, "histories": histories, "ids": ids, "folder": folder}


def _report(*args: str):
    return CliRunner().invoke(app, ["report", *args])


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _one_line_error(result, *fragments: str) -> None:
    """The command raised a RlvrlabError (rlvrlab.cli.main prints it as one red line) with a one-line message."""
    assert isinstance(result.exception, RlvrlabError), (result.output, result.exception)
    text = str(result.exception)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, text


def _interval(x: np.ndarray) -> tuple[float, float]:
    return scipy.stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy.stats.sem(x))


def test_report_groups_pairs_and_marks_runs_rlvrlab_did_not_launch(store: dict, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups by lr, paired t where the seeds match and Welch where they do not, intervals and p-values equal to
    scipy's on the same per-seed values, Holm over the family by hand, FAILED counted, RUNNING excluded and counted,
    the run without a commit tag marked as unknown provenance."""
    monkeypatch.setenv("RLVRLAB_RESULTS_DIR", str(tmp_path / "results"))
    out = tmp_path / "elsewhere"
    result = _report("--experiment", "trl", "--group-by", "lr", "--seed-key", "seed", "--tracking-uri", store["uri"],
                     "--metric", f"{REWARD},{SCORE}", "--baseline", "lr=1e-05",
                     "--out", str(out), "--no-plots", "--format", "md,csv")
    assert result.exit_code == 0, (result.output, result.exception)

    table = {(r["group"], r["metric"]): r for r in _rows(out / "table.csv")}
    assert sorted({g for g, _ in table}) == ["lr=0.0001", "lr=1e-05", "lr=3e-05"]
    cell = table[("lr=0.0001", REWARD)]
    assert cell["seeds"] == "11 12 13 14 15" and cell["failed_seeds"] == "16"
    assert table[("lr=1e-05", REWARD)]["seeds"] == "1 2 3 4 5"  # the RUNNING seed 6 is not in it

    def values(lr: str, metric: int, reduce=np.mean) -> np.ndarray:
        seeds = OTHER_SEEDS if lr == "0.0001" else PAIRED_SEEDS
        return np.array([reduce(store["histories"][(lr, s)][metric][-LAST:]) for s in seeds])

    x = {lr: values(lr, 0) for lr in ("1e-05", "3e-05", "0.0001")}
    per_seed = {(r["group"], r["metric"], int(r["seed"])): float(r["value"]) for r in _rows(out / "per_seed.csv")}
    for lr, v in x.items():
        seeds = OTHER_SEEDS if lr == "0.0001" else PAIRED_SEEDS
        assert [per_seed[(f"lr={lr}", REWARD, s)] for s in seeds] == pytest.approx(v, rel=1e-12)
        c = table[(f"lr={lr}", REWARD)]
        assert (float(c["mean"]), float(c["low"]), float(c["high"])) == pytest.approx((v.mean(), *_interval(v)),
                                                                                    rel=1e-10)
    maxima = values("3e-05", 1, np.max)
    assert [per_seed[("lr=3e-05", SCORE, s)] for s in PAIRED_SEEDS] == pytest.approx(maxima)

    rows = {(r["a"], r["metric"]): r for r in _rows(out / "comparisons.csv")}
    assert len(rows) == 4  # 2 groups vs the baseline x 2 metrics: one Holm family
    paired, welch = rows[("lr=3e-05", REWARD)], rows[("lr=0.0001", REWARD)]
    assert paired["test"] == "paired t" and paired["paired"] == "True"
    assert welch["test"] == "Welch" and welch["paired"] == "False"
    rel = scipy.stats.ttest_rel(x["3e-05"], x["1e-05"])
    ind = scipy.stats.ttest_ind(x["0.0001"], x["1e-05"], equal_var=False)
    for row, test in ((paired, rel), (welch, ind)):
        ci = test.confidence_interval(0.95)
        assert (float(row["p"]), float(row["low"]), float(row["high"])) == pytest.approx(
            (test.pvalue, ci.low, ci.high), rel=1e-9)
    ps = sorted(float(r["p"]) for r in rows.values())
    holm = np.maximum.accumulate([min(1.0, (len(ps) - i) * p) for i, p in enumerate(ps)])
    assert sorted(float(r["p_holm"]) for r in rows.values()) == pytest.approx(holm, rel=1e-12)

    recompute = subprocess.run([sys.executable, str(ROOT / "results" / "recompute.py"), str(out)],
                               capture_output=True, text=True, timeout=120)  # numpy and scipy, without rlvrlab
    last = recompute.stdout.strip().splitlines()[-1]
    assert last.startswith("largest difference: ") and float(last.split()[2]) <= 1e-12, recompute.stdout

    md = " ".join((out / "table.md").read_text().split())
    unknown = store["ids"][("3e-05", 5)]
    assert f"UNKNOWN PROVENANCE for 1 of 16 runs (no git commit tag: {unknown[:7]}" in md
    assert f"other runs from commit {SHA[:7]}" in md
    assert f"excluded: 1 run RUNNING, still running ({store['ids'][('running', 6)][:7]})" in md
    assert "5 (+1 failed)" in md and "initial model" not in md


def test_unknown_provenance_is_refused_in_results(store: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default folder (results/<experiment>) is the published one: the unknown run is refused there, by id."""
    monkeypatch.setenv("RLVRLAB_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.chdir(tmp_path)
    result = _report("--experiment", "trl", "--group-by", "params.lr", "--tracking-uri", store["uri"],
                     "--metric", "reward", "--no-plots")
    _one_line_error(result, "1 of the 16 runs behind this table have unknown provenance",
                    store["ids"][("3e-05", 5)], "mlflow.set_tag('mlflow.source.git.commit', SHA)", "--out")
    assert not (tmp_path / "results").exists()


def test_bad_selections_are_one_line_errors(store: dict) -> None:
    uri = store["uri"]
    _one_line_error(_report("--experiment", "trl", "--study", "trl", "--tracking-uri", uri),
                    "give exactly one of --experiment NAME, --study NAME")
    _one_line_error(_report("--study", "trl", "--group-by", "lr", "--tracking-uri", uri),
                    "--group-by groups the runs of --experiment NAME or --runs")
    _one_line_error(_report("--experiment", "trl", "--group-by", "tags.lr", "--tracking-uri", uri),
                    "--group-by 'tags.lr': the finished runs of 'trl' have no tag 'lr'; did you mean 'params.lr'?")
    _one_line_error(_report("--experiment", "trl", "--group-by", "trainer", "--tracking-uri", uri),
                    "both have seed 1", "--group-by")
    _one_line_error(_report("--experiment", "trl", "--group-by", "lr", "--seed-key", "trainer",
                            "--tracking-uri", uri), "trainer='trl', not an integer seed")
    _one_line_error(_report("--experiment", "trl", "--seed-key", "seed", "--tracking-uri", uri),
                    "--seed-key pairs runs grouped with --group-by")


def test_a_key_no_run_has_gets_a_did_you_mean(store: dict) -> None:
    """A --group-by or --seed-key key that none of the finished runs has is a misspelling until shown otherwise: the
    error offers the closest param or tag (as for metrics and experiments) and names those the runs have; a key
    only some runs lack keeps the error that names the run."""
    uri = store["uri"]
    _one_line_error(_report("--experiment", "trl", "--group-by", "lrr", "--tracking-uri", uri),
                    "--group-by 'lrr': the finished runs of 'trl' have no param or tag 'lrr'; did you mean 'lr'?",
                    "they have: lr, per_device_train_batch_size, seed, tags.trainer")
    _one_line_error(_report("--experiment", "trl", "--group-by", "lr", "--seed-key", "sed", "--tracking-uri", uri),
                    "--seed-key 'sed': the finished runs of 'trl' have no param or tag 'sed'; did you mean 'seed'?")
    _one_line_error(_report("--experiment", "trl", "--group-by", "params.trainr", "--tracking-uri", uri),
                    "have no param 'trainr'; did you mean 'tags.trainer'?")
    _one_line_error(_report("--experiment", "trl", "--group-by", "lr", "--seed-key", "params.sead",
                            "--tracking-uri", uri), "--seed-key 'params.sead'", "did you mean 'params.seed'?")
    result = _report("--experiment", "trl", "--group-by", "zzzz", "--tracking-uri", uri)
    _one_line_error(result, "have no param or tag 'zzzz'; they have:")
    assert "did you mean" not in str(result.exception) and "mlflow.runName" not in str(result.exception)
