"""The fault battery (issue 19): damaged checkpoints, shared stores, interrupted commands, bad output locations and
hostile names, on the toy tier. Every scenario checks the exit code, a one-line message without a traceback, the
run's MLflow status where there is a run, and that nothing was written outside the folders meant for it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvrlab import rundir
from rlvrlab.errors import RlvrlabError

TIMEOUT = 600  # against hangs only; nothing here is timed


def rlvrlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=TIMEOUT, env={**os.environ, "RLVRLAB_NO_PROGRESS": "1"})


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def client(output_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{output_dir.resolve() / 'mlflow.db'}")


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


# A finished toy run: 4 steps, checkpoints at 2 and 4. Its output folder's name holds a space and a `$` (the
# printed commands must quote it) and its experiment name tries to climb out of results/.
HOSTILE_EXPERIMENT = "../../../escaped"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(output_dir, run id, the train command's stdout) of the module's one trained run; tests copy it."""
    output_dir = tmp_path_factory.mktemp("finished") / "out dir $HOME"
    result = rlvrlab("train", "toy", "steps=4", "trainer.checkpoint_every=2", f"output_dir={output_dir}",
                     f"experiment={HOSTILE_EXPERIMENT}")
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.split("MLflow run ")[1].split()[0]
    return output_dir, run_id, result.stdout


@pytest.fixture
def run_copy(finished, tmp_path: Path) -> tuple[Path, str]:
    """A private copy of the finished run's output folder (its sqlite store and run folder)."""
    source, run_id, _ = finished
    output_dir = tmp_path / "runs"
    shutil.copytree(source, output_dir)
    return output_dir, run_id


def status_and_end(output_dir: Path, run_id: str) -> tuple[str, int | None]:
    info = client(output_dir).get_run(run_id).info
    return info.status, info.end_time


def truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(max(path.stat().st_size // 2, 0))


# --------------------------------------------------------------------------------------------- 1. checkpoints
def test_checkpoints_carry_checksums_of_every_file(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints" / "step_000003"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "w.bin").write_bytes(b"weights")
    (folder / "state.pt").write_bytes(b"state")
    rundir.write_complete(folder, 3)
    marker = json.loads((folder / rundir.COMPLETE).read_text())
    assert marker["step"] == 3 and set(marker["sha256"]) == {"model/w.bin", "state.pt"}
    assert rundir.damage(folder) is None
    (folder / "state.pt").write_bytes(b"stat")
    assert "state.pt does not match its checksum" in rundir.damage(folder)
    (folder / "state.pt").unlink()
    assert "state.pt is missing" in rundir.damage(folder)
    (folder / rundir.COMPLETE).write_text("3\n")  # written before checksums existed: cannot be checked
    assert rundir.damage(folder) is None


@pytest.mark.parametrize("damaged", ["torch_engine.pt", "state_rank0.pt", "model/model.safetensors"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(run_copy, damaged: str) -> None:
    """Truncating a file of the newest checkpoint costs one checkpoint interval, never the run: resume warns in one
    line and continues from the intact one; the run ends FINISHED with every step's metrics."""
    output_dir, run_id = run_copy
    truncate(output_dir / run_id / "checkpoints" / "step_000004" / damaged)
    result = rlvrlab("train", "--resume", run_id, f"output_dir={output_dir}", "steps=6")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and damaged in warnings[0] and "step_000002" in warnings[0], result.stderr
    assert status_and_end(output_dir, run_id)[0] == "FINISHED"
    steps = {m.step for m in client(output_dir).get_metric_history(run_id, "train/reward")}
    assert steps == set(range(6))
    # the extension is recorded: in MLflow (its steps param stays 4) and in the run folder's config.yaml
    run = client(output_dir).get_run(run_id)
    assert run.data.tags["rlvrlab.resume.steps_extended_from"] == "4" and run.data.tags["rlvrlab.steps"] == "6"
    assert run.data.params["steps"] == "4"
    config = (output_dir / run_id / "config.yaml").read_text()
    assert config.startswith("# resume: steps extended from 4 to 6") and "\nsteps: 6\n" in config


def test_no_intact_checkpoint_fails_in_one_line_and_leaves_the_run_finished(run_copy) -> None:
    output_dir, run_id = run_copy
    before = status_and_end(output_dir, run_id)
    for step in ("step_000002", "step_000004"):
        truncate(output_dir / run_id / "checkpoints" / step / "torch_engine.pt")
    one_line_error(rlvrlab("train", "--resume", run_id, f"output_dir={output_dir}", "steps=6"),
                   "cannot be resumed", "step_000002", "step_000004", "records are unchanged")
    assert status_and_end(output_dir, run_id) == before == ("FINISHED", before[1])


def test_eval_of_a_run_skips_a_damaged_checkpoint(run_copy, capsys) -> None:
    from rlvrlab.eval.pipeline import _checkpoint

    output_dir, run_id = run_copy
    folder = output_dir / run_id
    truncate(folder / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    assert _checkpoint(folder, run_id, None).name == "step_000002"
    assert "model.safetensors" in capsys.readouterr().err
    with pytest.raises(RlvrlabError, match="step_000004 .*model.safetensors does not match.*intact checkpoint "
                                           "steps: 2"):
        _checkpoint(folder, run_id, 4)
    truncate(folder / "checkpoints" / "step_000002" / "state_rank0.pt")
    with pytest.raises(RlvrlabError, match="cannot be evaluated"):
        _checkpoint(folder, run_id, None)
    # from the command line: one line, before any model is loaded
    one_line_error(rlvrlab("eval", "pass-at-k", "--run", run_id, "--output-dir", str(output_dir), "--checkpoint",
                           "4", "--dataset", "toy"), "does not match its checksum")


# ------------------------------------------------------------------------------------ 3. one writer, one store
def test_a_run_being_trained_refuses_a_second_writer(run_copy) -> None:
    from rlvrlab.outputs import RunLock

    output_dir, run_id = run_copy
    before = status_and_end(output_dir, run_id)
    with RunLock(output_dir / run_id, run_id):  # this process "trains" the run
        line = one_line_error(rlvrlab("train", "--resume", run_id, f"output_dir={output_dir}", "steps=6"),
                              f"run {run_id} is being trained by pid {os.getpid()} on {socket.gethostname()}")
    assert ".lock" in line
    assert status_and_end(output_dir, run_id) == before


def test_two_resumes_of_one_run_at_once_one_is_refused(run_copy) -> None:
    """Two `--resume` of the same run at once: the second says who trains it, in one line; the first goes on."""
    output_dir, run_id = run_copy
    first = subprocess.Popen([sys.executable, "-m", "rlvrlab.cli.main", "train", "--resume", run_id,
                              f"output_dir={output_dir}", "steps=100000"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "RLVRLAB_NO_PROGRESS": "1"})
    lock, deadline = output_dir / run_id / ".lock", time.monotonic() + TIMEOUT
    while not (lock.exists() and f'"pid": {first.pid}' in lock.read_text()):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.1)
    one_line_error(rlvrlab("train", "--resume", run_id, f"output_dir={output_dir}", "steps=100000"),
                   f"is being trained by pid {first.pid}")
    assert first.poll() is None
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=TIMEOUT)
    assert first.returncode == 1 and "ended KILLED" in err.strip().splitlines()[-1], err
    assert status_and_end(output_dir, run_id)[0] == "KILLED"


def test_a_stale_lock_of_a_dead_process_is_taken_over(run_copy) -> None:
    output_dir, run_id = run_copy
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (output_dir / run_id / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                                           "started": "2026-01-01T00:00:00+0000"}))
    result = rlvrlab("train", "--resume", run_id, f"output_dir={output_dir}", "steps=6")
    assert result.returncode == 0, result.stderr
    assert status_and_end(output_dir, run_id)[0] == "FINISHED"
    assert (output_dir / run_id / ".lock").read_text() == ""  # released at the end


def test_two_first_runs_on_a_fresh_store_both_succeed(tmp_path: Path) -> None:
    output_dir = tmp_path / "fresh"
    command = [sys.executable, "-m", "rlvrlab.cli.main", "train", "toy", "steps=2", f"output_dir={output_dir}"]
    procs = [subprocess.Popen([*command, f"seed={seed}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    outs = [proc.communicate(timeout=TIMEOUT) for proc in procs]
    for proc, (_, err) in zip(procs, outs):
        assert proc.returncode == 0 and "Traceback" not in err, err
    run_ids = [out.split("MLflow run ")[1].split()[0] for out, _ in outs]
    assert {status_and_end(output_dir, r)[0] for r in run_ids} == {"FINISHED"}


# ---------------------------------------------------------------------------------------- 4. stops, twice
@pytest.mark.parametrize("sig, gap", [(signal.SIGINT, 0.01), (signal.SIGINT, 0.3), (signal.SIGTERM, 0.01)])
def test_a_second_signal_still_ends_the_run_killed_with_its_metrics(tmp_path: Path, sig: int, gap: float) -> None:
    """Two signals in a row (an impatient Ctrl-C Ctrl-C, or `kill` twice), the second one during the step or the
    cleanup (gap 0.01 s) or as the process exits (0.3 s): the run ends KILLED with every trained step's metrics,
    the process exits 1 and its last line says how to continue it."""
    proc = subprocess.Popen([sys.executable, "-m", "rlvrlab.cli.main", "train", "toy", "steps=1000000",
                             "trainer.checkpoint_every=5", f"output_dir={tmp_path}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RLVRLAB_NO_PROGRESS": "1"})
    deadline = time.monotonic() + TIMEOUT
    while not list(tmp_path.glob("*/checkpoints/step_*/COMPLETE")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(sig)
    time.sleep(gap)
    if proc.poll() is None:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: stopped at step ") and "ended KILLED" in line, err
    assert err.count("stopping at the end of this step") == 1
    run_id = line.split("MLflow run ")[1].split()[0]
    stopped = int(line.split("stopped at step ")[1].split(":")[0])
    saved = int(line.split("continue it from step ")[1].split()[0])
    assert f"`rlvrlab train --resume {run_id} output_dir={tmp_path}`" in line
    assert status_and_end(tmp_path, run_id)[0] == "KILLED"
    steps = {m.step for m in client(tmp_path).get_metric_history(run_id, "train/reward")}
    assert steps == set(range(stopped)) and saved <= stopped


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


SWEEP = """\
experiment: toy
overrides: [algorithm=ucpo, steps=100000, trainer.checkpoint_every=0]
sampler: grid
seeds: 1
space:
  algorithm.tau: [0.0, 1.0]
objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 4}
"""


def test_sigterm_to_a_sweep_with_workers_ends_its_study_run(tmp_path: Path) -> None:
    """SIGTERM to `rlvrlab sweep --workers 2` alone: the workers stop, and so does the study's MLflow run (KILLED);
    the stop message is printed once and names the signal."""
    path = tmp_path / "long.yaml"
    path.write_text(SWEEP)
    proc = subprocess.Popen([sys.executable, "-m", "rlvrlab.cli.main", "sweep", str(path), "--workers", "2"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs"
    deadline = time.monotonic() + TIMEOUT
    while len([p for p in runs.glob("*/config.yaml")]) < 2:  # both workers train a seed run
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err  # 143: rlvrlab.sweep.exits
    assert err.count("stopping at the end of this step") == 1 and "SIGTERM received" in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: sweep stopped by SIGTERM") and "ended KILLED" in line, err
    mlflow = client(runs)
    experiment = mlflow.get_experiment_by_name("long")
    statuses = {r.data.tags.get("rlvrlab.role"): r.info.status
                for r in mlflow.search_runs([experiment.experiment_id], filter_string="tags.`rlvrlab.role` = 'study'")}
    assert statuses == {"study": "KILLED"}
    seeds = mlflow.search_runs([experiment.experiment_id], filter_string="tags.`rlvrlab.role` = 'seed'")
    assert seeds and "RUNNING" not in {r.info.status for r in seeds}


@pytest.mark.parametrize("skip_teardown", [False, True])
def test_a_sigterm_during_the_exit_of_a_process_breaks_nothing(skip_teardown: bool) -> None:
    """A sweep stopped by SIGTERM passes it on to every worker still alive, and one may be ending on its own at that
    moment, inside its atexit handlers (procs.exit_now). The late signal must not raise KeyboardInterrupt in a handler
    (Python prints its traceback and goes on): the handlers all run, the exit code is the process's own. A sweep
    worker (procs.end_without_teardown) runs them all too, logging's flush included, then skips the interpreter's
    teardown: an object that module teardown would finalize is not."""
    code = ("import atexit, logging, os, signal, sys, time\n"
            "from rlvrlab.procs import end_without_teardown, exit_now, install_stop_handlers\n"
            f"if {skip_teardown}: end_without_teardown()\n"
            "install_stop_handlers(announce=False)\n"
            "class Finalized:\n"
            "    def __del__(self): print('torn down', flush=True)\n"
            "kept = Finalized()\n"
            "logging.basicConfig(stream=sys.stdout, format='%(message)s')\n"
            "logging.warning('logged')\n"
            "atexit.register(lambda: print('second handler ran', flush=True))\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.2)))\n"
            "exit_now(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, \
        done.stderr
    assert done.stdout == "logged\nsecond handler ran\n" + ("" if skip_teardown else "torn down\n")


# ------------------------------------------------------------------------------------- 5. resume and history
@pytest.mark.parametrize("override, fragment", [
    ("steps=3", "would shorten the run"),
    ("seed=7", "cannot change it"),
    ("tracking.log_every=2", "tracking.log_every differs from the run's own config.yaml"),
])
def test_resume_refuses_to_rewrite_history(run_copy, override: str, fragment: str) -> None:
    output_dir, run_id = run_copy
    config = (output_dir / run_id / "config.yaml").read_bytes()
    before = status_and_end(output_dir, run_id)
    one_line_error(rlvrlab("train", "--resume", run_id, f"output_dir={output_dir}", override), fragment)
    assert (output_dir / run_id / "config.yaml").read_bytes() == config
    assert status_and_end(output_dir, run_id) == before


def test_resuming_a_finished_run_says_nothing_was_left_to_do(run_copy) -> None:
    output_dir, run_id = run_copy
    config = (output_dir / run_id / "config.yaml").read_bytes()
    before = status_and_end(output_dir, run_id)
    metrics = len(client(output_dir).get_metric_history(run_id, "train/reward"))
    result = rlvrlab("train", "--resume", run_id, f"output_dir={output_dir}")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "nothing to do" in result.stdout and "done" not in result.stdout.replace("nothing to do", "")
    assert status_and_end(output_dir, run_id) == before
    assert len(client(output_dir).get_metric_history(run_id, "train/reward")) == metrics
    assert (output_dir / run_id / "config.yaml").read_bytes() == config


# --------------------------------------------------------------------------------------- 2. output locations
def _bad_location(tmp_path: Path, kind: str) -> Path:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder\n")
    if kind == "a file":
        return blocker
    if kind == "under a file":
        return blocker / "runs"
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder / "runs" if kind == "unwritable parent" else folder


KINDS = ["a file", "under a file",
         pytest.param("read-only", marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only "
                                                            "folders; the file variants cover the same check")),
         pytest.param("unwritable parent", marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes in "
                                                                    "read-only folders"))]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["train", "eval", "sweep", "report", "model import"])
def test_bad_output_locations_fail_at_once_in_one_line(tmp_path: Path, kind: str, command: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    bad = _bad_location(tmp_path, kind)
    before = files_under(tmp_path)
    if command == "train":
        result = rlvrlab("train", "toy", "steps=2", f"output_dir={bad}", cwd=work)
    elif command == "eval":  # --out a file: refused before the model is even looked at
        result = rlvrlab("eval", "pass-at-k", "--model", str(tmp_path / "no_model"), "--dataset", "toy",
                         "--out", str(bad), cwd=work)
    elif command == "sweep":
        sweep = work / "s.yaml"
        sweep.write_text(SWEEP.replace("steps=100000", "steps=4"))
        before = files_under(tmp_path)
        result = rlvrlab("sweep", str(sweep), f"output_dir={bad}", cwd=work)
    elif command == "report":
        result = rlvrlab("report", "--experiment", "toy", "--out", str(bad), cwd=work)
    else:
        result = rlvrlab("model", "import", str(tmp_path / "model.gguf"), "--out", str(bad), cwd=work)
    line = one_line_error(result)
    assert str(bad) in line or str(bad.parent) in line, line
    assert files_under(tmp_path) == before  # nothing written anywhere


def test_a_read_only_output_dir_fails_before_mlflow_is_opened(tmp_path: Path, monkeypatch) -> None:
    """A read-only mount (simulated: root passes permission checks) is refused by train() before any MLflow store
    is opened (which would retry sqlite for minutes), and nothing is created there."""
    from rlvrlab import outputs
    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    folder = tmp_path / "mounted_ro"
    folder.mkdir()
    monkeypatch.setattr(outputs, "read_only_fs", lambda path: Path(path) == folder)
    with pytest.raises(RlvrlabError, match=f"cannot write in {folder}/runs .*nearest existing parent {folder} is "
                                           "read-only"):
        train(compose("toy", [f"output_dir={folder}/runs", "steps=2"]))
    assert not any(folder.iterdir())


# -------------------------------------------------------------------------------------- 6. hostile and careless
def test_printed_commands_are_shell_quoted(finished) -> None:
    import shlex

    output_dir, _, stdout = finished
    line = next(line for line in stdout.splitlines() if "mlflow ui" in line)
    command = line.split("look at it: ")[1].split("  then open")[0]
    assert shlex.split(command) == ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{output_dir}/mlflow.db"]


def test_report_names_stay_inside_results(run_copy, tmp_path: Path) -> None:
    output_dir, _ = run_copy
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    before = files_under(tmp_path) - files_under(work)
    result = rlvrlab("report", "--experiment", HOSTILE_EXPERIMENT, "--output-dir", str(output_dir), "--no-plots",
                     cwd=work)
    assert result.returncode == 0, result.stderr
    outside = (files_under(tmp_path) - files_under(work)) - before
    assert not outside, outside
    written = [p for p in files_under(work / "results") if p.is_file()]
    assert written and all(len(p.relative_to(work / "results").parts) == 2 for p in written), written


@pytest.mark.parametrize("override, fragment", [
    ("seed=99999999999999999999", "seed=99999999999999999999 is out of range"),
    ("seed=-1", "seed=-1 is out of range"),
    ("trainer.lr=inf", "trainer.lr=inf is out of range"),
    ("trainer.lr=-inf", "trainer.lr=-inf is out of range"),
    ("trainer.lr=nan", "trainer.lr=nan is out of range"),
])
def test_numbers_out_of_range_are_refused_at_composition(override: str, fragment: str) -> None:
    one_line_error(rlvrlab("config", "show", "toy", override), fragment)


def test_inf_still_turns_a_clip_off() -> None:
    import math

    from rlvrlab.config import compose

    assert compose("toy", ["algorithm.eps_high=inf"]).algorithm.eps_high == math.inf


def test_careless_files(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    one_line_error(rlvrlab("config", "show", str(binary)), "is not a text file")
    folder = tmp_path / "data_folder"
    folder.mkdir()
    one_line_error(rlvrlab("train", "dataset.format=jsonl", f"dataset.path={folder}", f"output_dir={tmp_path}/r"),
                   "is a folder")
    # an experiment file kept outside experiments/ composes from the shipped groups
    mine = tmp_path / "elsewhere" / "mine.yaml"
    mine.parent.mkdir()
    mine.write_text("defaults: {algorithm: ucpo, model: toy, dataset: toy}\nexperiment: mine\n")
    shown = rlvrlab("config", "show", str(mine))
    assert shown.returncode == 0 and "name: ucpo" in shown.stdout, shown.stderr
    mine.write_text("defaults: {algorithm: no_such_algorithm, model: toy, dataset: toy}\n")
    one_line_error(rlvrlab("config", "show", str(mine)), "elsewhere/algorithms", "experiments/algorithms", "grpo")


def test_sweep_status_creates_nothing_and_names_what_differs(tmp_path: Path) -> None:
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import open_sweep

    path = tmp_path / "st.yaml"
    path.write_text(SWEEP.replace("steps=100000", "steps=4"))
    one_line_error(rlvrlab("sweep", str(path), "--status", cwd=tmp_path), "no study 'st'", "does not exist")
    assert not (tmp_path / "runs").exists()  # no empty journal, no folder

    here = Path.cwd()
    os.chdir(tmp_path)
    try:  # the study started with an override; --status without it
        open_sweep(load_sweep(str(path), ["trainer.lr=0.1"]))
    finally:
        os.chdir(here)
    mtime = path.stat().st_mtime
    line = one_line_error(rlvrlab("sweep", str(path), "--status", cwd=tmp_path), "different sweep",
                          "the overrides (the study was started with", "trainer.lr=0.1")
    assert "sweep file" not in line and path.stat().st_mtime == mtime


def test_latex_specials_in_labels_are_escaped() -> None:
    from rlvrlab.report.escape import tex

    text = tex(r"a\b_{c}%&$#~^<>|")
    assert text == (r"a\textbackslash{}b\_\{c\}\%\&\$\#\textasciitilde{}\textasciicircum{}\textless{}"
                    r"\textgreater{}\textbar{}")
    assert text.count("{") - text.count(r"\{") == text.count("}") - text.count(r"\}")  # braces balance


def test_a_long_param_is_kept_whole_as_an_artifact(tmp_path: Path) -> None:
    from rlvrlab.tracking.mlflow_tracker import PARAM_LIMIT, MlflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "long", artifact_root=tmp_path / "art")
    value = "x" * 8999 + "!"
    tracker.log_params({"dataset.template": value, "short": 1})
    tracker.finish("FINISHED")
    run = client(tmp_path).get_run(tracker.run_id)
    shown = run.data.params["dataset.template"]
    assert len(shown) <= PARAM_LIMIT and "truncated: 9000 characters" in shown
    assert run.data.tags["rlvrlab.truncated_params"] == "dataset.template"
    assert run.data.params["short"] == "1"
    import mlflow

    full = mlflow.artifacts.load_text(f"{run.info.artifact_uri}/params/dataset.template.txt")
    assert full == value


def test_metrics_reach_the_store_as_logged_non_finite_values_as_nan(tmp_path: Path) -> None:
    """Every point of every flush is stored under its step, a key logged at some steps only included; NaN and
    infinities are stored as NaN; the latest value is the one of the largest step."""
    import math

    from rlvrlab.tracking.mlflow_tracker import _BATCH, MlflowTracker

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "rows", artifact_root=tmp_path / "art")
    steps = range(2 * _BATCH // 3 + 1)  # three keys a step: more points than one log_batch call takes
    for step in steps:
        tracker.log_metrics(step, {"a": step / 4, "b": math.inf if step % 2 else -math.inf, "c": math.nan}
                            | ({"d": 1.0} if step % 100 == 0 else {}))
        if step == 100:
            tracker.flush(wait=False)
    tracker.finish("FINISHED")
    mlflow = client(tmp_path)
    history = {key: sorted((m.step, m.value) for m in mlflow.get_metric_history(tracker.run_id, key))
               for key in "abcd"}
    assert history["a"] == [(step, step / 4) for step in steps]
    assert [s for s, _ in history["b"]] == [s for s, _ in history["c"]] == list(steps)
    assert all(math.isnan(v) for key in "bc" for _, v in history[key])
    assert history["d"] == [(step, 1.0) for step in steps if step % 100 == 0]
    assert mlflow.get_run(tracker.run_id).data.metrics["a"] == steps[-1] / 4


def test_params_are_stored_once_and_a_changed_value_is_refused(tmp_path: Path) -> None:
    """A run's ~200 params go in through log_batch, more than one call's 100; logged again, the same values are
    accepted and another value is refused with MLflow's own error, as is a bad key."""
    from mlflow.exceptions import MlflowException

    from rlvrlab.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "rows", artifact_root=tmp_path / "art")
    params = {f"group{i % 7}.key{i}": value for i, value in enumerate([0.5, "x", None, True, float("inf"), 3] * 40)}
    tracker.log_params(params)
    stored = client(tmp_path).get_run(tracker.run_id).data.params
    assert stored == {key: str(value) for key, value in params.items()}
    tracker.log_params({"group0.key0": 0.5, "new": 1})  # the same value again, and a new key: accepted
    assert client(tmp_path).get_run(tracker.run_id).data.params["new"] == "1"
    with pytest.raises(MlflowException, match="Changing param values is not allowed"):
        tracker.log_params({"group0.key0": 0.25})
    with pytest.raises(MlflowException, match="Invalid value|Invalid parameter name|Names may"):
        tracker.log_params({"bad\nkey": 1})


@pytest.mark.parametrize("status, ended", [("KILLED", "KILLED"), ("FINISHED", "FAILED")])
def test_a_run_whose_last_metrics_cannot_be_written_still_ends(tmp_path: Path, monkeypatch, status: str,
                                                                ended: str) -> None:
    """finish() writes the run's status even when its final flush fails: a run left RUNNING reads as alive to
    `sweep status` and to the liveness checks. A FINISHED run whose metrics were lost is FAILED; the error is raised."""
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "ends", artifact_root=tmp_path / "art")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tracker.client, "log_batch", broken)
    tracker.log_metrics(0, {"a": 1.0})
    with pytest.raises(OSError, match="disk full"):
        tracker.finish(status)
    monkeypatch.undo()
    assert tracker.client.get_run(tracker.run_id).info.status == ended


def test_a_locked_sqlite_store_is_tried_again_not_given_up(monkeypatch) -> None:
    """sqlite answers "database is locked" at once when two transactions would wait for each other (MLflow's 20 s
    busy wait does not apply then): the writes that end a run try again; any other error is raised at once."""
    import sqlite3

    from rlvrlab.tracking import mlflow_tracker

    monkeypatch.setattr(mlflow_tracker, "LOCK_RETRIES", (0.0, 0.0, 0.0))
    answers: list = []

    def write():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    answers[:] = [sqlite3.OperationalError("database is locked")] * 2 + ["ok"]
    assert mlflow_tracker.retry_locked(write) == "ok" and answers == []
    answers[:] = [sqlite3.OperationalError("database is locked")] * 4
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        mlflow_tracker.retry_locked(write)
    answers[:] = [sqlite3.OperationalError("no such table: runs"), "ok"]
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        mlflow_tracker.retry_locked(write)


# ------------------------------------------------------------------- 7. nothing lost, second battery (issue 39)
def _metric_steps(output_dir: Path, run_id: str) -> dict[str, list[int]]:
    """Every metric key of a run -> the steps of its stored points, sorted (a step logged twice appears twice)."""
    mlflow = client(output_dir)
    return {key: sorted(m.step for m in mlflow.get_metric_history(run_id, key))
            for key in mlflow.get_run(run_id).data.metrics}


def test_a_checkpoint_is_complete_only_once_the_metrics_of_its_steps_are_stored(run_copy, monkeypatch) -> None:
    """The metrics of step 3 cannot be stored (ENOSPC injected) while checkpoint step_000004 is written: that
    checkpoint is never marked COMPLETE, the run ends FAILED with one line saying how to continue it, and --resume
    continues from step_000002, so that every metric has every step (a checkpoint ahead of the stored metrics left a
    silent hole in each of them)."""
    import errno

    from rlvrlab.config import compose
    from rlvrlab.errors import StorageError
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker
    from rlvrlab.train.loop import train

    output_dir, _ = run_copy
    write = MlflowTracker._write

    def full_disk(self, metrics) -> None:
        if any(m.step == 3 for m in metrics):
            self._error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return
        write(self, metrics)

    monkeypatch.setattr(MlflowTracker, "_write", full_disk)
    cfg = compose("toy", [f"output_dir={output_dir}", "steps=6", "trainer.checkpoint_every=2"])
    with pytest.raises(StorageError, match=r"stopped: no space left on the device \(OSError: .*No space left on "
                                           r"device\); free space there, then `rlvrlab train --resume \w+ "
                                           r"output_dir=\S+` continues it from step 2, its newest complete checkpoint$"):
        train(cfg)
    monkeypatch.undo()
    mlflow = client(output_dir)
    (run,) = mlflow.search_runs([mlflow.get_experiment_by_name("toy").experiment_id])
    assert run.info.status == "FAILED"
    assert rundir.step_of(rundir.latest(output_dir / run.info.run_id)) == 2
    train(cfg, resume=run.info.run_id)
    steps = _metric_steps(output_dir, run.info.run_id)
    assert steps and all(set(s) == set(range(6)) for s in steps.values()), steps
    assert mlflow.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_sigkill_at_many_moments_never_leaves_a_checkpoint_ahead_of_the_metrics(run_copy) -> None:
    """One run SIGKILLed three times, each time at a random moment soon after a checkpoint's save began (inside the
    save, its metric write or the steps after it), and resumed after each kill: at every kill the newest complete
    checkpoint's steps all have their metrics stored, and the run ends FINISHED with the metrics of an uninterrupted
    run, every key at the same steps."""
    import random

    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    output_dir, finished_id = run_copy
    args = ["steps=100", "trainer.checkpoint_every=5", f"output_dir={output_dir}"]
    reference = train(compose("toy", args))  # some keys are logged only at some steps (loss/pos/...)
    want = {key: set(s) for key, s in _metric_steps(output_dir, reference).items()}
    run_id = None
    for kill in range(3):
        command = ["--resume", run_id, f"output_dir={output_dir}"] if run_id else ["toy", *args]
        proc = subprocess.Popen([sys.executable, "-m", "rlvrlab.cli.main", "train", *command],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "RLVRLAB_NO_PROGRESS": "1"})
        deadline, known, runs = time.monotonic() + TIMEOUT, None, []
        while True:  # until this process begins a checkpoint after a complete one exists (resume needs one)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            runs = [p.parent for p in output_dir.glob("*/checkpoints") if p.parent.name not in (finished_id, reference)]
            partial = {p.name for p in runs[0].glob("checkpoints/.tmp_step_*")} if runs else set()
            if known is not None and partial - known:
                break
            if runs and rundir.complete(runs[0]):
                known = partial
            time.sleep(0.001)
        time.sleep(random.Random(kill).uniform(0, 0.05))
        proc.kill()
        proc.communicate(timeout=TIMEOUT)
        run_id = runs[0].name
        newest = rundir.step_of(rundir.latest(runs[0]))
        stored = _metric_steps(output_dir, run_id)
        holes = {key: sorted({s for s in steps if s < newest} - set(stored.get(key, ()))) for key, steps in want.items()}
        assert not any(holes.values()), (kill, newest, holes)
    train(compose("toy", args), resume=run_id)
    assert client(output_dir).get_run(run_id).info.status == "FINISHED"
    assert {key: set(s) for key, s in _metric_steps(output_dir, run_id).items()} == want


# --------------------------------------------------------- 8. issue 39: workers, hostile input, silent surprises
def test_sweep_workers_beyond_the_machine_are_refused_before_any_starts(tmp_path: Path) -> None:
    """`--workers` far beyond a grid of one trial more than this machine holds: capped at the trials, still beyond
    the machine, refused in one line that names --oversubscribe, before any worker, study or run folder exists."""
    from rlvrlab.sweep.spawned import machine_limit

    limit = machine_limit()[0]
    grid = ", ".join(f"{0.01 * (i + 1):.2f}" for i in range(limit + 1))
    path = tmp_path / "wide.yaml"
    path.write_text(SWEEP.replace("steps=100000", "steps=4").replace("[0.0, 1.0]", f"[{grid}]"))
    one_line_error(rlvrlab("sweep", str(path), "--workers", str(limit + 5), cwd=tmp_path),
                   f"--workers {limit + 5} (capped at the sweep's {limit + 1} trials): {limit + 1} worker processes",
                   f"give --workers {limit} or fewer, or add --oversubscribe")
    assert [p.name for p in tmp_path.iterdir()] == ["wide.yaml"]


@pytest.mark.slow
def test_sweep_workers_never_outnumber_the_trials_left(tmp_path: Path, monkeypatch) -> None:
    """--workers 2 for a sampler budget of one trial, then for a budget of two with one done: each time one trial is
    left, and it runs in this process (a second worker would have been started for nothing)."""
    import multiprocessing

    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import open_sweep
    from rlvrlab.sweep.workers import run_sweep
    from rlvrlab.tracking import tags as T

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "left.yaml"
    text = SWEEP.replace("steps=100000", "steps=4").replace("sampler: grid", "sampler: random").replace(
        "[0.0, 1.0]", "{low: 0.0, high: 1.0}") + "budget: {trials: 1}\n"
    for budget in (1, 2):
        path.write_text(text.replace("trials: 1", f"trials: {budget}"))
        run_sweep(load_sweep(str(path)), workers=2, oversubscribe=True)
    trials = open_sweep(load_sweep(str(path)), create=False).study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert [t.system_attrs[T.WORKER].split(":")[1] for t in trials] == [str(os.getpid())] * 2
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_a_sweep_stopped_at_each_point_of_its_start_up_is_continued_by_the_same_command(finished, tmp_path: Path,
                                                                                       monkeypatch, capsys) -> None:
    """The same sweep command SIGKILLed six times in a row, each run continuing the start-up the one before stopped
    and stopped itself one point further: after creating the Optuna study, after recording part of the sweep,
    after opening its MLflow study run, after recording that run's id, after enqueueing one grid point, after all
    of them. After each stop `--status` shows the study and writes nothing; the seventh run finishes the start-up
    and runs each grid point once, under one MLflow study run."""
    from rlvrlab.cli.sweep import sweep
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import open_sweep

    (tmp_path / "runs").mkdir()
    shutil.copy(finished[0] / "mlflow.db", tmp_path / "runs" / "mlflow.db")  # a store whose tables exist
    path = tmp_path / "start.yaml"
    path.write_text(SWEEP.replace("steps=100000", "steps=4"))
    monkeypatch.chdir(tmp_path)
    for phase in ["created", "attrs", "study_run", "run_id", "grid", "enqueued"]:
        killed = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "sweep", str(path)], capture_output=True,
                                text=True, timeout=TIMEOUT, env={**os.environ, "RLVRLAB_KILL_IN_START": phase})
        assert killed.returncode == -signal.SIGKILL, (phase, killed.stderr)
        before = {p: p.read_bytes() for p in files_under(tmp_path) if p.is_file()}
        capsys.readouterr()
        sweep(str(path), status=True)
        assert "its start-up stopped before it was done" in capsys.readouterr().out, phase
        assert {p: p.read_bytes() for p in files_under(tmp_path) if p.is_file()} == before, phase  # nothing written

    sweep(str(path))
    trials = open_sweep(load_sweep(str(path)), create=False).study.get_trials()
    assert sorted((t.params["algorithm.tau"], t.state.name) for t in trials) == [(0.0, "COMPLETE"), (1.0, "COMPLETE")]
    mlflow = client(tmp_path / "runs")
    runs = mlflow.search_runs([mlflow.get_experiment_by_name("start").experiment_id])
    roles = sorted((r.data.tags["rlvrlab.role"], r.info.status) for r in runs)
    assert roles == [("seed", "FINISHED")] * 2 + [("study", "FINISHED")] + [("trial", "FINISHED")] * 2



def test_yaml_alias_bombs_and_keys_given_twice_are_one_line(tmp_path: Path) -> None:
    """A "billion laughs" experiment file (nine aliases of nine, nine levels deep) is refused from its structure in
    a moment (it took 37 s and then a MemoryError), so is an alias to the value holding it; a key given twice (YAML
    keeps the last and drops the earlier block without a word) is refused with both lines, in experiment and sweep
    files and in override values."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("defaults: {algorithm: grpo, model: toy, dataset: toy}\nl0: &a [x, x, x, x, x, x, x, x, x]\n"
                    + "".join(f"l{i + 1}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)))
    one_line_error(rlvrlab("config", "show", str(bomb)), "bomb.yaml: its aliases (*name) expand it to 490329072 values")
    bomb.write_text("defaults: {algorithm: grpo, model: toy, dataset: toy}\nsteps: &a [*a]\n")
    one_line_error(rlvrlab("config", "show", str(bomb)), "an alias (*name) refers to the value that holds it")
    twice = tmp_path / "twice.yaml"
    twice.write_text("defaults: {algorithm: grpo, model: toy, dataset: toy}\ntrainer:\n  lr: 0.1\nsteps: 3\n"
                     "trainer:\n  lr: 0.2\n")
    one_line_error(rlvrlab("config", "show", str(twice)), "twice.yaml: key 'trainer' is given twice in one mapping "
                   "(lines 2 and 5)", "remove one or merge them")
    one_line_error(rlvrlab("config", "show", "toy", "rollout.group_size={a: 1, a: 2}"),
                   "key 'a' is given twice in one mapping (line 1)")
    sweep = tmp_path / "twice_sweep.yaml"
    sweep.write_text(SWEEP.replace("steps=100000", "steps=4").replace("space:\n", "space:\n  algorithm.tau: [0.5]\n"))
    one_line_error(rlvrlab("sweep", str(sweep), "--status", cwd=tmp_path), "key 'algorithm.tau' is given twice "
                   "in one mapping (lines 6 and 7)")
    merged = tmp_path / "merged.yaml"  # a merge key's keys given again below it: YAML's way to override, allowed
    merged.write_text("defaults: {algorithm: grpo, model: toy, dataset: toy}\nbase: &base {lr: 0.1, weight_decay: 0.0}"
                      "\ntrainer: {<<: *base, lr: 0.2}\n".replace("base: &base", "x-base: &base"))
    result = rlvrlab("config", "show", str(merged))
    assert "unknown key 'x-base'" in result.stderr  # the merge itself read fine; the extra top key is refused


@pytest.mark.parametrize("text, fragment", [
    ("seeds: 5000000000", "seeds in {} must be a count from 1 to 10000"),
    ("seeds: 100000000000000000000", "seeds in {} must be a count from 1 to 10000"),
    ("seeds: [0, 99999999999999999999]", "a list of at most 10000 distinct seeds from 0 to 4294967295"),
    ("seeds: {initial: 5, max: 100000000000, halfwidth: 0.1}", "seeds.max in {} must be an integer from"),
    ("budget: {timeout: .nan}", "budget.timeout in {} must be a number from 0 to 1e+15"),
    ("sampler_seed: null", "sampler_seed in {} must be an integer from 0 to 1e+15"),
])
def test_sweep_numbers_beyond_their_bounds_are_refused_at_load(tmp_path: Path, text: str, fragment: str) -> None:
    from rlvrlab.errors import ConfigError
    from rlvrlab.sweep.spec import load_sweep

    path = tmp_path / "bounds.yaml"
    path.write_text(SWEEP.replace("steps=100000", "steps=4").replace("seeds: 1", text))
    with pytest.raises(ConfigError) as refused:
        load_sweep(str(path))
    assert fragment.format(path) in str(refused.value)


def test_huge_seeds_and_rates_are_one_line_at_composition(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(SWEEP.replace("steps=100000", "steps=4").replace("seeds: 1", "seeds: 5000000000"))
    one_line_error(rlvrlab("sweep", str(path), "--status", cwd=tmp_path), "seeds in", "from 1 to 10000")
    one_line_error(rlvrlab("config", "show", "toy", "trainer.lr=1e38"), "trainer.lr=1e+38 is out of range",
                   "in (0, 1000]")


# held stores and full disks (issue 39, item 6)
HOLD = ("import sqlite3, sys, time\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('BEGIN EXCLUSIVE')\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n")


@pytest.fixture
def hold():
    """hold(db, seconds): another process holds an exclusive transaction on sqlite file `db` (a writer that keeps
    the store), from the return of the call for `seconds` seconds, or to the end of the test."""
    procs: list[subprocess.Popen] = []

    def start(db: Path, seconds: float) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_held_store_is_waited_for_and_then_named_in_one_line(run_copy, hold, monkeypatch, capfd) -> None:
    """A sqlite store held by another writer when train, sweep or report open it: a short hold (8 s, more than
    sqlite's own 5 s) is waited out and the command runs with nothing on stderr but its progress; a long one ends
    each command in one line naming the held file and what to do, with nothing created (no run, and a study whose
    start-up the same command finishes later)."""
    from rlvrlab.config import compose
    from rlvrlab.errors import StorageError
    from rlvrlab.report.command import ReportRequest, make_report
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.workers import run_sweep
    from rlvrlab.train.loop import train

    output_dir, _ = run_copy
    db = output_dir / "mlflow.db"
    hold(db, 8)
    result = rlvrlab("train", "toy", "steps=2", f"output_dir={output_dir}")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "ERROR" not in result.stderr and "locked" not in result.stderr

    import sqlite3

    def runs() -> int:  # read with sqlite itself: an MLflow store opened in this process would be cached, and
        return sqlite3.connect(db).execute("select count(*) from runs").fetchone()[0]  # not open again

    before = runs()
    holder = hold(db, 600)
    monkeypatch.setenv("RLVRLAB_STORE_WAIT_SECONDS", "0")  # one try: sqlite's own 5 s
    held = f"the MLflow store {db} is locked by another process"
    with pytest.raises(StorageError, match=f"^{held} .*; wait for the process writing it to end, then run the "
                                           "command again$"):
        train(compose("toy", ["steps=2", f"output_dir={output_dir}"]))
    with pytest.raises(StorageError, match=held):
        make_report(ReportRequest(experiment=HOSTILE_EXPERIMENT, output_dir=output_dir, out=output_dir / "report"))
    sweep_file = output_dir / "held.yaml"
    sweep_file.write_text(SWEEP.replace("steps=100000", "steps=4").replace("overrides: [", f"overrides: "
                                                                            f"[output_dir={output_dir}, "))
    with pytest.raises(StorageError, match=held):
        run_sweep(load_sweep(str(sweep_file)))
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ERROR" not in err, err
    holder.kill()
    holder.wait()
    assert not (output_dir / "report").exists()
    assert runs() == before


@pytest.mark.slow
def test_a_store_held_while_a_run_finishes_costs_a_wait_not_a_traceback(run_copy, hold, capfd) -> None:
    """The store held for longer than MLflow's own 20 s wait just as a run ends: its last metrics and its status are
    written once the store is free, and nothing is printed (MLflow logged each failed try at ERROR with two
    tracebacks)."""
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker

    output_dir, _ = run_copy
    tracker = MlflowTracker(f"sqlite:///{output_dir / 'mlflow.db'}", "ends", artifact_root=output_dir / "art")
    tracker.log_metrics(0, {"a": 1.0})
    hold(output_dir / "mlflow.db", 22)
    tracker.finish("FINISHED")
    run = client(output_dir).get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"a": 1.0}
    err = capfd.readouterr().err
    assert "ERROR" not in err and "Traceback" not in err, err



def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # three commands
def test_an_unreachable_tracking_uri_fails_in_seconds_in_one_line(tmp_path: Path) -> None:
    """A tracking.uri nobody answers at: train, sweep and report each say so in one line at once (MLflow's own
    client retried for minutes, silently), before anything is written."""
    uri = f"http://127.0.0.1:{_free_port()}"
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP.replace("steps=100000", "steps=4"))
    for command in (["train", "toy", "steps=2", f"tracking.uri={uri}", f"output_dir={tmp_path / 'runs'}"],
                    ["sweep", str(sweep), f"tracking.uri={uri}", f"output_dir={tmp_path / 'runs'}"],
                    ["report", "--experiment", "toy", "--tracking-uri", uri]):
        one_line_error(rlvrlab(*command, cwd=tmp_path), f"tracking.uri {uri}: no MLflow server answered within 5 s",
                       "Connection refused")
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_a_tracking_server_that_does_not_answer_or_is_not_mlflow_is_one_error() -> None:
    import http.server
    import threading

    from rlvrlab.tracking.store import check_reachable

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(RlvrlabError, match=f"tracking.uri {uri}: no MLflow server answered within 0.2 s"):
            check_reachable(uri, timeout=0.2)

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/mlflow/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(RlvrlabError, match=f"GET {base}/health answered HTTP 404, not an MLflow server's OK"):
            check_reachable(base)
        check_reachable(f"{base}/mlflow/")  # an MLflow server under a path prefix
    finally:
        server.shutdown()
        server.server_close()


def test_a_jsonl_line_beyond_its_bound_is_one_line_before_the_model_is_loaded(tmp_path: Path) -> None:
    """A 2 MiB line in a JSONL dataset: `eval` names it in one line while reading the file, before any model is
    loaded or prompt tokenised (a 50 MB line took an evaluation past 8 GiB)."""
    from rlvrlab.data import MAX_LINE_BYTES

    data = tmp_path / "big.jsonl"
    with data.open("w") as handle:
        handle.write(json.dumps({"problem": "1 + 1?", "answer": "2"}) + "\n")
        handle.write(json.dumps({"problem": "x" * 2 * MAX_LINE_BYTES, "answer": "2"}) + "\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # never read: the dataset fails first
    one_line_error(rlvrlab("eval", "pass-at-k", "--model", str(model), "--dataset", "math500", "--set",
                           f"dataset.path={data}", "--set", "dataset.expected_rows=null", "--out",
                           str(tmp_path / "out"), cwd=tmp_path), f"{data} line 2 is longer than 1 MiB")
    assert not (tmp_path / "out").exists()


def test_eval_refuses_a_prompt_beyond_the_model_context_before_sampling() -> None:
    from rlvrlab.config import compose
    from rlvrlab.data.problems import Problem
    from rlvrlab.eval.pipeline import Dataset, _rendered
    from rlvrlab.policy.tiny import tokenizer_corpus, train_tokenizer

    problems = [Problem(id="short", prompt="1 2 -> 3:", answer="1 2 -> 3"),
                Problem(id="long", prompt="1 2 -> 3: " * 40, answer="1 2 -> 3")]
    tokenizer = train_tokenizer(tokenizer_corpus(problems, lambda problem: ["1+2"]))
    dataset = Dataset(compose("default").dataset, problems, "synthetic")
    with pytest.raises(RlvrlabError, match="problem long's prompt has [0-9]+ tokens, which with 32 new tokens is "
                                           "more than the model's context of 128"):
        _rendered(dataset, tokenizer, 128, 32)
    render = _rendered(dataset, tokenizer, None, 32)  # a model that does not say: nothing to check
    assert render(problems[0]) == tokenizer("1 2 -> 3:").input_ids



def test_an_output_path_too_long_for_the_file_system_is_one_line(tmp_path: Path) -> None:
    from rlvrlab import outputs

    long_name = tmp_path / ("a" * 300) / "runs"
    with pytest.raises(RlvrlabError, match="its folder name a{24}... is 300 bytes long, more than the 255"):
        outputs.check_dir(long_name, "output_dir=...")
    deep = tmp_path / "/".join(["b" * 200] * 20)
    with pytest.raises(RlvrlabError, match="with the 256 bytes of what is written below it that is more than the 4096"):
        outputs.check_dir(deep, "--out ...")
    for_sqlite = tmp_path / "/".join(["c" * 150] * 3)  # fine for the file system, too long for sqlite's store
    one_line_error(rlvrlab("train", "toy", "steps=2", f"output_dir={for_sqlite}"),
                   f"output_dir {for_sqlite}: the MLflow store", "sqlite opens at most 504")
    one_line_error(rlvrlab("train", "toy", "steps=2", f"output_dir={long_name}"), "is 300 bytes long")
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.fixture
def small_disk(tmp_path: Path):
    """mount(megabytes) -> a folder on a tmpfs of that size, to fill (root only; unmounted after the test)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here; test_a_write_that_finds_the_disk_full_leaves_the_file_as_it_was and "
                    "the metric write test cover a full disk by injecting ENOSPC")

    def mount(megabytes: int) -> Path:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); test_a_write_that_finds_the_disk_full_"
                        "leaves_the_file_as_it_was and the metric write test cover a full disk by injecting ENOSPC")
        return folder

    yield mount
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _fill(folder: Path) -> None:
    """Write a file in `folder` until its file system has no space left."""
    with (folder / "filler").open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass


def _empty_files(folder: Path) -> list[Path]:
    """Empty files under `folder`, other than lock files (empty by design when nobody holds them)."""
    return [p for p in folder.rglob("*") if p.is_file() and p.stat().st_size == 0 and not p.name.endswith("lock")]


@pytest.mark.slow
def test_a_full_disk_stops_a_run_in_one_line_and_resume_loses_nothing(finished, small_disk) -> None:
    """Training on a disk that fills up: the run stops in one line naming the full device and the command that
    continues it; no empty file is left; once space is freed, that resume ends FINISHED with every step's metrics
    (the newest complete checkpoint never runs ahead of the stored metrics)."""
    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    disk = small_disk(2)
    shutil.copy(finished[0] / "mlflow.db", disk / "mlflow.db")  # ~0.8 MB: the rest fills within ~30 steps
    result = rlvrlab("train", "toy", "steps=200", "trainer.checkpoint_every=5", f"output_dir={disk}")
    assert result.returncode == 1 and "Traceback" not in result.stderr and "ERROR" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: run ") and "no space left on the device" in line, result.stderr
    run_id = line.split()[2]
    assert f"`rlvrlab train --resume {run_id} output_dir={disk}` continues it from step " in line
    assert not _empty_files(disk), _empty_files(disk)
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # space freed
    train(compose("toy", ["steps=200", "trainer.checkpoint_every=5", f"output_dir={disk}"]), resume=run_id)
    assert client(disk).get_run(run_id).info.status == "FINISHED"
    assert {m.step for m in client(disk).get_metric_history(run_id, "train/reward")} == set(range(200))


