"""TensorBoard event files as seed runs (rlvrlab.report.tensorboard): folders, params and seeds by the documented rule,
written here with torch's SummaryWriter (what transformers' TensorBoardCallback, and so TRL's report_to=
"tensorboard", uses), and once by TRL's GRPOTrainer itself (slow).
Run: .venv/bin/pytest -q tests/report/test_tensorboard.py"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from google.protobuf import struct_pb2
from torch.utils.tensorboard import SummaryWriter

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.tensorboard import TBRun, folder_name_parts, hparam_text, read_runs

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


# ---------------------------------------------------------------- TRL's own event files
@pytest.mark.slow  # ~1 min on 2 busy cores: importing TRL, building the tiny tier's model folder; the steps take a second
def test_trl_grpo_trainer_with_report_to_tensorboard_gives_a_run_per_seed(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    spec = importlib.util.spec_from_file_location("trl_grpo_example", REPO / "examples" / "trl_grpo.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    folder, tokenizer, rows, reward = example.countdown_task(None, 4)  # the example's task, as in its main()
    for seed in (0, 1):
        config = GRPOConfig(
            output_dir=str(tmp_path / "lr=0.0001" / f"out{seed}"), max_steps=2, seed=seed, learning_rate=1e-4,
            beta=0.0, per_device_train_batch_size=4, num_generations=2, max_completion_length=8, use_cpu=True,
            logging_steps=1, report_to=["tensorboard"], save_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, dataloader_pin_memory=False)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(rows),
                    processing_class=tokenizer).train()
    runs = read_runs(tmp_path)
    # transformers' TensorBoardCallback: output_dir/runs/<date_host>/, the seed in its `args` text, tags train/...
    assert [run.name.split("/runs/")[0] for run in runs] == ["lr=0.0001/out0", "lr=0.0001/out1"]
    assert [(run.params, run.seed) for run in runs] == [({"lr": "0.0001"}, 0), ({"lr": "0.0001"}, 1)]
    for run in runs:
        assert [step for step, _ in run.series["train/reward"]] == [1, 2]
        assert all(0.0 <= value <= 1.0 for _, value in run.series["train/reward"])
        assert "train/entropy" in run.series and "train/loss" in run.series
