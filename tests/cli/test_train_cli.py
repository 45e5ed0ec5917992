"""`rlvrlab train` from the shell: bad input is one line and exit 1 before any work; a good run prints its id."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


def rlvrlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_model_folder_is_one_line_before_any_run_exists(tmp_path):
    result = rlvrlab("train", "model.tier=real", f"model.path={tmp_path / 'nope'}", f"output_dir={tmp_path}")
    assert_one_line_error(result, f"model.path {tmp_path / 'nope'} does not exist", "Hugging Face model folder")
    assert not (tmp_path / "mlflow.db").exists()


def test_folder_without_a_model_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    result = rlvrlab("train", "model.tier=real", f"model.path={tmp_path / 'empty'}", f"output_dir={tmp_path}")
    assert_one_line_error(result, "has no config.json")


def test_dataset_row_without_the_answer_field_names_the_record(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2"}) + "\n")
    result = rlvrlab("train", "dataset.format=jsonl", f"dataset.path={data}", "dataset.name=mine",
                     f"output_dir={tmp_path}")
    assert_one_line_error(result, "data.jsonl line 2 has no field 'answer'", "dataset.answer_field")
    assert not (tmp_path / "mlflow.db").exists()


def test_unreadable_jsonl_is_one_line(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n{not json\n')
    result = rlvrlab("train", "dataset.format=jsonl", f"dataset.path={data}", "dataset.name=mine",
                     f"output_dir={tmp_path}")
    assert_one_line_error(result, "line 2 is not JSON")


def test_bad_override_is_one_line(tmp_path):
    assert_one_line_error(rlvrlab("train", "algorithm.tua=0.3"), "did you mean 'algorithm.tau'")


def test_resume_of_an_unknown_run_is_one_line(tmp_path):
    assert_one_line_error(rlvrlab("train", "--resume", "abc123", f"output_dir={tmp_path}"),
                          "--resume abc123", "does not exist")


def test_resume_refuses_config_changes(tmp_path):
    assert_one_line_error(rlvrlab("train", "--resume", "abc123", "algorithm.tau=0.3"), "cannot change it")


@pytest.mark.slow
def test_default_tiny_experiment_trains_and_prints_how_to_look(tmp_path):
    """The README's experiment, shortened: tiny transformer, Countdown, GRPO, DeepSpeed, MLflow."""
    from mlflow.tracking import MlflowClient

    result = rlvrlab("train", "steps=4", "trainer.checkpoint_every=2", f"output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mlflow ui --backend-store-uri sqlite:///" in result.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("default").experiment_id)
    assert run.info.status == "FINISHED" and run.data.tags["tier"] == "tiny"
    assert run.info.run_id in result.stdout
    history = client.get_metric_history(run.info.run_id, "rollout/logp_gap_max")
    assert len(history) == 4 and max(m.value for m in history) < 1e-4  # hf engine and trainer agree
    model = tmp_path / run.info.run_id / "checkpoints" / "step_000004" / "model"
    assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file()
    assert (tmp_path / run.info.run_id / "checkpoints" / "step_000004" / "deepspeed").is_dir()


@pytest.mark.slow
def test_sigterm_stops_a_run_as_ctrl_c_does_and_it_resumes(tmp_path):
    """`kill` during a run: one line naming the run and how to continue it, exit 1, the MLflow run KILLED and its
    checkpoints kept; `--resume` then finishes it."""
    import signal
    import time

    from mlflow.tracking import MlflowClient

    proc = subprocess.Popen([sys.executable, "-m", "rlvrlab.cli.main", "train", "toy", "steps=200",
                             "trainer.checkpoint_every=5", f"output_dir={tmp_path}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("*/checkpoints/step_*/COMPLETE")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: stopped at step ") and "ended KILLED" in line, line
    run_id = line.split("MLflow run ")[1].split()[0]
    saved = int(line.split("continue it from step ")[1].split()[0])
    assert f"`rlvrlab train --resume {run_id} output_dir={tmp_path}`" in line
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"
    assert (tmp_path / run_id / "checkpoints" / f"step_{saved:06d}" / "COMPLETE").exists()

    # --resume only continues or extends a run (tests/test_faults.py): it trains the remaining steps
    resumed = rlvrlab("train", "--resume", run_id, f"output_dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr
    assert client.get_run(run_id).info.status == "FINISHED"
    assert {m.step for m in client.get_metric_history(run_id, "train/reward")} == set(range(200))
