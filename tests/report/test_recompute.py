"""A reader recomputes a report from the files it writes: per_seed.csv holds the per-seed values every table cell
and comparison of comparisons.csv was computed from, per_problem.csv the seeds x problems matrices of the
evaluation statistics; both exact to the bit (repr). The comparisons are recomputed here with scipy (ttest_rel,
ttest_ind(equal_var=False), the interval from scipy.stats.t, Holm by hand) and by results/recompute.py.

Toy-tier runs (a second or two each): grpo and ucpo on seeds 0-4 (paired), ucpo tau=1.0 on seeds 5-7 (Welch
against both); each seed run gets a fabricated `rlvrlab eval pass-at-k` run (records on 6 problems, some
statistics undefined on some problems) so that the report has an evaluation section too."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from rlvrlab.report import collect
from rlvrlab.report.command import ReportRequest, make_report
from rlvrlab.tracking import tags as T

ROOT = Path(__file__).resolve().parents[2]
GROUPS = [("grpo", range(5), []), ("ucpo", range(5), []), ("ucpo", range(5, 8), ["algorithm.tau=1.0"])]
METRICS = ("train/reward", "loss/grad_norm:max:3", "policy/toy_correct_uniformity:auc:4")
N, PROBLEMS = 4, 6


def _record(rng: np.random.Generator, pid: str, level: float) -> dict:
    """One problem's record as `rlvrlab eval pass-at-k` writes it (the fields the report reads)."""
    c = int(rng.binomial(N, level))
    forms = [int(x) for x in np.bincount(rng.integers(0, 3, size=c)) if x] if c else []
    return {"dataset": "toyset", "id": pid, "n": N, "c": c, "avg@n": c / N, "pass@1": c / N,
            "pass@2": 1 - math.comb(N - c, 2) / math.comb(N, 2), "maj@2": float(c >= 2),
            "diversity": None if c == 0 else len(forms) / c, "correct_forms": sorted(forms, reverse=True)}


