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
import scipy.stats

from rlvrlab import stats
from rlvrlab.report import collect
from rlvrlab.report.columns import reduce_series

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
    result = _cli("report", "--study", "grid", "--baseline", "ucpo tau=0.0 staleness=0", cwd=toy_study)
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
    assert "Student-t" in sources["statistics"] and sources["study"] == "grid"
    per_seed = {}
    for group in sources["groups"]:
        assert sorted(r["seed"] for r in group["runs"]) == [0, 1, 2]
        assert all(len(r["git_sha"]) in (7, 40) or r["git_sha"] == "unknown" for r in group["runs"])
        finals = []
        for r in group["runs"]:
            series = collect.metric_series(client, r["run_id"], "policy/toy_correct_uniformity")
            finals.append(np.mean([series[s] for s in sorted(series)[-3:]]))
        row = next(x for x in rows if x["group"] == group["label"])
        per_seed[group["label"]] = finals
        assert float(row["mean"]) == pytest.approx(np.mean(finals), abs=1e-12)
        assert float(row["low"]) <= float(row["mean"]) <= float(row["high"])
        # the Student-t interval over the per-seed values
        half = stats.t_interval(finals).halfwidth
        assert float(row["high"]) - float(row["mean"]) == pytest.approx(half, abs=1e-12)
        if group["label"] != "ucpo tau=0.0 staleness=0":
            assert row["p_holm"] != "" and float(row["p"]) <= float(row["p_holm"]) <= 1.0
            # the same seeds 0, 1, 2 in every group: paired, and never marked significant with 3 seeds
            assert row["test"] == "paired t" and row["significant"] == "False" and float(row["mde"]) > 0
    # an independent recomputation from the per-seed numbers: scipy's paired t, statsmodels' Holm
    from scipy import stats as sps
    from statsmodels.stats.multitest import multipletests

    base = "ucpo tau=0.0 staleness=0"
    others = [r for r in rows if r["group"] != base]
    tests = [sps.ttest_rel(per_seed[r["group"]], per_seed[base]) for r in others]
    holm = multipletests([t.pvalue for t in tests], method="holm")[1]
    for r, t, adjusted in zip(others, tests, holm):
        ci = t.confidence_interval(0.95)
        assert (float(r["delta_low"]), float(r["delta_high"]), float(r["p"]), float(r["p_holm"])) == pytest.approx(
            (ci.low, ci.high, t.pvalue, adjusted), abs=1e-9)
    md = (out / "table.md").read_text()
    assert "| ucpo tau=1.0 staleness=1 | 3 |" in md and "Δ vs **ucpo tau=0.0 staleness=0**" in md
    assert "paired" in md and "MDE=" in md and "no comparison is marked" in md and "provenance:" in md
    assert "- initial model: the toy table of model.toy_init (no seed): intervals are conditional on that one " \
           "initial model; initial-model sha256 " in md
    comparisons = list(csv.DictReader((out / "comparisons.csv").open()))
    assert len(comparisons) == 3 and all(r["test"] == "paired t" and r["p_signflip"] for r in comparisons)
    tex = (out / "table.tex").read_text()
    assert "\\toprule" in tex and "\\textbf{" in tex and "tau=1.0" in tex

    # the same command gives the same numbers (no resampling)
    again = _cli("report", "--study", "grid", "--baseline", "ucpo tau=0.0 staleness=0",
                 "--out", "again", "--no-plots", cwd=toy_study)
    assert again.returncode == 0, again.stderr
    assert (toy_study / "again" / "table.csv").read_text() == (out / "table.csv").read_text()