@pytest.mark.slow
def test_report_and_eval_on_a_full_disk_fail_in_one_line_and_keep_what_was_there(run_copy, small_disk) -> None:
    """`report --out` and `eval --out` (after all its sampling) on a full disk: one line naming the file that could
    not be written; the files written there before stay as they were, and no empty file is left."""
    output_dir, _ = run_copy
    disk = small_disk(1)
    (disk / "report").mkdir()
    (disk / "report" / "table.md").write_text("an earlier report\n")
    (disk / "eval").mkdir()
    (disk / "eval" / "records.jsonl").write_text('{"an earlier": "evaluation"}\n')
    _fill(disk)
    line = one_line_error(rlvrlab("report", "--experiment", HOSTILE_EXPERIMENT, "--output-dir", str(output_dir),
                                  "--out", str(disk / "report")), "no space left on its device")
    assert str(disk / "report") in line
    assert (disk / "report" / "table.md").read_text() == "an earlier report\n"
    # eval pass-at-k writes its --out files with this function once all is sampled (a toy run has no model to
    # sample from; what is written, not how it was sampled, is under test here)
    from rlvrlab.errors import StorageError
    from rlvrlab.eval.run import write_outputs

    record = {"id": "p0", "n": 2, "c": 1, "answers": [], "reasons": {}, "diversity": None, "no_answer": 2}
    with pytest.raises(StorageError, match=f"cannot write {disk / 'eval' / 'records.jsonl'}: no space left on its "
                                           "device; free space there, then run the command again"):
        write_outputs(disk / "eval", [record] * 1000, [{"text": "x" * 1000}] * 1000, {"datasets": {}}, [1])
    assert (disk / "eval" / "records.jsonl").read_text() == '{"an earlier": "evaluation"}\n'
    assert not _empty_files(disk), _empty_files(disk)