def _fabricate_evaluation(client, experiment_id: str, run_id: str, records: list[dict], folder: Path) -> None:
    run = client.create_run(experiment_id, tags={T.KIND: "eval"})
    path = folder / run.info.run_id / "records.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    client.log_artifact(run.info.run_id, str(path), artifact_path="eval")
    client.set_terminated(run.info.run_id, "FINISHED")
    client.set_tag(run_id, f"{T.EVAL_LINK}{run.info.run_id}", "1")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    folder = tmp_path_factory.mktemp("recompute")
    runs = folder / "runs"
    ids = []
    for algorithm, seeds, extra in GROUPS:
        for seed in seeds:
            ids.append(train(compose("toy", [f"algorithm={algorithm}", f"seed={seed}", f"output_dir={runs}",
                                             "experiment=rc", "steps=4", "trainer.checkpoint_every=0", *extra])))
    client = collect.client_for(f"sqlite:///{runs / 'mlflow.db'}")
    evals = client.create_experiment("rc-evals", artifact_location=(folder / "eval-artifacts").as_uri())
    rng = np.random.default_rng(37)
    for index, run_id in enumerate(ids):
        level = 0.35 + 0.02 * index  # a different pass rate per run: seed and group effects
        records = [_record(rng, f"p{p}", min(0.95, level + 0.1 * p)) for p in range(PROBLEMS)]
        _fabricate_evaluation(client, evals, run_id, records, folder / "eval-records")
    out = folder / "out"
    make_report(ReportRequest(experiment="rc", baseline="grpo", metric=METRICS, output_dir=runs, out=out,
                              compare=("best:grpo", "ucpo tau=1.0:ucpo tau=0.2[train/reward|pass@1]"), plots=False))
    return out


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _per_seed(out: Path) -> dict[tuple[str, str, str], tuple[list[int], np.ndarray]]:
    found: dict[tuple[str, str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for r in _rows(out / "per_seed.csv"):
        found[(r["group"], r["section"], r["metric"])][0].append(int(r["seed"]))
        found[(r["group"], r["section"], r["metric"])][1].append(float(r["value"]))
    return {k: (seeds, np.asarray(values)) for k, (seeds, values) in found.items()}


def test_the_report_writes_its_values_and_names_them(report: Path) -> None:
    assert {"per_seed.csv", "per_problem.csv"} <= {p.name for p in report.iterdir()}
    assert {"per_seed.csv", "per_problem.csv"} <= set(json.loads((report / "sources.json").read_text())["outputs"])
    with (report / "per_seed.csv").open() as f:
        assert f.readline().strip() == "group,section,seed,metric,value"
    with (report / "per_problem.csv").open() as f:
        assert f.readline().strip() == "group,section,seed,problem,metric,value"
    per_seed = _per_seed(report)
    assert per_seed[("ucpo tau=1.0", "train", "train/reward")][0] == [5, 6, 7]
    # every cell of the table has its seeds; the training values are the runs' reduced values, to the bit
    cells = _rows(report / "table.csv")
    assert {(c["group"], c["section"], c["metric"]) for c in cells} == set(per_seed)
    for c in cells:
        seeds, values = per_seed[(c["group"], c["section"], c["metric"])]
        assert " ".join(map(str, seeds)) == c["seeds"]
        if c["section"] == "train":
            assert float(c["mean"]) == float(values.mean())


def test_comparisons_recompute_from_per_seed_values_with_scipy(report: Path) -> None:
    """Every training row of comparisons.csv from per_seed.csv: paired t when the groups ran the same seed list,
    else Welch; Δ ± t_{0.975, df} · se; Holm over the whole family, by hand. Agreement to 1e-12."""
    from scipy import stats as sps

    per_seed = _per_seed(report)
    rows = _rows(report / "comparisons.csv")
    assert {r["section"] for r in rows} == {"train", "toyset"}
    tests = {r["test"] for r in rows if r["section"] == "train"}
    assert tests == {"paired t", "Welch"} and any(r["selected_from"] for r in rows)
    family = []
    for r in rows:
        seeds_a, a = per_seed[(r["a"], r["section"], r["metric"])]
        seeds_b, b = per_seed[(r["b"], r["section"], r["metric"])]
        if r["section"] != "train":
            family.append(float(r["p_family"]))
            continue
        paired = seeds_a == seeds_b
        assert r["paired"] == str(paired) and r["test"] == ("paired t" if paired else "Welch")
        if paired:
            d = a - b
            result = sps.ttest_rel(a, b)
            delta, se, df = d.mean(), d.std(ddof=1) / math.sqrt(len(d)), len(d) - 1
        else:
            result = sps.ttest_ind(a, b, equal_var=False)
            va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
            delta, se = a.mean() - b.mean(), math.sqrt(va + vb)
            df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        half = sps.t.ppf(0.975, df) * se
        assert float(r["delta"]) == pytest.approx(delta, rel=1e-12, abs=1e-12)
        assert float(r["delta"]) / float(r["se"]) == pytest.approx(result.statistic, rel=1e-12)
        for name, value in (("low", delta - half), ("high", delta + half), ("se", se), ("df", df),
                            ("p", result.pvalue)):
            assert float(r[name]) == pytest.approx(value, rel=1e-12, abs=1e-12), (r["a"], r["b"], r["metric"], name)
        p = result.pvalue * int(r["selected_from"]) if r["selected_from"] else result.pvalue
        assert float(r["p_family"]) == pytest.approx(min(1.0, p), rel=1e-12, abs=1e-12)
        family.append(min(1.0, p))
    order = sorted(range(len(family)), key=lambda i: family[i])
    running, holm = 0.0, [0.0] * len(family)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(family) - rank) * family[i]))
        holm[i] = running
    for r, adjusted in zip(rows, holm):
        assert float(r["p_holm"]) == pytest.approx(adjusted, rel=1e-12, abs=1e-12)


