"""A seed run as its own job (rlvrlab/sweep/launch.py): `launcher: process` trains each seed run as a child
`rlvrlab train` (torchrun with nproc ranks), nested under its trial in MLflow; failures fail the trial and the worker
goes on; a stop reaches the children; --gpus-per-run places workers on disjoint CUDA_VISIBLE_DEVICES.
Run: .venv/bin/pytest -q tests/sweep/test_launch.py"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from rlvrlab.errors import ConfigError
from rlvrlab.sweep.launch import failure_reason, train_command
from rlvrlab.sweep.spec import load_sweep
from rlvrlab.sweep.study import open_sweep
from rlvrlab.sweep.trials import work
from rlvrlab.tracking import tags as T

RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))

GRID = """\
experiment: toy
overrides: [algorithm=ucpo, steps=12, trainer.checkpoint_every=0]
sampler: grid
seeds: 2
space:
  algorithm.tau: [0.0, 1.0]
objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 4}
"""


def _file(folder: Path, text: str, name: str = "grid.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _runs(folder: Path, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id], max_results=10_000) if found else []


def _role(runs: list, role: str) -> list:
    return [r for r in runs if r.data.tags.get(T.ROLE) == role]


# ------------------------------------------------------------------------------------------------ validation
BAD = [
    ("launcher: subprocess\n", [], {}, "unknown launcher 'subprocess'"),
    ("launcher: {type: inprocess, nproc: 2}\n", [], {}, "needs launcher process or slurm"),
    ("launcher: {type: process, nproc: 2}\n", [], {}, "add trainer.engine=deepspeed"),
    ("launcher: {type: process, nprocs: 2}\n", [], {}, "unknown launcher key 'nprocs'"),
    ("launcher: process\npruner: {type: median}\n", [], {}, "pruner median in"),
    ("launcher: slurm\nslurm: {nodes: 2}\n", [], {}, "a sweep worker job runs on one node"),
    ("launcher: slurm\nslurm: {partion: gpu}\n", [], {}, "unknown slurm key 'partion'"),
    ("launcher: slurm\nslurm: {time: 0}\n", [], {}, "slurm.time in"),
    ("launcher: slurm\nslurm: {cluster: pbs}\n", [], {}, "unknown slurm.cluster 'pbs'"),
    ("", [], {"launcher": "slurm", "slurm": ["partition"]}, "--slurm partition: give KEY=VALUE"),
    ("", [], {"gpus_per_run": 2}, "--gpus-per-run 2 in"),
    ("", ["trainer.engine=deepspeed"], {"launcher": "process", "gpus_per_run": 2, "nproc": 4}, "differ"),
]


@pytest.mark.parametrize(("extra", "overrides", "options", "message"), BAD)
def test_bad_launcher_settings_are_one_line_errors(here: Path, extra: str, overrides: list[str], options: dict,
                                                   message: str) -> None:
    path = _file(here, GRID + extra)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as error:
        load_sweep(str(path), overrides, **options)
    assert "\n" not in str(error.value)


def test_launcher_settings_from_the_file_and_the_command_line(here: Path) -> None:
    path = _file(here, GRID + "launcher: {type: process, nproc: 2}\nslurm: {partition: gpu, time: 30}\n")
    spec = load_sweep(str(path), ["trainer.engine=deepspeed"])
    assert (spec.launcher.type, spec.launcher.nproc, spec.launcher.slurm.partition) == ("process", 2, "gpu")
    over = load_sweep(str(path), ["trainer.engine=deepspeed"], launcher="slurm",
                      slurm=["time=240", "account=lab", "gpus_per_node=4"])
    assert over.launcher.type == "slurm" and over.launcher.nproc == 2
    assert (over.launcher.slurm.time, over.launcher.slurm.account, over.launcher.slurm.gpus_per_node) == \
        (240, "lab", 4)
    placed = load_sweep(str(_file(here, GRID, "g2.yaml")), ["trainer.engine=deepspeed"], launcher="process",
                        gpus_per_run=2)
    assert placed.launcher.nproc == 2  # one rank per GPU of the run


def test_the_launcher_is_not_part_of_the_study(here: Path) -> None:
    """The same study continues under another launcher: how runs are started does not change what they train."""
    inproc = load_sweep(str(_file(here, GRID)))
    process = load_sweep(str(_file(here, GRID)), launcher="process")
    assert inproc.fingerprint() == process.fingerprint()


def test_the_child_command_is_rlvrlab_train_with_the_trial_tags(here: Path) -> None:
    spec = load_sweep(str(_file(here, GRID)), launcher="process")
    command = train_command(spec, spec.overrides_for({"algorithm.tau": 0.5}, 1), {T.PARENT: "abc"})
    assert command[:5] == [sys.executable, "-m", "rlvrlab.cli.main", "train", "toy"]
    assert "algorithm.tau=0.5" in command and "seed=1" in command and f"--tag={T.PARENT}=abc" in command
    two = load_sweep(str(_file(here, GRID)), ["trainer.engine=deepspeed"], launcher="process", nproc=2)
    command = train_command(two, two.overrides_for({}, 0), {})
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def test_failure_reasons_name_the_childs_error_or_how_it_ended() -> None:
    lines = ["noise", "error: step 3: the loss is nan; run x is marked FAILED"]
    assert failure_reason(1, lines).endswith("(exit code 1): step 3: the loss is nan; run x is marked FAILED")
    assert "killed by signal SIGKILL" in failure_reason(-9, [])
    assert "killed by SIGTERM" in failure_reason(-15, ["last words"]) and "last words" in failure_reason(-15, ["x",
                                                                                                           "last words"])


# ------------------------------------------------------------------------------------------------ process runs
@pytest.mark.slow
def test_process_seed_runs_give_the_same_study_as_inprocess(here: Path) -> None:
    """Every trial's value, every seed's objective, and the study -> trial -> seed tree in MLflow are the same
    whether the seed runs train inside the worker or as child `rlvrlab train` processes."""
    from optuna.trial import TrialState

    values = {}
    for launcher in ("inprocess", "process"):
        spec = load_sweep(str(_file(here, GRID)), [f"output_dir={launcher}"], launcher=launcher)
        outcomes = work(open_sweep(spec))
        assert sorted(o.state for o in outcomes) == ["COMPLETE", "COMPLETE"]
        trials = open_sweep(spec).study.get_trials(states=(TrialState.COMPLETE,))
        values[launcher] = {t.params["algorithm.tau"]: (t.value, t.user_attrs[T.VALUES]) for t in trials}
        runs = _runs(here / launcher, "grid")
        trial_runs = {r.info.run_id: r for r in _role(runs, "trial")}
        seeds = _role(runs, "seed")
        assert len(trial_runs) == 2 and len(seeds) == 4 and {r.info.status for r in seeds} == {"FINISHED"}
        for run in seeds:  # the child nests under its trial with the trial's tags
            parent = trial_runs[run.data.tags[T.PARENT]]
            assert run.data.tags[T.TRIAL] == parent.data.tags[T.TRIAL]
            assert run.data.tags[T.STUDY] == "grid" and run.data.tags["config_hash"] == parent.data.tags["config_hash"]
            assert T.OBJECTIVE in run.data.tags
    assert values["process"] == values["inprocess"]


@pytest.mark.slow
def test_a_failing_child_fails_its_trial_with_the_reason_and_the_worker_goes_on(here: Path) -> None:
    """A non-finite update in the child (`rlvrlab train` exits 1 with its error line) fails the seed and the
    trial with that reason; a child killed by a signal does too; the other trial completes."""
    from optuna.trial import TrialState

    text = GRID.replace("seeds: 2", "seeds: 1").replace("  algorithm.tau: [0.0, 1.0]\n",
                                                         "  trainer.weight_decay: [0.0, 1.0e+300]\n")
    spec = load_sweep(str(_file(here, text)), ["output_dir=runs"], launcher="process")
    outcomes = work(open_sweep(spec))
    assert sorted(o.state for o in outcomes) == ["COMPLETE", "FAIL"]
    bad = next(t for t in open_sweep(spec).study.get_trials() if t.state == TrialState.FAIL)
    assert bad.params["trainer.weight_decay"] == 1e300 and bad.user_attrs[T.FAILURE] == "run"
    assert "(exit code 1)" in bad.user_attrs[T.FAIL_REASON]
    assert "weight norm after the update is nan" in bad.user_attrs[T.FAIL_REASON]
    assert Counter(r.info.status for r in _role(_runs(here / "runs", "grid"), "seed")) == {"FINISHED": 1,
                                                                                            "FAILED": 1}

    killed = load_sweep(str(_file(here, GRID.replace("seeds: 2", "seeds: 1"), "killed.yaml")),
                        ["output_dir=killed"], launcher="process")
    os.environ["RLVRLAB_KILL_AFTER_STEP"] = "3"  # the children SIGKILL themselves after step 3
    try:
        outcomes = work(open_sweep(killed))
    finally:
        del os.environ["RLVRLAB_KILL_AFTER_STEP"]
    assert [o.state for o in outcomes] == ["FAIL", "FAIL"]  # the worker went on to the second trial
    assert all("killed by signal SIGKILL" in o.reason for o in outcomes)
    # a child that could not close its own run: the worker ends it FAILED, with the reason
    killed_seeds = _role(_runs(here / "killed", "killed"), "seed")
    assert {r.info.status for r in killed_seeds} == {"FAILED"}
    assert all("killed by signal SIGKILL" in r.data.tags[T.FAIL_REASON] for r in killed_seeds)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _command_line(pid: int) -> list[str]:
    """A process's arguments; [] once it has exited (a descendant seen earlier may be a short-lived one, such as the
    `git` a new run's provenance starts)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace").split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_sweep_leaves_no_child_run_behind(here: Path, sig: int) -> None:
    """SIGTERM (or SIGKILL) to `rlvrlab sweep --workers 2 --launcher process` alone, while both workers' children
    train: every worker and every `rlvrlab train` child is gone afterwards, and no seed run stays RUNNING."""
    from optuna.trial import TrialState

    path = _file(here, GRID.replace("steps=12", "steps=400").replace("seeds: 2", "seeds: 1"))
    proc = subprocess.Popen([RLVRLAB, "sweep", str(path), "--workers", "2", "--launcher", "process"], cwd=here,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline, seen = time.monotonic() + 300, set()
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.3)
        seen |= _descendants(proc.pid)
        if not (here / "runs" / "optuna.journal").exists():  # the study (and the MLflow store) are made first
            continue
        running = open_sweep(load_sweep(str(path)), create=False).study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING,))
        if len(running) < 2:
            continue
        training = [r for r in _role(_runs(here / "runs", "grid"), "seed") if r.info.status == "RUNNING"]
        if len(training) == 2:
            break
    seen |= _descendants(proc.pid)
    trainers = [pid for pid in seen if "train" in _command_line(pid)]
    assert len(trainers) >= 2, "no `rlvrlab train` child found"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=240)
    end = time.monotonic() + 90
    while any(_alive(pid) for pid in seen) and time.monotonic() < end:
        time.sleep(0.3)
    assert not [pid for pid in seen if _alive(pid)], "a worker or child outlived the sweep"
    seeds = _role(_runs(here / "runs", "grid"), "seed")
    assert "RUNNING" not in {r.info.status for r in seeds} and "KILLED" in {r.info.status for r in seeds}
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith("error: sweep stopped by SIGTERM before the study was done")


