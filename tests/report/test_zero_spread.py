"""A comparison whose seed differences have no spread (all zero: two arms that logged the same values) has a standard
error of 0, where the t-test's MDE is undefined (stats.mde gives NaN). table.md and the console used to print a bare
`MDE=` there; they now say `MDE=0 (no spread)`: 0 is the limit as se -> 0 and what the t's p says (p = 1 for the
observed Δ = 0, p = 0 for any other), with the reason beside it."""

from __future__ import annotations

import math
from pathlib import Path

from typer.testing import CliRunner

from rlvrlab import stats
from rlvrlab.cli.main import app
from rlvrlab.report.render import NO_SPREAD, _delta_text, _mde
from rlvrlab.report.table import Comparison

SHA = "0123456789abcdef0123456789abcdef01234567"
SEEDS = [1, 2, 3, 4, 5]


def test_mde_text_says_why_it_has_no_number() -> None:
    assert _mde(None) == ""
    assert _mde(math.inf) == "∞"
    assert _mde(0.1234) == "0.123"
    assert _mde(math.nan, 0.0) == NO_SPREAD == "0 (no spread)"
    assert _mde(math.nan) == "—" and _mde(math.nan, 0.2) == "—"  # undefined for another reason (no df)
    same = stats.Comparison(0.0, 0.0, 0.0, 0.0, 4.0, 1.0, 1.0, math.nan, True, "paired t", 5, 5, 0.5)
    row = Comparison("arm=b", "arm=a", "train", "reward", same, p_holm=1.0,
                     claim=stats.Claim(0.05, math.nan, False, ""))
    assert _delta_text(row) == "+0.000 [+0.000, +0.000] p=1.000 MDE=0 (no spread) paired"
    assert _delta_text(None, 0.01234) == "+0.012†" and _delta_text(None) == "—"  # too few seeds; the baseline


def test_identical_arms_print_an_mde_in_table_md(tmp_path: Path) -> None:
    """Two arms whose runs logged the same reward per seed, and a third that differs: the identical pair's Δ row
    reads `MDE=0 (no spread)` in table.md and in the console, never `MDE=` with nothing after it."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("same", artifact_location=str(tmp_path / "artifacts"))
    for arm, offset in (("a", 0.0), ("b", 0.0), ("c", 0.05)):
        for seed in SEEDS:
            run = client.create_run(experiment, run_name=f"{arm}-{seed}",
                                    tags={"mlflow.source.git.commit": SHA}).info.run_id
            client.log_param(run, "arm", arm)
            client.log_param(run, "seed", seed)
            for step in range(3):
                value = 0.1 * seed + 0.01 * step + (offset * (1 + seed % 3) if offset else 0.0)
                client.log_metric(run, "reward", value, step=step)
            client.set_terminated(run, "FINISHED")
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", "--experiment", "same", "--group-by", "arm", "--tracking-uri", uri,
                                      "--metric", "reward", "--baseline", "arm=a", "--out", str(out), "--no-plots",
                                      "--format", "md,csv"])
    assert result.exit_code == 0, (result.output, result.exception)
    text = (out / "table.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "MDE=" in line}
    assert sorted(rows) == ["arm=b", "arm=c"], text
    assert "+0.000 [+0.000, +0.000] p=1.000 MDE=0 (no spread) paired" in rows["arm=b"], text
    assert "MDE=0." in rows["arm=c"] and "no spread" not in rows["arm=c"]  # the arm with spread: a number
    assert "MDE= " not in text and "MDE=|" not in text
    assert "MDE=0 (no spread)" in " ".join(result.output.split())
    import csv

    rows_csv = {r["a"]: r for r in csv.DictReader((out / "comparisons.csv").open())}
    assert rows_csv["arm=b"]["mde_holm"] == "nan" and float(rows_csv["arm=b"]["se"]) == 0.0  # the number stays NaN