def test_a_write_that_finds_the_disk_full_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """ENOSPC injected halfway through a write (where no tmpfs can be mounted this stands in for the full-disk tests):
    the file keeps its earlier content, no temporary file is left, and the error is one line naming the file."""
    import errno

    from rlvrlab.errors import StorageError
    from rlvrlab.outputs import full_or_held, replacing, write_replacing

    target = tmp_path / "table.md"
    target.write_text("earlier\n")
    with pytest.raises(StorageError, match=f"^cannot write {target}: no space left on its device; free space "
                                           r"there, then run the command again \(files written before are "
                                           r"unchanged\)$"):
        with replacing(target) as tmp, tmp.open("w") as handle:
            handle.write("half of a new table")
            handle.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
    assert target.read_text() == "earlier\n" and sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]
    with pytest.raises(KeyError):  # any other error passes through, the file as it was
        with replacing(target):
            raise KeyError("x")
    assert target.read_text() == "earlier\n" and sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]
    write_replacing(target, "new\n")
    assert target.read_text() == "new\n"
    import sqlite3

    locked = RuntimeError("while logging")
    locked.__cause__ = sqlite3.OperationalError("database is locked")
    assert full_or_held(locked) == "held" and full_or_held(OSError(errno.EDQUOT, "quota")) == "full"
    assert full_or_held(ValueError("no")) is None