# ------------------------------------------------------------------------------------------------ GPU placement
@pytest.mark.slow
def test_workers_get_disjoint_devices_from_an_explicit_list(here: Path) -> None:
    """On CPU, the device list is given as CUDA_VISIBLE_DEVICES: with --workers 2 --gpus-per-run 1 each worker
    (and the seed runs it starts) sees one device of its own, and a placement that does not fit is one line."""
    path = _file(here, GRID.replace("seeds: 2", "seeds: 1").replace("[0.0, 1.0]", "[0.0, 0.5, 1.0, 0.25]"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "3,5"}
    done = subprocess.run([RLVRLAB, "sweep", str(path), "--workers", "2", "--gpus-per-run", "1", "--launcher",
                           "process"], cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = open_sweep(load_sweep(str(path)), create=False).study.get_trials()
    by_worker = defaultdict(set)
    for t in trials:
        by_worker[t.system_attrs[T.WORKER].split(":")[1]].add(t.user_attrs[T.DEVICES])
    assert all(len(devices) == 1 for devices in by_worker.values()), by_worker
    assert set().union(*by_worker.values()) <= {"3", "5"} and len(trials) == 4
    if len(by_worker) == 2:  # both workers claimed trials (timing-dependent): they saw different devices
        assert set().union(*by_worker.values()) == {"3", "5"}

    # --oversubscribe: 3 workers are more than a 2-core machine holds, and the placement is what is checked here
    refused = subprocess.run([RLVRLAB, "sweep", str(path), "--workers", "3", "--gpus-per-run", "1", "--launcher",
                              "process", "--oversubscribe"], cwd=here, env={**env, "COLUMNS": "40"}, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers 3 x --gpus-per-run 1 needs 3 GPUs, but this machine shows 2 (3,5)" in \
        lines[0], refused.stderr