@pytest.mark.slow
def test_sweep_status_and_report_give_identical_numbers(toy_study: Path) -> None:
    """`rlvrlab sweep --status`, the lcb95 objective and `rlvrlab report` share one interval function: on the same
    runs and window they give the same mean and bounds to the last bit."""
    from rlvrlab.sweep.objective import AGGREGATES
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import open_sweep
    from rlvrlab.sweep.summary import summarize
    from rlvrlab.tracking import tags as T

    result = _cli("report", "--study", "grid", "--out", "same", "--no-plots", "--format", "csv", cwd=toy_study)
    assert result.returncode == 0, result.stderr
    rows = {r["group"]: r for r in csv.DictReader((toy_study / "same" / "table.csv").open())}
    cwd = os.getcwd()
    os.chdir(toy_study)
    try:
        spec = load_sweep(str(toy_study / "grid.yaml"))
        opened = open_sweep(spec, create=False)
        summary = summarize(opened)
    finally:
        os.chdir(cwd)
    assert len(summary.rows) == len(rows) == 4
    for trial in summary.rows:
        label = f"ucpo tau={trial.params['algorithm.tau']} staleness={trial.params['trainer.staleness']}"
        row = rows[label]
        assert (trial.mean, trial.low, trial.high) == (float(row["mean"]), float(row["low"]), float(row["high"]))
        seed_values = opened.study.trials[trial.number].user_attrs[T.VALUES].values()
        assert AGGREGATES["lcb95"].over(list(seed_values)) == float(row["low"])
    status = _cli("sweep", "grid.yaml", "--status", cwd=toy_study)
    assert status.returncode == 0, status.stderr
    for row in rows.values():
        assert f"[{float(row['low']):.3f}, {float(row['high']):.3f}]" in status.stdout


@pytest.mark.slow
def test_report_metric_specs_pairs_selection_and_seeds_needed(toy_study: Path) -> None:
    """Several metrics with their own reduction and window, an extra pair and a selected best cell: one Holm
    family; --target-halfwidth prints the seeds each group needs."""
    result = _cli("report", "--study", "grid", "--baseline", "ucpo tau=0.0 staleness=0", "--no-plots",
                  "--metric", "policy/toy_correct_uniformity:mean:3,loss/grad_norm:max:10",
                  "--compare", "ucpo tau=1.0 staleness=1:ucpo tau=1.0 staleness=0",
                  "--compare", "best:ucpo tau=0.0 staleness=0", "--target-halfwidth", "0.01", "--out", "family",
                  cwd=toy_study)
    assert result.returncode == 0, result.stderr
    out = toy_study / "family"
    comparisons = list(csv.DictReader((out / "comparisons.csv").open()))
    # per metric: 3 baseline comparisons + 1 extra pair + 1 selected cell = 5; two metrics -> a family of 10
    assert len(comparisons) == 10
    assert {r["metric"] for r in comparisons} == {"policy/toy_correct_uniformity:mean:3", "loss/grad_norm:max:10"}
    p = [float(r["p_family"]) for r in comparisons]
    assert [float(r["p_holm"]) for r in comparisons] == pytest.approx(stats.holm(p), abs=1e-12)
    selected = [r for r in comparisons if r["selected_from"]]
    assert len(selected) == 2 and all(r["selected_from"] == "3" for r in selected)
    assert all(float(r["p_family"]) == pytest.approx(min(1.0, 3 * float(r["p"])), abs=1e-12) for r in selected)
    # the best uniformity cell is tau 1 (UCPO spreads the correct set)
    assert next(r for r in selected if r["metric"].startswith("policy/"))["a"].startswith("ucpo tau=1.0")
    cells = list(csv.DictReader((out / "table.csv").open()))
    assert all(r["seeds_needed"] for r in cells) and all(int(r["seeds_needed"]) >= 2 for r in cells)
    md = (out / "table.md").read_text()
    assert "selected: best of 3" in md and "Seeds needed for a 95% half-width of 0.01" in md
    _one_line_error(_cli("report", "--study", "grid", "--metric", "loss/grad_norm:median:5", cwd=toy_study),
                    "--metric 'loss/grad_norm:median:5'")
    _one_line_error(_cli("report", "--study", "grid", "--compare", "nope", cwd=toy_study), "--compare 'nope'")