def test_per_problem_seed_means_are_the_per_seed_values(report: Path) -> None:
    per_seed = _per_seed(report)
    matrices: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in _rows(report / "per_problem.csv"):
        matrices[(r["group"], r["section"], r["metric"])][int(r["seed"])].append(float(r["value"]))
    assert {k for k in per_seed if k[1] == "toyset"} == set(matrices)
    undefined = 0
    for key, by_seed in matrices.items():
        seeds, values = per_seed[key]
        assert list(by_seed) == seeds and all(len(row) == PROBLEMS for row in by_seed.values())
        x = np.asarray(list(by_seed.values()))
        undefined += int(np.isnan(x).sum())
        # the mean over the problems where the statistic is defined (0 for a seed where none is)
        means = [np.nanmean(row) if not np.isnan(row).all() else 0.0 for row in x]
        np.testing.assert_allclose(means, values, rtol=1e-12, atol=1e-12)
    assert undefined > 0  # the records above leave diversity undefined where no response is correct


def test_results_recompute_script_agrees(report: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "results" / "recompute.py"), str(report)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("largest difference: ") and float(last.split()[2]) <= 1e-12, result.stdout
    assert "paired crossed" in (report / "comparisons.csv").read_text()
    assert "partly:" not in result.stdout  # the crossed evaluation rows are recomputed in full too
    # one seed value off in its 10th digit: the script says so and fails
    altered = report.parent / "altered"
    shutil.copytree(report, altered)
    lines = (altered / "per_seed.csv").read_text().splitlines(keepends=True)
    group, section, seed, metric, value = lines[1].rstrip("\n").split(",")
    lines[1] = ",".join([group, section, seed, metric, repr(float(value) * (1 + 1e-9))]) + "\n"
    (altered / "per_seed.csv").write_text("".join(lines))
    result = subprocess.run([sys.executable, str(ROOT / "results" / "recompute.py"), str(altered)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and f"{metric}" in result.stdout.splitlines()[-1], result.stdout


OLD_HEADER = ("a,b,section,metric,delta,low,high,se,df,test,paired,n_a,n_b,p,selected_from,p_family,p_holm,"
              "p_signflip,mde,max_statistic,holm_level,mde_holm,claim_note,significant,prob_improvement")
MARGINS = "0.01,loss/grad_norm:max:3=0.5,pass@1=0.1"


@pytest.fixture(scope="module")
def equivalence_report(report: Path) -> Path:
    """The same runs reported with --equivalence: TOSTs at 0.01 on every column but two, named ones on those."""
    out = report.parent / "equivalence"
    make_report(ReportRequest(experiment="rc", baseline="grpo", metric=METRICS, output_dir=report.parent / "runs",
                              out=out, compare=("best:grpo", "ucpo tau=1.0:ucpo tau=0.2[train/reward|pass@1]"),
                              plots=False, equivalence=MARGINS))
    return out


def test_without_equivalence_the_comparisons_keep_their_columns(report: Path) -> None:
    with (report / "comparisons.csv").open() as f:
        assert f.readline().strip() == OLD_HEADER
    assert "equivalen" not in (report / "table.md").read_text()


def test_equivalence_recomputes_with_scipy_in_one_holm_family(equivalence_report: Path) -> None:
    """Every row's TOST p from its Δ, se and df with scipy.stats.t, at its column's margin (×N for a selected cell);
    Holm over the difference tests and the TOSTs together, by hand; the table's verdict word where its Holm p < 0.05
    with >= 5 seeds per group. results/recompute.py agrees and catches a changed Holm p."""
    from scipy import stats as sps

    rows = _rows(equivalence_report / "comparisons.csv")
    with (equivalence_report / "comparisons.csv").open() as f:
        assert f.readline().strip() == OLD_HEADER + ",equivalence_margin,p_equivalence,p_equivalence_holm,equivalent"
    margins = {"loss/grad_norm:max:3": 0.5, "pass@1": 0.1}
    tosts = []
    for r in rows:
        assert float(r["equivalence_margin"]) == margins.get(r["metric"], 0.01)
        delta, se, df, margin = (float(r[k]) for k in ("delta", "se", "df", "equivalence_margin"))
        p = max(sps.t.sf((delta + margin) / se, df), sps.t.cdf((delta - margin) / se, df))
        assert float(r["p_equivalence"]) == pytest.approx(p, rel=1e-12, abs=1e-15)
        tosts.append(min(1.0, p * int(r["selected_from"])) if r["selected_from"] else p)
    family = [float(r["p_family"]) for r in rows] + tosts
    order = sorted(range(len(family)), key=lambda i: family[i])
    running, holm = 0.0, [0.0] * len(family)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(family) - rank) * family[i]))
        holm[i] = running
    assert [float(r["p_holm"]) for r in rows] == pytest.approx(holm[:len(rows)], rel=1e-12, abs=1e-15)
    assert [float(r["p_equivalence_holm"]) for r in rows] == pytest.approx(holm[len(rows):], rel=1e-12, abs=1e-15)
    assert all(float(r["holm_level"]) * (int(r["selected_from"] or 1)) == pytest.approx(0.05 / len(family))
               for r in rows)
    equivalent = [r for r in rows if r["equivalent"] == "True"]
    assert equivalent and all(float(r["p_equivalence_holm"]) < 0.05 and min(int(r["n_a"]), int(r["n_b"])) >= 5
                              for r in equivalent)
    assert any(float(r["p_equivalence_holm"]) >= 0.05 for r in rows)
    table = (equivalence_report / "table.md").read_text()
    assert len(re.findall(r"equivalent within ±\d", table)) == len(equivalent)
    assert f"{len(rows)} equivalence tests" in table

    script = [sys.executable, str(ROOT / "results" / "recompute.py")]
    done = subprocess.run([*script, str(equivalence_report)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and float(done.stdout.strip().splitlines()[-1].split()[2]) <= 1e-12, done.stdout
    altered = equivalence_report.parent / "equivalence-altered"
    shutil.copytree(equivalence_report, altered)
    lines = (altered / "comparisons.csv").read_text().splitlines(keepends=True)
    fields = lines[1].rstrip("\n").split(",")
    fields[-2] = repr(float(fields[-2]) * (1 + 1e-6) if float(fields[-2]) < 1 else 0.5)
    lines[1] = ",".join(fields) + "\n"
    (altered / "comparisons.csv").write_text("".join(lines))
    done = subprocess.run([*script, str(altered)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "p_equivalence_holm" in done.stdout, done.stdout


def test_committed_results_recompute() -> None:
    """Every results/ folder with per_seed.csv: its comparisons.csv (columns and Holm p as committed, without
    --equivalence) recomputes from its per-seed values (results/recompute.py, to 1e-9)."""
    folders = sorted(p.parent for p in (ROOT / "results").glob("**/per_seed.csv")
                     if (p.parent / "comparisons.csv").is_file())
    assert folders
    for folder in folders:
        done = subprocess.run([sys.executable, str(ROOT / "results" / "recompute.py"), str(folder)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (folder, done.stdout[-2000:], done.stderr)


def test_the_scripts_crossed_intervals_and_mdes_are_the_reports() -> None:
    """recompute.py's own crossed seeds x problems moments (paired and Welch) and MDEs, on draws where the seed term
    is floored and where it is not, equal rlvrlab.stats to 1e-12."""
    import importlib.util

    from rlvrlab import stats

    spec = importlib.util.spec_from_file_location("recompute", ROOT / "results" / "recompute.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rng = np.random.default_rng(11)
    floored = 0
    for draw in range(40):
        sd_seed = 0.0 if draw % 2 else 0.1
        a = rng.normal(0, sd_seed, (5, 1)) + rng.normal(0, 0.2, (1, 12)) + rng.normal(0, 0.1, (5, 12))
        b = rng.normal(0, sd_seed, (6, 1)) + rng.normal(0, 0.2, (1, 12)) + rng.normal(0, 0.1, (6, 12))
        ms = stats.mean_squares(a - b[:5])
        floored += int(ms.seeds <= 2 * ms.resid)
        for got, want in ((script.crossed(a - b[:5]), stats.paired_crossed(a, b[:5])),
                          (script.welch_crossed(a, b), stats.welch_crossed(a, b))):
            np.testing.assert_allclose(got, (want.delta, want.se, want.df), rtol=1e-12, atol=1e-14)
            assert script.mde(want.se, want.df, 0.05) == pytest.approx(want.mde, rel=1e-9)
            level = stats.holm_level(12)
            assert script.mde(want.se, want.df, level) == pytest.approx(stats.mde(want.se, want.df, alpha=level),
                                                                       rel=1e-9)
    assert 5 <= floored <= 35  # both branches of the floor were exercised
