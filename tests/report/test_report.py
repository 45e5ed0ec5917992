"""`rlvrlab report` end to end: on a toy sweep's records and on tiny-tier runs with `rlvrlab eval pass-at-k`
records it writes markdown, LaTeX, CSV, PNGs and a sources sidecar whose numbers trace back to MLflow; bad
selections are one-line errors that say what exists."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlvrlab.report import collect

RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))

SWEEP = """\
experiment: toy
overrides: [algorithm=ucpo, steps=10, trainer.checkpoint_every=0]
sampler: grid
seeds: 3
space:
  algorithm.tau: [0.0, 1.0]
  trainer.staleness: [0, 1]
objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 3}
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([RLVRLAB, *args], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if k != "COLUMNS"})


def _one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.fixture(scope="module")
def toy_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toy-study")
    (folder / "grid.yaml").write_text(SWEEP)
    result = _cli("sweep", "grid.yaml", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


@pytest.mark.slow
def test_report_of_a_toy_sweep(toy_study: Path) -> None:
    result = _cli("report", "--study", "grid", "--baseline", "ucpo tau=0.0 staleness=0", "--reps", "2000",
                  cwd=toy_study)
    assert result.returncode == 0, result.stderr
    out = toy_study / "results" / "grid"
    names = {p.name for p in out.iterdir()}
    assert {"table.md", "table.tex", "table.csv", "sources.json", "curve_policy_toy_correct_uniformity.png",
            "heatmap_algorithm_tau_trainer_staleness.png"} <= names
    assert all((out / n).stat().st_size > 1000 for n in names if n.endswith(".png"))

    rows = list(csv.DictReader((out / "table.csv").open()))
    assert len(rows) == 4 and {r["group"] for r in rows} == {
        "ucpo tau=0.0 staleness=0", "ucpo tau=0.0 staleness=1", "ucpo tau=1.0 staleness=0", "ucpo tau=1.0 staleness=1"}
    # the mean of each group is the mean over its seeds of the metric's last 3 steps, read back from MLflow
    client = collect.client_for(f"sqlite:///{toy_study / 'runs' / 'mlflow.db'}")
    sources = json.loads((out / "sources.json").read_text())
    assert sources["rng_seed"] == 0 and sources["bootstrap_replicates"] == 2000 and sources["study"] == "grid"
    for group in sources["groups"]:
        assert sorted(r["seed"] for r in group["runs"]) == [0, 1, 2]
        assert all(len(r["git_sha"]) in (7, 40) or r["git_sha"] == "unknown" for r in group["runs"])
        finals = []
        for r in group["runs"]:
            series = collect.metric_series(client, r["run_id"], "policy/toy_correct_uniformity")
            finals.append(np.mean([series[s] for s in sorted(series)[-3:]]))
        row = next(x for x in rows if x["group"] == group["label"])
        assert float(row["mean"]) == pytest.approx(np.mean(finals), abs=1e-12)
        assert float(row["low"]) <= float(row["mean"]) <= float(row["high"])
        if group["label"] != "ucpo tau=0.0 staleness=0":
            assert row["p_holm"] != "" and float(row["p"]) <= float(row["p_holm"]) <= 1.0
    md = (out / "table.md").read_text()
    assert "| ucpo tau=1.0 staleness=1 | 3 |" in md and "Δ vs **ucpo tau=0.0 staleness=0**" in md
    tex = (out / "table.tex").read_text()
    assert "\\toprule" in tex and "\\textbf{" in tex and "tau=1.0" in tex

    # the same command gives the same numbers (the bootstrap seed is recorded)
    again = _cli("report", "--study", "grid", "--baseline", "ucpo tau=0.0 staleness=0", "--reps", "2000",
                 "--out", "again", "--no-plots", cwd=toy_study)
    assert again.returncode == 0, again.stderr
    assert (toy_study / "again" / "table.csv").read_text() == (out / "table.csv").read_text()


@pytest.mark.slow
def test_report_errors_are_one_line(toy_study: Path, tmp_path: Path) -> None:
    _one_line_error(_cli("report", "--study", "gird", cwd=toy_study), "unknown study 'gird'", "did you mean 'grid'")
    _one_line_error(_cli("report", "--experiment", "grid", "--metric", "train/rewrd", cwd=toy_study),
                    "unknown metric 'train/rewrd'", "train/reward")
    _one_line_error(_cli("report", "--study", "grid", "--baseline", "grpo", cwd=toy_study),
                    "--baseline 'grpo' matches no group")
    _one_line_error(_cli("report", "--study", "grid", "--format", "pdf", cwd=toy_study), "--format 'pdf'")
    _one_line_error(_cli("report", "--study", "grid", cwd=tmp_path), "no MLflow store")
    _one_line_error(_cli("report", cwd=toy_study), "exactly one of --experiment")


@pytest.mark.slow
def test_report_refuses_groups_trained_on_different_datasets(tmp_path: Path) -> None:
    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    runs = tmp_path / "runs"
    ids = [train(compose("toy", [f"output_dir={runs}", "experiment=mixed", "steps=2", "trainer.checkpoint_every=0",
                                 f"dataset.num_problems={n}"])) for n in (8, 6)]
    result = _cli("report", "--runs", ",".join(ids), cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # same dataset name, different sizes: two groups, reported
    result = _cli("report", "--experiment", "mixed", "--runs", ids[0], cwd=tmp_path)
    _one_line_error(result, "exactly one of")
    other = train(compose("default", [f"output_dir={runs}", "experiment=mixed", "steps=1", "trainer.engine=torch",
                                      "trainer.checkpoint_every=0", "rollout.prompts_per_step=2",
                                      "rollout.group_size=2"]))
    _one_line_error(_cli("report", "--runs", f"{ids[0]},{other}", cwd=tmp_path), "different datasets", "toy",
                    "countdown")


@pytest.mark.slow
def test_report_of_tiny_runs_with_evaluations(tmp_path: Path) -> None:
    """Two algorithms x 3 seeds on the tiny tier, each evaluated with `rlvrlab eval pass-at-k`; the report pairs
    problems across groups and compares with GRPO."""
    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    runs = tmp_path / "runs"
    run_ids = []
    for algorithm in ("grpo", "ucpo"):
        for seed in range(3):
            cfg = compose("default", [f"algorithm={algorithm}", f"seed={seed}", f"output_dir={runs}",
                                      "experiment=tinyexp", "steps=2", "trainer.checkpoint_every=2",
                                      "trainer.engine=torch", "rollout.prompts_per_step=4", "rollout.group_size=4"])
            run_ids.append(train(cfg))
    evaluate = ("eval", "pass-at-k", "--runs-of", "tinyexp", "--output-dir", str(runs), "--dataset", "countdown",
                "--limit", "6", "--n", "4", "--k", "1,2,4", "--out", str(tmp_path / "evals"))
    result = _cli(*evaluate, cwd=tmp_path)  # every run of the experiment, one process
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (tmp_path / "evals").iterdir()} == set(run_ids)
    again = _cli(*evaluate, cwd=tmp_path)  # nothing left to do
    assert again.returncode == 0 and "already has an evaluation" in again.stdout
    result = _cli("report", "--experiment", "tinyexp", "--baseline", "grpo", "--reps", "2000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "results" / "tinyexp"
    assert {"table.md", "table.tex", "table.csv", "passk_countdown.png", "curve_train_reward.png",
            "sources.json"} <= {p.name for p in out.iterdir()}
    rows = list(csv.DictReader((out / "table.csv").open()))
    evals = [r for r in rows if r["section"] == "countdown"]
    assert {r["metric"] for r in evals} == {"avg@n", "pass@1", "pass@2", "pass@4", "maj@4", "diversity"}
    assert {r["group"] for r in evals} == {"grpo", "ucpo"} and all(r["n_problems"] == "6" for r in evals)
    ucpo = {r["metric"]: r for r in evals if r["group"] == "ucpo"}
    assert ucpo["pass@4"]["delta"] != "" and ucpo["pass@4"]["p_holm"] != ""
    # pass@1 equals avg@n exactly (the unbiased estimator telescopes)
    assert float(ucpo["pass@1"]["mean"]) == pytest.approx(float(ucpo["avg@n"]["mean"]), abs=1e-12)
    sources = json.loads((out / "sources.json").read_text())
    assert all(len(g["eval_runs"]) == 3 for g in sources["groups"])
    # pass@k means are means over seeds of means over problems of each eval run's records
    client = collect.client_for(f"sqlite:///{runs / 'mlflow.db'}")
    records = collect.eval_records(client, collect.select(f"sqlite:///{runs / 'mlflow.db'}", experiment="tinyexp"))
    matrix = records.matrices[("ucpo", "countdown", "pass@4")]
    assert matrix.shape == (3, 6) and float(ucpo["pass@4"]["mean"]) == pytest.approx(matrix.mean(), abs=1e-12)
