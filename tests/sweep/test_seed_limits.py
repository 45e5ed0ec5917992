"""A seed's limits, logs and process tree (rlvrlab/sweep/limits.py, seedlog.py, supervisor.py, launch.py):
`seed_timeout:` / `--seed-timeout` and `first_metric_within:` stop a seed's whole process group (SIGTERM, then
SIGKILL after `stop_grace:`) and fail it with the reason; every seed's stdout and stderr stream to a capped file
under `<output_dir>/sweep-logs/` attached to its run; nothing a command starts outlives its sweep, even a SIGKILLed
one; a seed rlvrlab stopped ends KILLED and a timed-out one FAILED, whatever its script set; a non-finite objective
fails its seed. The commands are small shell and `python -c` scripts.
Run: .venv/bin/pytest -q tests/sweep/test_seed_limits.py"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from rlvrlab.errors import ConfigError
from rlvrlab.sweep import seedlog
from rlvrlab.sweep.launch import run_process
from rlvrlab.sweep.limits import Limits
from rlvrlab.sweep.seedlog import CappedLog
from rlvrlab.sweep.spec import load_sweep
from rlvrlab.sweep.workers import run_sweep
from rlvrlab.tracking import tags as T

RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))
PY = shlex.quote(sys.executable)


def _file(folder: Path, command: str, extra: dict | None = None, values: list | None = None,
          name: str = "lim.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({"name": "lim", "command": command, "seeds": 1, "space": {"x": values or ["a"]},
                                    "objective": {"metric": "score"}, **(extra or {})}))
    return path


def _runs(folder: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    found = client.get_experiment_by_name("lim")
    return client.search_runs([found.experiment_id], max_results=1000) if found else []


def _seed_runs(folder: Path) -> list:
    return [r for r in _runs(folder) if r.data.tags.get(T.ROLE) == "seed"]


def _with_marker(marker: str) -> list[int]:
    """Live processes with `marker` among their arguments (scanning /proc as tests/sweep/test_launch.py does)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in args and state != "Z":
            found.append(int(cmdline.parent.name))
    return found


def _wait_for(check, seconds: float, what: str) -> None:
    """A bound against hangs, not a speed claim."""
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, what
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------ settings
BAD = [
    ({"seed_timeout": -5}, "seed_timeout in .* must be a number of seconds > 0"),
    ({"seed_timeout": "an hour"}, "seed_timeout in .* must be a number of seconds > 0 .*got 'an hour'"),
    ({"seed_timeout": 0}, "seed_timeout in .* must be a number of seconds > 0"),
    ({"seed_timeout": float("inf")}, "seed_timeout in .* must be a number of seconds"),
    ({"seed_timeout": True}, "seed_timeout in .* must be a number of seconds"),
    ({"first_metric_within": -1}, "first_metric_within in .* must be a number of seconds > 0"),
    ({"stop_grace": -1}, "stop_grace in .* must be a number of seconds >= 0"),
    ({"stop_grace": 3600}, "stop_grace in .* must be a number of seconds from 0 to 600"),
    ({"seed_timeot": 5}, "unknown sweep key 'seed_timeot'"),
]


