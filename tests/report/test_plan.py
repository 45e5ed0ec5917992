"""`rlvrlab plan` on committed pilot folders: the design, its cost, the protocol it writes (parsed by the verdict
and testbed readers) and one-line errors for bad input."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvrlab.cli.main import app
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import verdict
from rlvrlab.report.plan import PlanRequest, lines, plan, protocol
from rlvrlab.stats.design import design_mde
from rlvrlab.tracking import testbed

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "results" / "tiny_tau_eps_staleness_grid"
TAU = ROOT / "results" / "ucpo_tau"


def test_plan_on_the_grid_reaches_the_target_with_the_fewest_seeds():
    result = plan(PlanRequest(folder=GRID, mde=0.03, comparisons=10))
    pilot, design = result.pilot, result.design
    assert (pilot.section, pilot.metric, pilot.samples, pilot.problems) == ("countdown", "pass@1", 64, 102)
    assert len(pilot.groups) == 8 and pilot.pairs_from == "comparisons.csv" and len(pilot.pairs) == 4
    assert design.mde <= 0.03 and result.level == pytest.approx(0.005)
    assert design_mde(pilot.paired, design.seeds - 1, 64, 102, comparisons=10) > 0.03  # one seed fewer cannot
    assert result.seed_runs == 8 * design.seeds
    assert result.pilot_mde > 0.03  # the pilot's 5 seeds are not enough for this target
    text = "\n".join(lines(result))
    assert f"= {result.seed_runs} seed runs" in text and "seconds unknown" in text


def test_a_per_seed_only_pilot_plans_seeds_alone(tmp_path):
    result = plan(PlanRequest(folder=TAU, mde=0.02, metric="policy/toy_correct_uniformity"))
    assert result.pilot.problems is None and result.design.problems is None
    assert result.pilot.pairs_from == "comparisons.csv" and len(result.pilot.groups) == 5
    assert result.design.mde <= 0.02 < design_mde(result.pilot.paired, result.design.seeds - 1, None, None)


def test_the_pilots_mde_is_the_reports_own_mde_pooled_over_its_comparisons():
    """Per-seed pilot, paired t: the pooled variance's MDE is the root mean square of comparisons.csv's mde_holm."""
    result = plan(PlanRequest(folder=TAU, mde=0.02, comparisons=4))
    with (TAU / "comparisons.csv").open() as handle:
        mdes = [float(row["mde_holm"]) for row in csv.DictReader(handle)]
    assert result.pilot_mde == pytest.approx(math.sqrt(sum(m * m for m in mdes) / len(mdes)), rel=1e-9)


def test_without_comparisons_every_pair_of_groups_is_pooled(tmp_path):
    folder = tmp_path / "pilot"
    shutil.copytree(TAU, folder)
    (folder / "comparisons.csv").unlink()
    result = plan(PlanRequest(folder=folder, mde=0.02))
    assert result.pilot.pairs_from == "every pair of groups" and len(result.pilot.pairs) == 10


def test_measured_seconds_come_from_the_run_durations(tmp_path):
    folder = tmp_path / "pilot"
    shutil.copytree(TAU, folder)
    sources = json.loads((folder / "sources.json").read_text())
    for group in sources["groups"]:
        for run in group["runs"]:
            run["duration_s"] = 120.0
    (folder / "sources.json").write_text(json.dumps(sources))
    result = plan(PlanRequest(folder=folder, mde=0.05))
    assert f"{result.seed_runs * 120:,.0f} s measured" in "\n".join(lines(result))


@pytest.mark.parametrize("pilot", [GRID, TAU], ids=["per-problem", "per-seed"])
def test_the_written_protocol_parses_and_names_the_pilots_comparisons(pilot, tmp_path):
    out = tmp_path / "protocol.md"
    result = CliRunner().invoke(app, ["plan", str(pilot), "--mde", "0.03", "--comparisons", "10",
                                      "--protocol-out", str(out)])
    assert result.exit_code == 0, result.output
    assert "design: " in result.output and f"wrote the protocol {out}" in result.output
    questions = verdict.load(out)
    assert len(questions) == 1 and [r.verdict for r in questions[0].rules] == ["shown", "not shown"]
    assert testbed.load(out).sha256 is None  # it fixes no initial model until one is added
    outcome = verdict.evaluate_folder(out, questions, pilot)  # every condition is a comparison the pilot reports
    assert outcome.questions[0].verdict in {"shown", "not shown"}
    assert "rlvrlab plan " in out.read_text() and "--mde 0.03 --comparisons 10" in out.read_text()


def test_the_protocol_text_is_the_plan_of_its_command():
    result = plan(PlanRequest(folder=GRID, mde=0.03, comparisons=10))
    text = protocol(result, "rlvrlab plan x")
    assert f"seeds 15–{15 + result.design.seeds - 1}" in text  # fresh seeds after the pilot's 10-14


def test_help_documents_the_command():
    result = CliRunner().invoke(app, ["plan", "--help"])
    assert result.exit_code == 0
    for flag in ("--mde", "--comparisons", "--protocol-out", "--max-seeds", "Holm"):
        assert flag in result.output


@pytest.mark.parametrize("given, message", [
    (dict(folder=Path("no/such/folder"), mde=0.03), "does not exist"),
    (dict(folder=GRID, mde=0.0), "--mde must be a number > 0"),
    (dict(folder=GRID, mde=None), "--mde must be a number > 0"),
    (dict(folder=GRID, mde=0.03, metric="nope"), "is not in the pilot"),
    (dict(folder=GRID, mde=0.03, metric="policy/correct_entropy:mean:20", section="countdown"), "is not in the"),
    (dict(folder=GRID, mde=0.001, max_seeds=5), "no design of <= 5 seeds"),
    (dict(folder=GRID, mde=0.03, alpha=1.5), "--alpha must be in (0, 1)"),
])
def test_bad_input_is_one_line(given, message):
    with pytest.raises(RlvrlabError) as error:
        plan(PlanRequest(**given))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_folder_without_per_seed_csv_is_one_line(tmp_path):
    with pytest.raises(RlvrlabError, match="has no per_seed.csv"):
        plan(PlanRequest(folder=tmp_path, mde=0.03))
    (tmp_path / "per_seed.csv").write_text("group,seed,value\na,1,0.5\n")
    with pytest.raises(RlvrlabError, match="lacks the columns metric, section"):
        plan(PlanRequest(folder=tmp_path, mde=0.03))


def test_a_sweep_study_is_a_pilot_with_its_runs_measured_seconds(tmp_path, monkeypatch):
    """study:NAME plans from a study's MLflow runs (its report written to a temporary folder): the same design as
    planning from the folder `rlvrlab report --study` writes, and the cost in measured seconds (each run's
    duration_s, recorded in sources.json)."""
    from dataclasses import replace

    import yaml

    from rlvrlab.report.command import ReportRequest, make_report
    from rlvrlab.report.plan import pilot_folder
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.workers import run_sweep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump({
        "name": "pilot", "experiment": "toy", "overrides": ["steps=8", "trainer.checkpoint_every=0"], "seeds": 3,
        "space": {"trainer.lr": [0.1, 0.2]}, "objective": {"metric": "policy/toy_correct_mass", "window": 2}}))
    run_sweep(load_sweep(str(tmp_path / "pilot.yaml"), [f"output_dir={tmp_path / 'runs'}"]))
    request = PlanRequest(folder=Path("study:pilot"), output_dir=tmp_path / "runs", mde=0.05)
    with pilot_folder(request) as folder:
        runs = [r for g in json.loads((folder / "sources.json").read_text())["groups"] for r in g["runs"]]
        assert len(runs) == 6 and all(r["duration_s"] > 0 for r in runs)
        from_study = plan(PlanRequest(folder=folder, mde=0.05))
    make_report(ReportRequest(study="pilot", output_dir=tmp_path / "runs", plots=False, out=tmp_path / "written"))
    assert plan(PlanRequest(folder=tmp_path / "written", mde=0.05)).design == from_study.design
    result = CliRunner().invoke(app, ["plan", "study:pilot", "--output-dir", str(tmp_path / "runs"), "--mde", "0.05"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("pilot: study:pilot: 2 groups") and " s measured (" in result.output
    with pilot_folder(replace(request, folder=Path("experiment:pilot"))) as folder:  # its runs by config (train/reward)
        pilot = plan(PlanRequest(folder=folder, mde=0.05)).pilot
        assert (len(pilot.groups), len(pilot.seeds), pilot.metric) == (2, 3, "train/reward")