@pytest.mark.parametrize("error, fragment", [
    ("OSError(28, 'No space left on device', '/data/x.bin')", "no space left on the device (OSError: [Errno 28] No "
                                                              "space left on device: '/data/x.bin'); free space there"),
    ("sqlite3.OperationalError('database is locked')", "a sqlite database is locked by another process "
                                                       "(OperationalError: database is locked); wait for the process"),
])
def test_a_full_disk_or_held_store_no_command_words_is_still_one_line(error: str, fragment: str) -> None:
    """The command line's last resort: a full disk or a held sqlite file that reaches it unworded (raised where no
    command expected a write to fail) is one line too, saying to run the command again once space is freed or the
    file released; any other error keeps its traceback."""
    code = ("import sqlite3, sys\nimport rlvrlab.cli.main as cli\n"
            f"def app():\n    raise {error}\n"
            "cli.app = app\nsys.argv = ['rlvrlab']\ncli.main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    one_line_error(done, fragment, "then run the command again")
    other = subprocess.run([sys.executable, "-c", code.replace(error, "ValueError('a bug')")], capture_output=True,
                           text=True, timeout=TIMEOUT)
    assert other.returncode == 1 and "Traceback" in other.stderr and "ValueError: a bug" in other.stderr


@pytest.mark.slow
def test_a_sweep_on_a_disk_that_fills_stops_in_one_line_and_the_same_command_finishes_it(finished, small_disk,
                                                                                        tmp_path: Path) -> None:
    """A sweep whose disk fills during a seed run: one line, and the trial is not failed (nothing is wrong with
    it); once space is freed the same command re-runs it and finishes the grid, each point complete once."""
    from optuna.trial import TrialState

    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import open_sweep

    disk = small_disk(2)
    (disk / "runs").mkdir()
    shutil.copy(finished[0] / "mlflow.db", disk / "runs" / "mlflow.db")
    path = tmp_path / "fills.yaml"
    path.write_text(SWEEP.replace("steps=100000", "steps=60"))
    stopped = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "sweep", str(path)], cwd=disk,
                             capture_output=True, text=True, timeout=TIMEOUT)
    line = one_line_error_last(stopped)
    assert "no space left" in line and "again" in line, line
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # space freed
    done = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "sweep", str(path)], cwd=disk,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    here = Path.cwd()
    os.chdir(disk)
    try:
        trials = open_sweep(load_sweep(str(path)), create=False).study.get_trials()
    finally:
        os.chdir(here)
    complete = sorted(t.params["algorithm.tau"] for t in trials if t.state == TrialState.COMPLETE)
    assert complete == [0.0, 1.0] and not [t for t in trials if t.user_attrs.get("rlvrlab.failure") == "run"]