@pytest.mark.slow
def test_a_pair_named_with_its_columns_is_tested_on_those_only(toy_study: Path) -> None:
    """A protocol lists each comparison with its endpoint; A:B[m1|m2] makes the report's Holm family exactly that
    list, not every pair on every column."""
    uniformity, grad = "policy/toy_correct_uniformity:mean:3", "loss/grad_norm:max:10"
    result = _cli("report", "--study", "grid", "--no-plots", "--metric", f"{uniformity},{grad}",
                  "--compare", f"ucpo tau=1.0 staleness=0:ucpo tau=0.0 staleness=0[{uniformity}],"
                               f"ucpo tau=1.0 staleness=1:ucpo tau=1.0 staleness=0[{grad} | {uniformity}]",
                  "--out", "named", cwd=toy_study)
    assert result.returncode == 0, result.stderr
    comparisons = list(csv.DictReader((toy_study / "named" / "comparisons.csv").open()))
    assert sorted((r["a"], r["metric"]) for r in comparisons) == [
        ("ucpo tau=1.0 staleness=0", uniformity), ("ucpo tau=1.0 staleness=1", grad),
        ("ucpo tau=1.0 staleness=1", uniformity)]
    p = [float(r["p_family"]) for r in comparisons]
    assert [float(r["p_holm"]) for r in comparisons] == pytest.approx(stats.holm(p), abs=1e-12)
    _one_line_error(_cli("report", "--study", "grid", "--no-plots", "--metric", uniformity, "--compare",
                         "ucpo tau=1.0 staleness=0:ucpo tau=0.0 staleness=0[train/reward]", cwd=toy_study),
                    "'train/reward' is not a column of this report")
    _one_line_error(_cli("report", "--study", "grid", "--compare", "ucpo tau=1.0 staleness=0:ucpo tau=0.0 "
                         "staleness=0[]", cwd=toy_study), "name the columns")