@pytest.mark.parametrize(("extra", "message"), BAD)
def test_bad_limits_are_one_line_errors(here: Path, extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        load_sweep(str(_file(here, "t {x} {seed}", extra)))
    assert "\n" not in str(error.value)


def test_limits_need_a_process_launcher_and_are_not_part_of_the_study(here: Path) -> None:
    toy = {"experiment": "toy", "overrides": ["steps=3", "algorithm=ucpo"], "space": {"algorithm.tau": [0.0]},
           "objective": {"metric": "policy/toy_correct_uniformity"}, "seeds": 1}
    path = here / "toy.yaml"
    path.write_text(yaml.safe_dump({**toy, "seed_timeout": 60}))
    with pytest.raises(ConfigError, match="seed_timeout in .* needs a launcher that runs each seed as a process"):
        load_sweep(str(path))
    spec = load_sweep(str(path), launcher="process")
    assert spec.launcher.limits == Limits(seed_timeout=60.0)
    path.write_text(yaml.safe_dump(toy))
    assert load_sweep(str(path), launcher="process").fingerprint() == spec.fingerprint()  # how, not what
    over = load_sweep(str(_file(here, "t {x} {seed}", {"seed_timeout": 60, "stop_grace": 2,
                                                         "first_metric_within": 30})), seed_timeout="90")
    assert over.launcher.limits == Limits(seed_timeout=90.0, first_metric_within=30.0, stop_grace=2.0)
    with pytest.raises(ConfigError, match=r"^--seed-timeout must be a number of seconds > 0"):
        load_sweep(str(_file(here, "t {x} {seed}")), seed_timeout="-5")


@pytest.mark.slow
def test_a_bad_seed_timeout_on_the_command_line_is_one_line(here: Path) -> None:
    path = _file(here, "t {x} {seed}")
    done = subprocess.run([RLVRLAB, "sweep", str(path), "--seed-timeout", "soon"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["error: --seed-timeout must be a number of seconds > 0 (at most 1e+09), "
                                                "e.g. seed_timeout: 3600; got 'soon'"]


# ------------------------------------------------------------------------------------------------ the log file
def test_the_log_keeps_its_head_and_tail_with_a_marker() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = CappedLog(Path(tmp) / "x.log", head=10, tail=20)
        data = bytes(range(256)) * 40  # 10240 bytes, written in odd-sized pieces
        for start in range(0, len(data), 37):
            log.write(data[start:start + 37])
        log.close()
        text = (Path(tmp) / "x.log").read_bytes()
    marker = (b"\n[rlvrlab: 10210 bytes of output dropped here; the log keeps the first 10 and the last 20 "
              b"bytes]\n")
    assert text == data[:10] + marker + data[-20:]


def test_a_huge_line_without_a_newline_is_read_in_chunks_and_capped(here: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """8 MiB on stdout without one newline, then a line on stderr: the file keeps the head and the tail only."""
    monkeypatch.setattr(seedlog, "HEAD_BYTES", 64 << 10)
    monkeypatch.setattr(seedlog, "TAIL_BYTES", 256 << 10)
    script = ("import sys; [sys.stdout.write('a' * (1 << 20)) for _ in range(8)]; sys.stdout.write('END'); "
              "sys.stdout.flush(); print('last words', file=sys.stderr)")
    log = here / "big.log"
    ended = run_process([sys.executable, "-c", script], dict(os.environ), log=log)
    assert ended.returncode == 0 and ended.tail == ["last words"]
    text = log.read_bytes()
    assert len(text) < (64 << 10) + (256 << 10) + 200
    assert text.startswith(b"a" * (64 << 10)) and b"bytes of output dropped here" in text
    assert b"END" in text[-(256 << 10):] and b"last words" in text[-(256 << 10):]


# ------------------------------------------------------------------------------------------------ limits
TIMING_OUT = (  # ends its own run FINISHED and exits 0 on SIGTERM, as a trainer that saves and leaves would
    "import signal, sys, time, mlflow\n"
    "with mlflow.start_run():\n"
    "    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "    mlflow.log_metric('score', 1.0, step=0)\n"
    "    print('ready', flush=True); print('a warning', file=sys.stderr, flush=True)\n"
    "    time.sleep(300)\n")


@pytest.mark.slow
def test_a_timed_out_command_fails_with_the_reason_and_its_log(here: Path) -> None:
    """seed_timeout: the command's group is stopped, its run ends FAILED (not the FINISHED its script set on the way
    out) with "timed out after N s" and the log's path; the log is kept and attached to the run."""
    command = f"{PY} -c {shlex.quote(TIMING_OUT)} {{x}} {{seed}}"
    path = _file(here, command, {"seed_timeout": 8, "stop_grace": 5})
    sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    (trial,) = sweep.study.get_trials()
    log = here / "sweep-logs" / "lim" / "trial-0-seed-0.log"
    reason = trial.user_attrs[T.FAIL_REASON]
    assert trial.state.name == "FAIL" and "the command timed out after 8 s (seed_timeout) and was stopped" in reason
    assert reason.endswith(f"; log: {log}"), reason
    (run,) = _seed_runs(here)
    assert run.info.status == "FAILED" and "timed out after 8 s" in run.data.tags[T.FAIL_REASON]
    assert log.is_file()
    if "ready" in log.read_text():  # the script got as far as its handler (not a speed claim: it usually does)
        assert "a warning" in log.read_text()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{here / 'mlflow.db'}")
    assert [a.path for a in client.list_artifacts(run.info.run_id, "logs")] == ["logs/trial-0-seed-0.log"]


@pytest.mark.slow
def test_a_command_that_logs_no_metric_is_stopped_with_the_usual_causes(here: Path) -> None:
    """first_metric_within: a command whose run has no metric by then (here: it never attaches) is stopped."""
    path = _file(here, "echo training {x} {seed}; sleep 300", {"first_metric_within": 2, "stop_grace": 1})
    sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    (trial,) = sweep.study.get_trials()
    reason = trial.user_attrs[T.FAIL_REASON]
    assert trial.state.name == "FAIL" and "the command logged no metric within 2 s (first_metric_within)" in reason
    assert "opened its own MLflow run instead of attaching to MLFLOW_RUN_ID" in reason
    assert "cannot reach MLflow at sqlite:///" in reason and reason.endswith("trial-0-seed-0.log")
    assert (here / "sweep-logs" / "lim" / "trial-0-seed-0.log").read_text() == "training a 0\n"


@pytest.mark.slow
def test_a_timed_out_child_rlvrlab_train_fails_with_the_reason(here: Path) -> None:
    """launcher process: the limit stops a child `rlvrlab train` the same way."""
    path = here / "toy.yaml"
    path.write_text(yaml.safe_dump({
        "experiment": "toy", "overrides": ["algorithm=ucpo", "steps=100000", "trainer.checkpoint_every=0"], "seeds": 1,
        "space": {"algorithm.tau": [0.0]}, "objective": {"metric": "policy/toy_correct_uniformity"},
        "launcher": "process", "seed_timeout": 3, "stop_grace": 5}))
    sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    (trial,) = sweep.study.get_trials()
    reason = trial.user_attrs[T.FAIL_REASON]
    assert trial.state.name == "FAIL" and "the seed run's process timed out after 3 s (seed_timeout)" in reason
    assert "; log: " in reason and (here / "sweep-logs" / "toy" / "trial-0-seed-0.log").is_file()
    from mlflow.tracking import MlflowClient

    found = MlflowClient(f"sqlite:///{here / 'mlflow.db'}").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{here / 'mlflow.db'}").search_experiments()],
        filter_string="tags.`rlvrlab.role` = 'seed'")
    assert {r.info.status for r in found} <= {"FAILED"}  # the child's own KILLED is overruled


# ------------------------------------------------------------------------------------------------ process trees
def _tree_command(marker: str, ignore_term: bool) -> str:
    """A shell that starts a grandchild through a subshell (double fork) and a child, both carrying `marker`."""
    sleeper = f"{PY} -c 'import time; time.sleep(600)' {marker}"
    return (("trap '' TERM; " if ignore_term else "") + f"( {sleeper} & ) ; echo started {{x}} {{seed}} > started; "
            f"{sleeper}")


@pytest.mark.slow
@pytest.mark.parametrize("ignore_term", [False, True], ids=["plain", "ignores-SIGTERM"])
def test_nothing_a_command_starts_outlives_a_sigkilled_sweep(here: Path, ignore_term: bool) -> None:
    """kill -9 of `rlvrlab sweep` while its command's child and grandchild sleep: the supervisor stops them all (a
    command that ignores SIGTERM within stop_grace, by SIGKILL)."""
    marker = f"rlvrlab-test-{uuid.uuid4().hex}"
    path = _file(here, _tree_command(marker, ignore_term), {"stop_grace": 2})
    proc = subprocess.Popen([RLVRLAB, "sweep", str(path), f"output_dir={here}"], cwd=here,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: (here / "started").exists() and len(_with_marker(marker)) >= 2, 300,
                  "the command never started its processes")
        proc.kill()
        proc.wait(timeout=60)
        _wait_for(lambda: not _with_marker(marker), 60, "a process of the command outlived the SIGKILLed sweep")
    finally:
        proc.kill()
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_timeout_kills_a_command_that_ignores_sigterm_and_its_grandchildren(here: Path) -> None:
    marker = f"rlvrlab-test-{uuid.uuid4().hex}"
    path = _file(here, _tree_command(marker, ignore_term=True), {"seed_timeout": 3, "stop_grace": 1})
    try:
        sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
        (trial,) = sweep.study.get_trials()
        assert "the command timed out after 3 s (seed_timeout) and was stopped (killed by signal SIGKILL)" in \
            trial.user_attrs[T.FAIL_REASON]
        assert not _with_marker(marker)  # gone when the seed ended
        assert "still running 1 s after SIGTERM (stop_grace); SIGKILL" in \
            (here / "sweep-logs" / "lim" / "trial-0-seed-0.log").read_text()
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------------ how stops end
STOPPED_IN_A_RUN = (  # SIGTERM to `rlvrlab sweep` above it, from inside `with mlflow.start_run()`, whose exit on
    # the KeyboardInterrupt that its handler raises ends the run FAILED
    "import os, signal, time, mlflow\n"
    "def stop(*a): raise KeyboardInterrupt\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "pid = os.getppid()\n"
    "while b'\\0sweep\\0' not in open(f'/proc/{{pid}}/cmdline', 'rb').read():\n"
    "    pid = int(open(f'/proc/{{pid}}/stat').read().rsplit(')', 1)[1].split()[1])\n"
    "with mlflow.start_run():\n"
    "    mlflow.log_metric('score', 1.0, step=0)\n"
    "    os.kill(pid, signal.SIGTERM)\n"
    "    time.sleep(300)\n")


@pytest.mark.slow
def test_a_seed_stopped_with_the_sweep_ends_killed_whatever_its_script_set(here: Path) -> None:
    command = f"{PY} -c {shlex.quote(STOPPED_IN_A_RUN)} {{x}} {{seed}}"
    path = _file(here, command)
    done = subprocess.run([RLVRLAB, "sweep", str(path), f"output_dir={here}"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode != 0 and "sweep stopped by SIGTERM" in done.stderr, done.stderr  # code: sweep/exits.py
    (run,) = _seed_runs(here)
    assert run.info.status == "KILLED"  # the script's own end was FAILED
    assert "KeyboardInterrupt" in (here / "sweep-logs" / "lim" / "trial-0-seed-0.log").read_text()


# ------------------------------------------------------------------------------------------------ the objective
LOGS = ("import sys, mlflow; x = sys.argv[1]; sys.stdout.write(f'out {{x}}\\n'); sys.stdout.flush(); "  # one write
        "sys.stderr.write(f'err {{x}}\\n'); "  # each: the two pipes interleave by writes, not by lines
        "mlflow.start_run(); mlflow.log_metric('score', float(x), step=0)")


@pytest.mark.slow
def test_a_non_finite_objective_fails_its_seed_and_every_seed_has_its_log(here: Path) -> None:
    command = f"{PY} -c {shlex.quote(LOGS)} {{x}} {{seed}}"
    path = _file(here, command, values=["1.5", "inf", "-inf", "nan"])
    sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    trials = {t.params["x"]: t for t in sweep.study.get_trials()}
    assert trials["1.5"].state.name == "COMPLETE" and trials["1.5"].value == 1.5
    assert sweep.study.best_trial.number == trials["1.5"].number
    for bad in ("inf", "-inf", "nan"):
        reason = trials[bad].user_attrs[T.FAIL_REASON]
        assert trials[bad].state.name == "FAIL" and f"objective 'score' is {bad}" in reason, reason
        assert "a non-finite objective ranks no trial" in reason
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{here / 'mlflow.db'}")
    for run in _seed_runs(here):
        number = run.data.tags[T.TRIAL]
        log = here / "sweep-logs" / "lim" / f"trial-{number}-seed-0.log"
        x = trials_by_number(trials)[int(number)]
        assert sorted(log.read_text().splitlines()) == [f"err {x}", f"out {x}"]
        assert [a.path for a in client.list_artifacts(run.info.run_id, "logs")] == [f"logs/{log.name}"]
        assert run.info.status == ("FINISHED" if x == "1.5" else "FAILED")


def trials_by_number(trials: dict) -> dict[int, str]:
    return {t.number: x for x, t in trials.items()}


def test_the_worked_example_of_the_docs_validates() -> None:
    """docs/sweeps.md's limits example is a valid command sweep with those limits."""
    import re
    import tempfile

    docs = (Path(__file__).resolve().parents[2] / "docs" / "sweeps.md").read_text()
    (text,) = re.findall(r"```yaml\n(name: trl_lr\n.*?)```", docs, re.S)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trl_lr.yaml"
        path.write_text(text)
        spec = load_sweep(str(path))
    assert spec.launcher.limits == Limits(seed_timeout=3600.0, first_metric_within=300.0, stop_grace=60.0)
