"""TensorBoard event files as seed runs (rlvrlab.report.tensorboard): folders, params, seeds and metric names by the
documented rule, written here with torch's SummaryWriter (what transformers' TensorBoardCallback, and so TRL's
report_to="tensorboard", uses), and once by TRL's GRPOTrainer itself, logging the same runs to TensorBoard and MLflow,
whose reports agree byte for byte (slow).
Run: .venv/bin/pytest -q tests/report/test_tensorboard.py"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import struct_pb2
from torch.utils.tensorboard import SummaryWriter

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.tensorboard import Histories, TBRun, folder_name_parts, hparam_text, mlflow_name, read_runs
from rlvrlab.tracking.tags import NONFINITE_STEP

REPO = Path(__file__).resolve().parents[2]


def write(folder: Path, scalars: dict[str, list[tuple[int, float]]], hparams: dict | None = None,
          hparams_run: str | None = None, args: dict | None = None) -> None:
    """One run's event files: scalars, then (optionally) transformers' `args` text and add_hparams."""
    with SummaryWriter(str(folder)) as writer:
        for tag, points in scalars.items():
            for step, value in points:
                writer.add_scalar(tag, value, step)
        if args is not None:
            writer.add_text("args", json.dumps(args))
        if hparams is not None:
            writer.add_hparams(hparams, {"hparam/final": 0.5}, run_name=hparams_run)


def by_name(runs: list[TBRun]) -> dict[str, TBRun]:
    return {run.name: run for run in runs}


@pytest.mark.parametrize("name, params, seed", [
    ("lr=0.1,seed=3", {"lr": "0.1"}, 3),
    ("lr=0.1/beta=0/seed_4", {"lr": "0.1", "beta": "0"}, 4),
    ("learning_rate=1e-05,loss=dr_grpo/Seed12", {"learning_rate": "1e-05", "loss": "dr_grpo"}, 12),
    ("grpo/seed-0/runs/Dec07_13-33-36_vm", {}, 0),       # parts without `=` name nothing
    ("lr=0.1/x_seed3", {"lr": "0.1"}, None),             # a seed part is the whole part
    ("a=b=c,seed=1", {"a": "b=c"}, 1),                   # the key ends at the first `=`
    ("lr=0.1/lr=0.1/seed=2", {"lr": "0.1"}, 2),          # the same value twice is one
    (".", {}, None),
])
def test_folder_name_parts_follow_the_documented_rule(name: str, params: dict, seed: int | None) -> None:
    assert folder_name_parts(name) == (params, seed)


@pytest.mark.parametrize("name, problem", [("lr=0.1/lr=0.2/seed=1", "names lr twice"),
                                           ("seed=1/seed_2", "names 2 seeds")])
def test_a_folder_name_that_says_two_things_is_one_line_error(name: str, problem: str) -> None:
    with pytest.raises(RlvrlabError, match=problem) as e:
        folder_name_parts(name)
    assert "\n" not in str(e.value) and "rename" in str(e.value)


@pytest.mark.parametrize("value, text", [
    (struct_pb2.Value(number_value=3.0), "3"), (struct_pb2.Value(number_value=0.1), "0.1"),
    (struct_pb2.Value(number_value=1e-05), "1e-05"), (struct_pb2.Value(string_value="adam"), "adam"),
    (struct_pb2.Value(bool_value=True), "True"),
])
def test_hparams_read_as_mlflow_logs_the_same_python_values(value, text: str) -> None:
    assert hparam_text(value) == text


def test_runs_from_folder_names_with_every_scalar_in_step_order(tmp_path: Path) -> None:
    write(tmp_path / "lr=0.1,seed=1", {"train/reward": [(2, 0.75), (1, 0.5)], "loss": [(1, 2.0)]})
    write(tmp_path / "lr=0.1" / "seed_2", {"train/reward": [(1, 0.25), (2, 1.0)]})
    write(tmp_path / "lr=0.2" / "seed3", {"train/reward": [(1, 0.125)]})
    runs = read_runs(tmp_path)
    assert [run.name for run in runs] == ["lr=0.1,seed=1", "lr=0.1/seed_2", "lr=0.2/seed3"]  # name order
    first, second, third = runs
    assert (first.params, first.seed) == ({"lr": "0.1"}, 1)
    assert first.series == {"loss": [(1, 2.0)], "train/reward": [(1, 0.5), (2, 0.75)]}
    assert (second.params, second.seed, second.series) == ({"lr": "0.1"}, 2, {"train/reward": [(1, 0.25), (2, 1.0)]})
    assert (third.params, third.seed) == ({"lr": "0.2"}, 3)


def test_hparams_come_before_folder_names_whether_add_hparams_wrote_a_sub_folder_or_not(tmp_path: Path) -> None:
    hparams = {"lr": 1e-05, "seed": 7, "opt": "adam"}
    write(tmp_path / "a" / "lr=9", {"reward": [(1, 0.5)]}, hparams=hparams)                 # torch's timed sub-folder
    write(tmp_path / "b", {"reward": [(1, 0.5)]}, hparams={**hparams, "seed": 8}, hparams_run=".")  # the run's folder
    runs = by_name(read_runs(tmp_path))
    assert sorted(runs) == ["a/lr=9", "b"]  # the sub-folder is the run's hparams record, not a run
    for name, seed in (("a/lr=9", 7), ("b", 8)):
        assert runs[name].params == {"lr": "1e-05", "opt": "adam"} and runs[name].seed == seed  # the seed apart
        assert runs[name].series == {"hparam/final": [(0, 0.5)], "reward": [(1, 0.5)]}


def test_the_seed_of_transformers_args_text_is_the_last_resort(tmp_path: Path) -> None:
    args = {"seed": 42, "learning_rate": 0.001, "output_dir": "x"}
    write(tmp_path / "lr=0.001" / "runs" / "Dec07_13-33-36_vm", {"train/reward": [(1, 0.5)]}, args=args)
    write(tmp_path / "lr=0.002" / "seed=5", {"train/reward": [(1, 0.5)]}, args=args)  # the folder name first
    (trl_like, named) = read_runs(tmp_path)
    assert (trl_like.params, trl_like.seed) == ({"lr": "0.001"}, 42)
    assert (named.params, named.seed) == ({"lr": "0.002"}, 5)


def test_every_value_is_kept_the_last_written_of_a_step_wins_and_double_precision_survives(tmp_path: Path) -> None:
    with SummaryWriter(str(tmp_path / "seed=0")) as writer:
        for step in range(1500):  # more than EventAccumulator's default sample of 1,000 a tag
            writer.add_scalar("many", step / 2, step)
        writer.add_scalar("again", 1.0, 3)
        writer.add_scalar("again", 2.0, 3)
        writer.add_scalar("third", 1 / 3, 0, new_style=True, double_precision=True)
        writer.add_scalar("float32", 1 / 3, 0)
    (run,) = read_runs(tmp_path)
    assert run.series["many"] == [(step, step / 2) for step in range(1500)]
    assert run.series["again"] == [(3, 2.0)]
    assert run.series["third"] == [(0, 1 / 3)]  # float64 as logged
    assert run.series["float32"] != [(0, 1 / 3)] and run.series["float32"][0][1] == pytest.approx(1 / 3, rel=1e-7)


def test_a_run_without_a_seed_is_one_line_naming_the_folder_and_the_fix(tmp_path: Path) -> None:
    write(tmp_path / "lr=0.1,seed=1", {"reward": [(1, 0.5)]})
    write(tmp_path / "lr=0.1" / "trial", {"reward": [(1, 0.5)]})
    with pytest.raises(RlvrlabError, match=r"'lr=0\.1/trial' has no seed") as e:
        read_runs(tmp_path)
    assert "\n" not in str(e.value) and "seed=N" in str(e.value) and "hparam" in str(e.value)


def test_a_folder_without_event_files_or_no_folder_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "empty" / "lr=0.1").mkdir(parents=True)
    (tmp_path / "empty" / "lr=0.1" / "notes.txt").write_text("no events here")
    with pytest.raises(RlvrlabError, match="no TensorBoard event files") as e:
        read_runs(tmp_path / "empty")
    with pytest.raises(RlvrlabError, match="no such folder") as missing:
        read_runs(tmp_path / "absent")
    assert "\n" not in str(e.value) + str(missing.value)


def test_without_tensorboard_the_error_says_what_to_install(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path / "seed=1", {"reward": [(1, 0.5)]})
    for name in [name for name in sys.modules if name.split(".")[0] == "tensorboard"]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it raises ImportError, as when not installed
    with pytest.raises(RlvrlabError, match=r"rlvrlab\[tensorboard\]"):
        read_runs(tmp_path)


def test_a_transformers_run_has_the_metric_names_its_mlflow_callback_logs(tmp_path: Path) -> None:
    args = {"seed": 3, "learning_rate": 0.001}
    tags = {"train/reward": [(1, 0.5)], "train/rewards/countdown_reward/mean": [(1, 0.5)], "eval/loss": [(1, 2.0)],
            "test/accuracy": [(1, 0.25)], "mine/kl": [(1, 0.125)]}
    write(tmp_path / "trainer" / "runs" / "Dec07_13-33-36_vm", tags, args=args)
    write(tmp_path / "script" / "seed=3", tags)  # no `args` text: not a transformers Trainer's run, tags as logged
    script, trainer = read_runs(tmp_path)  # name order
    assert list(trainer.series) == ["eval_loss", "mine/kl", "reward", "rewards/countdown_reward/mean",
                                    "test_accuracy"]
    assert trainer.series["reward"] == [(1, 0.5)] and trainer.series["eval_loss"] == [(1, 2.0)]
    assert list(script.series) == sorted(tags)
    assert [mlflow_name(t) for t in ("train/loss", "eval/runtime", "test/f1", "loss", "trainer/x")] == \
        ["loss", "eval_runtime", "test_f1", "loss", "trainer/x"]


def test_a_transformers_run_logging_a_name_twice_is_one_line_error(tmp_path: Path) -> None:
    write(tmp_path / "seed=1", {"train/reward": [(1, 0.5)], "reward": [(1, 0.25)]}, args={"seed": 1})
    with pytest.raises(RlvrlabError, match="logs both 'train/reward' and 'reward'") as e:
        read_runs(tmp_path)
    assert "\n" not in str(e.value)


def test_histories_serve_series_start_and_the_nonfinite_step_as_mlflow_s_client_does(tmp_path: Path) -> None:
    before = time.time()
    write(tmp_path / "a" / "seed=1", {"loss": [(1, 0.5), (2, float("nan")), (3, 1.0)], "kl": [(1, math.inf)]})
    write(tmp_path / "b" / "seed=1", {"loss": [(1, 0.5), (2, 0.25)]})
    runs = read_runs(tmp_path)
    client = Histories(runs)
    assert [(m.step, m.value) for m in client.get_metric_history("b/seed=1", "loss")] == [(1, 0.5), (2, 0.25)]
    assert client.get_metric_history("b/seed=1", "absent") == []
    assert client.get_run("a/seed=1").data.tags == {NONFINITE_STEP: "1"}  # the first non-finite step of any scalar
    assert client.get_run("b/seed=1").data.tags == {}
    for run in runs:  # ms, from the run's first event
        assert before - 1 <= client.get_run(run.name).info.start_time / 1000 <= time.time() + 1


# ---------------------------------------------------------------- TRL's own event files
def _example():
    spec = importlib.util.spec_from_file_location("trl_grpo_example", REPO / "examples" / "trl_grpo.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


@pytest.mark.slow  # 1-3 min on 2 busy cores: importing TRL, building the tiny model folder once, 6 runs of 2 steps
def test_trl_runs_logged_to_tensorboard_and_mlflow_give_the_same_report(tmp_path: Path, monkeypatch) -> None:
    """examples/trl_grpo.py --report-to tensorboard,mlflow: one run per (learning rate, seed) logs each step to both
    stores. The TensorBoard report equals the MLflow report byte for byte in comparisons.csv for TRL's reward (k/4 of
    4 completions) and entropy (a float32 tensor's item()), which float32 keeps exactly; a float64 value (the step's
    wall time) is the float32 rounding of MLflow's."""
    pytest.importorskip("trl")
    import mlflow

    from rlvrlab.report.command import ReportRequest, make_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "trl")  # transformers' MLflowCallback: one run per training
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    example = _example()
    try:
        for lr in ("0.0001", "0.01"):
            for seed in (0, 1, 2):  # the seed only in TRL's `args` text: the folder says out<seed>
                example.main(["--learning-rate", lr, "--seed", str(seed), "--steps", "2", "--prompts-per-step", "2",
                              "--num-generations", "2", "--max-completion-length", "8", "--threads", "0",
                              "--report-to", "tensorboard,mlflow",
                              "--output-dir", str(tmp_path / "tb" / f"learning_rate={lr}" / f"out{seed}")])
    finally:
        mlflow.set_tracking_uri(previous)
    runs = read_runs(tmp_path / "tb")  # transformers' TensorBoardCallback: output_dir/runs/<date_host>/
    assert [(run.name.split("/runs/")[0], run.params, run.seed) for run in runs] == [
        (f"learning_rate={lr}/out{seed}", {"learning_rate": lr}, seed) for lr in ("0.0001", "0.01") for seed in range(3)]
    assert all({"reward", "entropy", "loss"} <= set(run.series) for run in runs)  # MLflow's names, no train/

    def both(metrics: tuple[str, ...], name: str) -> tuple[Path, Path]:
        common = dict(metric=metrics, baseline="learning_rate=0.0001", plots=False)
        make_report(ReportRequest(experiment="trl", group_by="learning_rate", tracking_uri=uri,
                                  out=tmp_path / f"mlflow_{name}", **common))
        make_report(ReportRequest(source=f"tensorboard:{tmp_path / 'tb'}", out=tmp_path / f"tb_{name}", **common))
        return tmp_path / f"mlflow_{name}", tmp_path / f"tb_{name}"

    from_mlflow, from_tb = both(("reward:mean:1", "entropy:mean:2"), "exact")
    assert (from_tb / "comparisons.csv").read_bytes() == (from_mlflow / "comparisons.csv").read_bytes()
    assert (from_tb / "table.csv").read_bytes() == (from_mlflow / "table.csv").read_bytes()
    values = [float(r["value"]) for r in _rows(from_mlflow / "per_seed.csv") if r["metric"] == "reward:mean:1"]
    assert len(values) == 6 and all(4 * v == int(4 * v) for v in values)  # k/4: exact in float32

    from_mlflow, from_tb = both(("step_time:mean:1",), "float64")  # seconds, a float64 when logged
    logged, kept = (_rows(folder / "per_seed.csv") for folder in (from_mlflow, from_tb))
    assert [(r["group"], r["seed"]) for r in kept] == [(r["group"], r["seed"]) for r in logged]
    assert [float(r["value"]) for r in kept] == [float(np.float32(float(r["value"]))) for r in logged]
    for a, b in zip(_rows(from_mlflow / "comparisons.csv"), _rows(from_tb / "comparisons.csv"), strict=True):
        for column in ("delta", "low", "high"):
            assert float(b[column]) == pytest.approx(float(a[column]), rel=1e-6, abs=1e-6)