@pytest.mark.slow
def test_report_refuses_dirty_or_mixed_runs_in_results(toy_study: Path, tmp_path: Path) -> None:
    """Runs tagged git_dirty=true or from two commits: writing into results/ is refused in one line unless the
    author allows it; the table then says so. Elsewhere (--out) it is not checked."""
    from mlflow.tracking import MlflowClient

    runs = tmp_path / "runs"
    shutil.copytree(toy_study / "runs", runs)
    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    seed_runs = [r for r in client.search_runs([client.get_experiment_by_name("grid").experiment_id])
                 if r.data.tags.get("rlvrlab.role") == "seed"]
    for r in seed_runs:
        client.set_tag(r.info.run_id, "git_dirty", "false")
        client.set_tag(r.info.run_id, "git_sha", "a" * 40)
    results = tmp_path / "results"
    env = {"RLVRLAB_RESULTS_DIR": str(results)}

    def report(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([RLVRLAB, "report", "--study", "grid", "--no-plots", "--format", "md", *extra],
                              cwd=tmp_path, capture_output=True, text=True, timeout=900,
                              env={**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, **env})

    clean = report()
    assert clean.returncode == 0, clean.stderr
    assert "all 12 runs from commit aaaaaaa, clean tree" in (results / "grid" / "table.md").read_text()
    client.set_tag(seed_runs[0].info.run_id, "git_dirty", "true")
    _one_line_error(report(), "1 of the 12 runs", "uncommitted changes", "--allow-dirty")
    assert report("--out", str(tmp_path / "elsewhere")).returncode == 0
    assert report("--allow-dirty").returncode == 0
    assert "1 of 12 runs from a tree with uncommitted changes (--allow-dirty)" in \
        (results / "grid" / "table.md").read_text()
    client.set_tag(seed_runs[1].info.run_id, "git_sha", "b" * 40)
    _one_line_error(report("--allow-dirty"), "from 2 commits", "--allow-mixed")
    mixed = report("--allow-dirty", "--allow-mixed")
    assert mixed.returncode == 0, mixed.stderr
    assert "runs from 2 commits (aaaaaaa, bbbbbbb; --allow-mixed)" in (results / "grid" / "table.md").read_text()


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
            # one warm start (seed 0's) for every seed: each other seed's would cost ~11 s on 2 cores
            cfg = compose("default", [f"algorithm={algorithm}", f"seed={seed}", "model.warm_start_seed=0",
                                      f"output_dir={runs}", "experiment=tinyexp", "steps=2",
                                      "trainer.checkpoint_every=2", "trainer.engine=torch",
                                      "rollout.prompts_per_step=4", "rollout.group_size=4"])
            run_ids.append(train(cfg))
    evaluate = ("eval", "pass-at-k", "--runs-of", "tinyexp", "--output-dir", str(runs), "--dataset", "countdown",
                "--limit", "6", "--n", "4", "--k", "1,2,4", "--out", str(tmp_path / "evals"))
    result = _cli(*evaluate, cwd=tmp_path)  # every run of the experiment, one process
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (tmp_path / "evals").iterdir()} == set(run_ids)
    again = _cli(*evaluate, cwd=tmp_path)  # nothing left to do
    assert again.returncode == 0 and "already has an evaluation" in again.stdout
    result = _cli("report", "--experiment", "tinyexp", "--baseline", "grpo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "results" / "tinyexp"
    assert {"table.md", "table.tex", "table.csv", "passk_countdown.png", "curve_train_reward.png",
            "sources.json"} <= {p.name for p in out.iterdir()}
    rows = list(csv.DictReader((out / "table.csv").open()))
    evals = [r for r in rows if r["section"] == "countdown"]
    assert {r["metric"] for r in evals} == {"avg@n", "pass@1", "pass@2", "pass@4", "maj@4", "diversity",
                                            "distinct@4", "rarefied@4"}
    assert {r["group"] for r in evals} == {"grpo", "ucpo"} and all(r["n_problems"] == "6" for r in evals)
    ucpo = {r["metric"]: r for r in evals if r["group"] == "ucpo"}
    assert ucpo["pass@4"]["delta"] != "" and ucpo["pass@4"]["p_holm"] != ""
    # pass@1 equals avg@n exactly (the unbiased estimator telescopes)
    assert float(ucpo["pass@1"]["mean"]) == pytest.approx(float(ucpo["avg@n"]["mean"]), abs=1e-12)
    sources = json.loads((out / "sources.json").read_text())
    assert all(len(g["eval_runs"]) == 3 for g in sources["groups"])
    assert "- fixed warm start seed 0: intervals are conditional on that one initial model; initial-model sha256 " in \
        (out / "table.md").read_text()
    # pass@k means are means over seeds of means over problems of each eval run's records
    client = collect.client_for(f"sqlite:///{runs / 'mlflow.db'}")
    records = collect.eval_records(client, collect.select(f"sqlite:///{runs / 'mlflow.db'}", experiment="tinyexp"))
    matrix = records.matrices[("ucpo", "countdown", "pass@4")]
    assert matrix.shape == (3, 6) and float(ucpo["pass@4"]["mean"]) == pytest.approx(matrix.mean(), abs=1e-12)


@pytest.mark.slow
def test_report_events_auc_and_protocol_of_a_toy_sweep(toy_study: Path) -> None:
    """--event rates and exact tests, --reduce auc and --protocol, end to end, on the toy sweep's records."""
    protocol = toy_study / "protocol.md"  # not in a git repository: never pre-registered
    protocol.write_text("the question\n")
    result = _cli("report", "--study", "grid", "--baseline", "ucpo tau=0.0 staleness=0", "--no-plots",
                  "--metric", "policy/toy_correct_uniformity:auc:10,policy/toy_correct_mass",
                  "--event", "reach: policy/toy_correct_mass >= 0.5", "--event", "never: train/reward > 2",
                  "--compare", "ucpo tau=1.0 staleness=0:ucpo tau=0.0 staleness=1",
                  "--protocol", str(protocol), "--out", "elsewhere", cwd=toy_study)
    assert result.returncode == 0, result.stderr
    table = (toy_study / "elsewhere" / "table.md").read_text()
    assert "### Event `reach: policy/toy_correct_mass >= 0.5`" in table and "McNemar exact" in table
    assert "NOT pre-registered: the file is not committed" in table
    sources = json.loads((toy_study / "elsewhere" / "sources.json").read_text())
    assert sources["protocol"]["pre_registered"] is False
    never = next(e for e in sources["events"] if e["event"].startswith("never"))
    assert all(run["step"] is None for runs in never["groups"].values() for run in runs)
    assert all(c["p"] == 1.0 for c in never["comparisons"])  # no event anywhere: nothing to tell apart
    reach = next(e for e in sources["events"] if e["event"].startswith("reach"))
    assert len(reach["comparisons"]) == 4  # 3 groups vs the baseline, and the --compare pair
    # per_seed.csv holds each run's event outcome: every exact test recomputes from it with scipy
    happened: dict[str, dict[int, int]] = {}
    for row in csv.DictReader((toy_study / "elsewhere" / "per_seed.csv").open()):
        if row["section"] == "event" and row["metric"] == "reach":
            happened.setdefault(row["group"], {})[int(row["seed"])] = int(row["value"])
    for comparison in reach["comparisons"]:
        a, b = happened[comparison["group"]], happened[comparison["baseline"]]
        only_a = sum(a[s] and not b[s] for s in a)
        only_b = sum(b[s] and not a[s] for s in a)
        expected = 1.0 if only_a + only_b == 0 else scipy.stats.binomtest(only_a, only_a + only_b, 0.5).pvalue
        assert comparison["test"] == "McNemar exact" and comparison["p"] == pytest.approx(expected, abs=1e-12)
    # the auc cell is the seed mean of each run's trapezoid mean over its last 10 logged steps
    client = collect.client_for(f"sqlite:///{toy_study / 'runs' / 'mlflow.db'}")
    group = sources["groups"][0]
    per_run = []
    for run in group["runs"]:
        series = collect.metric_series(client, run["run_id"], "policy/toy_correct_uniformity")
        steps = sorted(series)[-10:]
        per_run.append(np.trapezoid([series[s] for s in steps], steps) / (steps[-1] - steps[0]))
        assert reduce_series(series, 10, "auc") == pytest.approx(per_run[-1])
    rows = list(csv.DictReader((toy_study / "elsewhere" / "table.csv").open()))
    cell = next(r for r in rows if r["group"] == group["label"] and r["metric"] == "policy/toy_correct_uniformity:auc:10")
    assert float(cell["mean"]) == pytest.approx(np.mean(per_run))


@pytest.mark.slow
def test_report_evaluates_a_protocols_verdict_rules(toy_study: Path) -> None:
    """--protocol with a ```verdict block (tests/report/verdict_protocol.md, docs/report.md "Verdict rules"): every
    rule is evaluated on the report's comparisons, printed, and written to table.md; the first that holds is the
    verdict. A protocol without a block says it states none; a rule naming a comparison the report lacks is a
    one-line error before anything is written."""
    protocol = Path(__file__).parent / "verdict_protocol.md"
    args = ("report", "--study", "grid", "--baseline", "ucpo tau=0.0 staleness=0", "--no-plots",
            "--compare", "best:ucpo tau=0.0 staleness=0", "--equivalence", "0.5")
    result = _cli(*args, "--protocol", str(protocol), "--out", "verdicts", cwd=toy_study)
    assert result.returncode == 0, result.stderr
    assert "  refuted: does not hold — " in result.stdout and "  not shown: holds — always" in result.stdout
    assert "UCPO tau=1.0 vs tau=0.0 at staleness 0 (protocol rules, the first that holds): reproduced (also holds, " \
           "lower in precedence: not shown)" in result.stdout
    table = (toy_study / "verdicts" / "table.md").read_text()
    assert "### Verdict (protocol rules)" in table and "**UCPO tau=1.0 vs tau=0.0 at staleness 0: reproduced**" in table
    assert "| negligible | no | ucpo tau=1.0 staleness=0 vs ucpo tau=0.0 staleness=0 · policy/toy_correct_uniformity: " \
           "p_equivalence_holm = " in table
    # the verdict's numbers are comparisons.csv's
    rows = {(r["a"], r["metric"], r["selected_from"]): r
            for r in csv.DictReader((toy_study / "verdicts" / "comparisons.csv").open())}
    row = rows[("ucpo tau=1.0 staleness=0", "policy/toy_correct_uniformity", "")]
    assert f"delta = {float(row['delta']):.4g} > 0 ✓" in table and float(row["high"]) > 0

    bare = toy_study / "bare_protocol.md"
    bare.write_text("# a protocol in prose only\n")
    result = _cli(*args, "--protocol", str(bare), "--out", "bare", cwd=toy_study)
    assert result.returncode == 0, result.stderr
    assert "the protocol states no machine-readable verdict rules" in result.stdout
    assert "the protocol states no machine-readable verdict rules" in (toy_study / "bare" / "table.md").read_text()

    wrong = toy_study / "wrong_protocol.md"
    wrong.write_text(protocol.read_text().replace("ucpo tau=1.0 staleness=1 vs", "ucpo tau=2.0 staleness=1 vs"))
    _one_line_error(_cli(*args, "--protocol", str(wrong), "--out", "wrong", cwd=toy_study),
                    "rule 3 ('reproduced')", "no comparison 'ucpo tau=2.0 staleness=1 vs ucpo tau=0.0 staleness=0'",
                    "--compare \"ucpo tau=2.0 staleness=1:ucpo tau=0.0 staleness=0\"")
    assert not (toy_study / "wrong").exists()