def one_line_error_last(result: subprocess.CompletedProcess) -> str:
    """The error line of a command that printed a progress bar before it: exit 1, no traceback, its last line."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout and "ERROR" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), result.stderr
    return line



def test_environment_values_reach_no_records(tmp_path: Path, monkeypatch) -> None:
    """${oc.env:VAR} would copy the variable (a token) into the MLflow params and config.yaml: refused outside the
    fields that say where things are, whose values are recorded as locations."""
    monkeypatch.setenv("RLVRLAB_TEST_TOKEN", "s3cr3t")
    monkeypatch.setenv("RLVRLAB_TEST_ROOT", str(tmp_path))
    line = one_line_error(rlvrlab("config", "show", "toy", "experiment=${oc.env:RLVRLAB_TEST_TOKEN}"),
                          "experiment=${oc.env:RLVRLAB_TEST_TOKEN}: ${oc.env:...} would copy an environment variable",
                          "only output_dir, dataset.path, model.path may read the environment")
    assert "s3cr3t" not in line
    mine = tmp_path / "mine.yaml"
    mine.write_text("defaults: {algorithm: grpo, model: toy, dataset: toy}\n"
                    "tracking: {uri: 'http://user:${oc.env:RLVRLAB_TEST_TOKEN}@mlflow:5000'}\n")
    one_line_error(rlvrlab("config", "show", str(mine)), "tracking.uri=", "would copy an environment variable")
    shown = rlvrlab("config", "show", "toy", "output_dir=${oc.env:RLVRLAB_TEST_ROOT}/runs")
    assert shown.returncode == 0 and f"output_dir: {tmp_path}/runs\n" in shown.stdout, shown.stderr


def test_an_objective_window_beyond_the_steps_is_refused(tmp_path: Path) -> None:
    """`window: 50` with `steps=20` was labelled "last 50 steps" while it read all 20."""
    from rlvrlab.errors import ConfigError
    from rlvrlab.sweep.spec import load_sweep

    path = tmp_path / "window.yaml"
    path.write_text(SWEEP.replace("steps=100000", "steps=20").replace("window: 4", "window: 50"))
    with pytest.raises(ConfigError, match="objective.window 50 in .* is more than the runs' 20 steps at the point "
                                          "algorithm.tau=0.0; set window to at most 20 or raise steps"):
        load_sweep(str(path))
    assert load_sweep(str(path), ["steps=50"]).objective.window == 50


def test_a_folder_given_as_the_experiment_or_sweep_file_is_called_a_folder(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.yaml").write_text("defaults: {algorithm: grpo, model: toy, dataset: toy}\n")
    one_line_error(rlvrlab("config", "show", "mine/", cwd=tmp_path),
                   "experiment file mine is a folder, not a YAML file; give a .yaml file in it (it holds a.yaml)")
    one_line_error(rlvrlab("train", "mine", cwd=tmp_path), "experiment file mine is a folder")
    one_line_error(rlvrlab("sweep", "./mine", cwd=tmp_path), "sweep file mine is a folder, not a YAML file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_resume_takes_a_run_id_not_a_path_into_another_output_folder(run_copy, tmp_path: Path) -> None:
    """`--resume ../other/<id>` locked (and left a lock file in) a run of another output folder, whose store does
    not record it. A run id is one folder name: refused in one line, nothing touched."""
    output_dir, run_id = run_copy
    other = tmp_path / "other"
    other.mkdir()
    shutil.move(output_dir / run_id, other / run_id)
    here = tmp_path / "here"

    def contents() -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in files_under(tmp_path) if p.is_file()}

    before = contents()
    assert (other / run_id / ".lock").read_text() == ""  # released when the run ended
    one_line_error(rlvrlab("train", "--resume", f"../other/{run_id}", f"output_dir={here}", cwd=tmp_path),
                   f"'../other/{run_id}' is not a run id", "output_dir=")
    assert contents() == before  # no lock taken there, nothing written anywhere


def test_the_tiny_tier_on_a_formatted_task_is_one_line(tmp_path: Path) -> None:
    """The tiny tier warm-starts on the task's bare prompts: a dataset that formats them (arith.yaml uses a chat
    template, a system prompt and few-shot examples) is named in one line with the overrides that fix it, before any
    model is built or run recorded (it crashed with `malformed countdown answer`)."""
    one_line_error(rlvrlab("train", "default", "dataset=arith", f"output_dir={tmp_path / 'runs'}"),
                   "model.tier=tiny", "dataset arith formats them", "dataset.use_chat_template=false")
    assert not (tmp_path / "runs").exists()
    path = tmp_path / "tiny.yaml"
    path.write_text(SWEEP.replace("experiment: toy", "experiment: default").replace(
        "algorithm=ucpo, steps=100000", "algorithm=ucpo, dataset=arith, steps=4"))
    one_line_error(rlvrlab("sweep", str(path), "--status", cwd=tmp_path), "does not compose: model.tier=tiny")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a certificate")
def test_a_tracking_server_behind_a_private_ca_is_looked_at_as_mlflow_would(tmp_path: Path, monkeypatch) -> None:
    """https with a self-signed certificate: refused unless MLflow's own TLS settings say to trust it
    (MLFLOW_TRACKING_SERVER_CERT_PATH, MLFLOW_TRACKING_INSECURE_TLS), as MLflow's client would be."""
    import http.server
    import ssl
    import threading

    from rlvrlab.tracking import store

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem"), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(store, "_reached", set())
    try:
        uri = f"https://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(RlvrlabError, match="no MLflow server answered within 2 s .*CERTIFICATE_VERIFY_FAILED"):
            store.check_reachable(uri, timeout=2)
        monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(tmp_path / "cert.pem"))
        store.check_reachable(uri, timeout=2)
        store._reached.clear()
        monkeypatch.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH")
        monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")
        store.check_reachable(uri, timeout=2)
    finally:
        server.shutdown()
        server.server_close()


