"""A command sweep of a real trainer on CPU: TRL's GRPOTrainer (examples/trl_grpo.py, trl 1.16 from the dev extra)
over two learning rates x two seeds, then `rlvrlab report` on TRL's own MLflow metric names.
Run: .venv/bin/pytest -q tests/sweep/test_trl_sweep.py  (slow: ~2-3 min on the shared 2-core machine, most of it
imports of torch, transformers and TRL in each of the 4 commands and building the tiny model once)"""

from __future__ import annotations

import csv
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlvrlab.sweep.runner import Command
from rlvrlab.sweep.spec import load_sweep

REPO = Path(__file__).resolve().parents[2]
RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))
EXAMPLE = REPO / "examples" / "trl_grpo.py"


def test_the_shipped_trl_sweep_file_validates() -> None:
    spec = load_sweep(str(REPO / "sweeps" / "examples" / "trl_grpo.yaml"))
    assert isinstance(spec.runner, Command) and "examples/trl_grpo.py" in spec.runner.template
    assert [p.key for p in spec.space] == ["lr"] and spec.objective.metric == "reward" and len(spec.seeds) == 2


@pytest.mark.slow
def test_a_trl_grpo_sweep_gives_a_report_with_intervals_and_paired_tests(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    command = (f"{shlex.quote(sys.executable)} {shlex.quote(str(EXAMPLE))} --learning-rate {{lr}} --seed {{seed}} "
               "--steps 2 --prompts-per-step 2 --num-generations 2 --max-completion-length 8 --threads 1 "
               "--output-dir trl/{lr}-{seed}")
    path = tmp_path / "trl_sweep.yaml"
    path.write_text(f"name: trl_sweep\ncommand: {command}\nseeds: 2\nspace:\n  lr: [1.0e-5, 1.0e-2]\n"
                    "objective: {metric: reward, direction: maximize, window: 2}\n")
    swept = subprocess.run([RLVRLAB, "sweep", str(path), f"output_dir={tmp_path}"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=900)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "2/2 trials done" in swept.stdout and "COMPLETE" in swept.stdout

    out = tmp_path / "report"
    reported = subprocess.run([RLVRLAB, "report", "--study", "trl_sweep", "--metric", "reward,entropy",
                               "--baseline", "lr=1e-05", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                               "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "lr=0.01" in reported.stdout and "lr=1e-05" in reported.stdout  # named by the swept value
    cells = list(csv.DictReader((out / "table.csv").open()))
    assert {(c["group"], c["metric"]) for c in cells} == {(g, m) for g in ("lr=0.01", "lr=1e-05")
                                                          for m in ("reward", "entropy")}
    for cell in cells:  # a 95% t-interval over the 2 seeds around each mean
        assert cell["n_seeds"] == "2" and cell["seeds"] == "0 1"
        assert float(cell["low"]) <= float(cell["mean"]) <= float(cell["high"])
        assert math.isfinite(float(cell["low"])) and math.isfinite(float(cell["high"]))
    comparisons = list(csv.DictReader((out / "comparisons.csv").open()))
    assert {(c["a"], c["b"], c["metric"]) for c in comparisons} == {("lr=0.01", "lr=1e-05", "reward"),
                                                                    ("lr=0.01", "lr=1e-05", "entropy")}
    assert all(c["test"] == "paired t" and c["paired"] == "True" for c in comparisons)  # the seeds are shared
    entropy = next(c for c in comparisons if c["metric"] == "entropy")
    assert float(entropy["low"]) <= float(entropy["delta"]) <= float(entropy["high"]) and 0 <= float(entropy["p"]) <= 1