def test_an_interrupt_while_the_last_metrics_are_written_loses_none(tmp_path: Path, monkeypatch) -> None:
    """A second Ctrl-C or SIGTERM (KeyboardInterrupt, rlvrlab.procs) that arrives while finish() waits for the
    tracker's writer thread: the waiting goes on until every point is stored, then the run is ended KILLED and the
    interrupt raised. Before, the wait was cut short (an interrupted Thread.join even marks the thread stopped) and
    the daemon writer died with the process: CI lost steps 10-14 of a run stopped at step 15
    (test_a_second_signal_still_ends_the_run_killed_with_its_metrics)."""
    import threading

    from rlvrlab.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "interrupted", artifact_root=tmp_path / "art")
    log_batch = tracker.client.log_batch
    writing = threading.Event()

    def slow(*args, **kwargs):
        writing.set()
        time.sleep(1.0)  # the interrupt below lands inside this wait
        return log_batch(*args, **kwargs)

    monkeypatch.setattr(tracker.client, "log_batch", slow)
    for step in range(5):
        tracker.log_metrics(step, {"a": float(step), "b": 1.0})
    # a real SIGINT: it wakes the main thread out of its wait (Python's default handler raises KeyboardInterrupt)
    timer = threading.Thread(target=lambda: (writing.wait(10), time.sleep(0.2), os.kill(os.getpid(), signal.SIGINT)))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        tracker.finish("KILLED")
    # stored when finish() returns: nothing is left to a writer that the process's exit would kill mid-write
    assert [m.step for m in tracker.client.get_metric_history(tracker.run_id, "a")] == [0, 1, 2, 3, 4]
    timer.join()
    monkeypatch.undo()
    assert tracker.client.get_run(tracker.run_id).info.status == "KILLED"
