"""`rlvrlab sweep`: sweep-file validation, grid studies (each point exactly once), the MLflow hierarchy
study -> trial -> seed runs, objectives read back from MLflow, resume after a killed worker, failed and pruned
trials, parallel workers, and the shipped sweep files."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.sweep.objective import AGGREGATES, seed_summary, window_mean
from rlvrlab.sweep.spec import load_sweep, sweeps_dir
from rlvrlab.sweep.study import open_sweep
from rlvrlab.sweep.summary import summarize
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
  trainer.staleness: [0, 1]
objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 4}
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _sweep_file(folder: Path, text: str = GRID, name: str = "grid.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _client(folder: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{folder.resolve() / 'runs' / 'mlflow.db'}")


def _runs(folder: Path, experiment: str) -> list:
    client = _client(folder)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id], max_results=10_000) if found else []


def _role(runs: list, role: str) -> list:
    return [r for r in runs if r.data.tags.get(T.ROLE) == role]


def _cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([RLVRLAB, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# ------------------------------------------------------------------------------------------------ validation
BAD_SWEEPS = [
    ("smapler: grid\n", "unknown sweep key 'smapler'"),
    ("experiment: toy\nsampler: gird\nspace: {algorithm.tau: [0.1]}\nobjective: {metric: train/reward}\n",
     "unknown sampler 'gird'"),
    ("experiment: toy\nspace: {algorithm.tau: {low: 0.0, high: 1.0}}\nobjective: {metric: train/reward}\n",
     "the grid sampler needs a list of values"),
    ("experiment: toy\nspace: {algorithm.tau: [0.1]}\nobjective: {metric: train/rewrd}\n",
     "unknown objective.metric 'train/rewrd'"),
    ("experiment: toy\nspace: {algorithm.tau: [0.1]}\n"
     "objective: {metric: train/reward, direction: minimize, aggregate: lcb95}\n", "use ucb95"),
    ("experiment: toy\noverrides: [seed=3]\nspace: {algorithm.tau: [0.1]}\nobjective: {metric: train/reward}\n",
     "seed is set by the sweep"),
    ("experiment: toy\nspace: {algorithm.tua: [0.1]}\nobjective: {metric: train/reward}\n", "algorithm.tua"),
    ("experiment: toy\noverrides: [algorithm=ucpo]\nspace: {algorithm.tau: [0.1, 7.0]}\n"
     "objective: {metric: train/reward}\n", "the point algorithm.tau=7.0 does not compose"),
    ("experiment: toy\nspace: {algorithm.tau: [0.1]}\nobjective: {metric: train/reward}\n",
     "has no effect with algorithm.estimator 'grpo'"),
    ("experiment: toy\nsampler: tpe\nspace: {algorithm.tau: {low: 0.0, high: 1.0}}\n"
     "objective: {metric: train/reward}\n", "needs budget.trials or budget.timeout"),
    ("experiment: toy\nseeds: [1, 1]\nspace: {algorithm.tau: [0.1]}\nobjective: {metric: train/reward}\n",
     "seeds in"),
    ("experiment: toy\nseeds: 1\nspace: {algorithm.tau: [0.1]}\n"
     "objective: {metric: train/reward, aggregate: lcb95}\n", "needs at least 2 seeds"),
    ("experiment: toy\nspace: {seed: [1, 2]}\nobjective: {metric: train/reward}\n", "cannot be searched"),
    ("experiment: nope\nspace: {algorithm.tau: [0.1]}\nobjective: {metric: train/reward}\n",
     "unknown experiment 'nope'"),
    ("experiment: toy\nspace: {algorithm.tau: [0.1]}\nobjective: {metric: train/reward}\npruner: {type: mediam}\n",
     "unknown pruner.type 'mediam'"),
    ("experiment: toy\nvariants: {a: algorithm=grpo}\nobjective: {metric: train/reward}\n",
     "variants.a in"),
    ("experiment: toy\nvariants: {a: [seed=2]}\nobjective: {metric: train/reward}\n", "seed cannot be set per variant"),
    ("experiment: toy\nvariants: {a: [algorithm=ucpo, algorithm.tau=9.0]}\nobjective: {metric: train/reward}\n",
     "the point variant=a does not compose"),
    ("experiment: toy\nvariants: {a: [algorithm=grpo]}\nspace: {variant: [1]}\nobjective: {metric: train/reward}\n",
     "is the name of `variants:`"),
    ("experiment: toy\nseeds: {initial: 1, max: 5, halfwidth: 0.1}\nspace: {algorithm.tau: [0.1]}\n"
     "overrides: [algorithm=ucpo]\nobjective: {metric: train/reward}\n", "seeds.initial in"),
    ("experiment: toy\nseeds: {initial: 5, max: 2, halfwidth: 0.1}\nspace: {algorithm.tau: [0.1]}\n"
     "overrides: [algorithm=ucpo]\nobjective: {metric: train/reward}\n", "seeds.max in"),
    ("experiment: toy\nseeds: {initial: 5, max: 9, halfwidth: 0}\nspace: {algorithm.tau: [0.1]}\n"
     "overrides: [algorithm=ucpo]\nobjective: {metric: train/reward}\n", "seeds.halfwidth in"),
    ("experiment: toy\nseeds: {initial: 5, max: 9, width: 0.1}\nspace: {algorithm.tau: [0.1]}\n"
     "overrides: [algorithm=ucpo]\nobjective: {metric: train/reward}\n", "unknown seeds key 'width'"),
    ("experiment: toy\noverrides: [algorithm=ucpo, tracking.log_last=2]\nspace: {algorithm.tau: [0.1]}\n"
     "objective: {metric: train/reward, window: 4}\n", "tracking.log_last=2 in"),
]


def test_variants_are_named_override_lists_crossed_with_the_space(here: Path) -> None:
    path = _sweep_file(here, "experiment: toy\nvariants:\n  grpo: [algorithm=grpo]\n"
                             "  ucpo tau=1: [algorithm=ucpo, algorithm.tau=1.0]\n"
                             "space: {trainer.staleness: [0, 2]}\nobjective: {metric: train/reward}\n")
    spec = load_sweep(str(path))
    assert spec.grid() == [{"variant": v, "trainer.staleness": s} for v in ("grpo", "ucpo tau=1") for s in (0, 2)]
    assert spec.overrides_for({"variant": "ucpo tau=1", "trainer.staleness": 2}, 3) == [
        "tracking.log_last=1", "algorithm=ucpo", "algorithm.tau=1.0", "trainer.staleness=2", "seed=3",
        f"experiment={spec.name}"]  # tracking.log_last: the objective's window (1), each step of it logged
    changed = _sweep_file(here, path.read_text().replace("tau=1.0", "tau=0.5"), name="other.yaml")
    assert load_sweep(str(changed)).fingerprint() != spec.fingerprint()  # a variant's overrides are science


@pytest.mark.parametrize("text, expected", BAD_SWEEPS)
def test_bad_sweep_files_are_one_line_errors(here: Path, text: str, expected: str) -> None:
    path = _sweep_file(here, text)
    with pytest.raises(ConfigError) as caught:
        load_sweep(str(path))
    message = str(caught.value)
    assert expected in message and "\n" not in message


def test_cli_bad_sweep_and_missing_study_are_one_line(here: Path) -> None:
    path = _sweep_file(here, BAD_SWEEPS[0][0])
    result = _cli("sweep", str(path), cwd=here)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "unknown sweep key 'smapler'" in result.stderr

    result = _cli("sweep", "no_such_sweep", cwd=here)
    assert result.returncode == 1 and "unknown sweep 'no_such_sweep'" in result.stderr and "ucpo_tau" in result.stderr

    result = _cli("sweep", str(_sweep_file(here)), "--workers", "2", "--storage", "sqlite:///x.db", cwd=here)
    assert result.returncode == 1 and "one trial to two workers" in result.stderr

    result = _cli("sweep", str(_sweep_file(here)), "--status", cwd=here)  # nothing started yet
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "no study 'grid'" in result.stderr and result.stderr.strip().count("\n") == 0


def test_grid_points_and_fingerprint() -> None:
    spec = load_sweep(str(sweeps_dir() / "tau_eps_staleness_grid.yaml"))
    assert len(spec.grid()) == 27 and spec.seeds == (0, 1, 2, 3, 4) and spec.total_trials() == 27
    assert {p["algorithm.eps_high"] for p in spec.grid()} == {0.2, 0.28, math.inf}
    # budget and output location do not change the study; the seeds and the overrides do
    assert load_sweep(str(sweeps_dir() / "tau_eps_staleness_grid.yaml"), ["output_dir=/elsewhere"]).fingerprint() \
        == spec.fingerprint()
    assert load_sweep(str(sweeps_dir() / "tau_eps_staleness_grid.yaml"), seeds=3).fingerprint() != spec.fingerprint()
    assert load_sweep(str(sweeps_dir() / "tau_eps_staleness_grid.yaml"), ["steps=100"]).fingerprint() \
        != spec.fingerprint()


def test_shipped_sweep_files_validate() -> None:
    names = sorted(p.stem for p in sweeps_dir().glob("*.yaml"))
    assert {"ucpo_tau", "up_eps_high_staleness", "tau_eps_staleness_grid", "tiny_ucpo_tau",
            "tiny_up_eps_high_staleness", "tiny_tau_eps_staleness_grid", "ucpo_collapse", "up_stability",
            "tiny_algorithms", "tiny_up_stability"} <= set(names)
    for name in names:
        load_sweep(name)  # composes every grid point


def test_seed_summary_is_a_student_t_interval() -> None:
    s = seed_summary([1.0, 2.0, 3.0, 4.0])
    half = 3.182446305284263 * np.std([1, 2, 3, 4], ddof=1) / 2  # t_{0.975, 3}
    assert s["mean"] == pytest.approx(2.5) and s["low"] == pytest.approx(2.5 - half)
    assert s["high"] == pytest.approx(2.5 + half) and s["n"] == 4
    one = seed_summary([0.3])
    assert one["mean"] == 0.3 and math.isnan(one["low"]) and math.isnan(one["high"])


# 1, 2, 3, 4 by hand: mean 2.5, sd^2 = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, t_{0.975, 3} = 3.182446305284263
HALF = 3.182446305284263 * math.sqrt(5 / 3) / math.sqrt(4)
HAND_WORKED = {"mean": 2.5, "lcb95": 2.5 - HALF, "ucb95": 2.5 + HALF}


@pytest.mark.parametrize("name", sorted(AGGREGATES))
def test_every_aggregate_validates_in_a_sweep_file_and_scores_seed_values(here: Path, name: str) -> None:
    """Each registered aggregate: a sweep file naming it validates with a direction it fits and its seeds; fewer
    seeds or the other direction are one-line errors; a trial's seed values give the hand-worked value."""
    entry = AGGREGATES[name]
    assert name in HAND_WORKED, f"give the aggregate {name} a hand-worked value in HAND_WORKED"
    direction = entry.direction or "maximize"
    text = ("experiment: toy\noverrides: [algorithm=ucpo, steps=4]\nseeds: 2\nspace: {algorithm.tau: [0.1]}\n"
            f"objective: {{metric: train/reward, direction: {direction}, aggregate: {name}}}\n")
    spec = load_sweep(str(_sweep_file(here, text)), seeds=max(2, entry.min_seeds))
    assert spec.objective.aggregate == name and spec.objective.direction == direction
    if entry.min_seeds > 1:
        with pytest.raises(ConfigError, match=f"needs at least {entry.min_seeds} seeds"):
            load_sweep(str(_sweep_file(here, text)), seeds=entry.min_seeds - 1)
    if entry.direction is not None:
        other = text.replace(f"direction: {direction}", "direction: " + ("minimize" if direction == "maximize"
                                                                         else "maximize"))
        with pytest.raises(ConfigError, match="favours noisy trials"):
            load_sweep(str(_sweep_file(here, other)))
    value = entry.over([1.0, 2.0, 3.0, 4.0])
    assert value == pytest.approx(HAND_WORKED[name], rel=1e-12)
    assert entry.over([4.0, 1.0, 3.0, 2.0]) == value  # seeds in any order
    # its traits fit what it computes: undefined on one seed -> it needs 2; the direction it fits is the one for
    # which it is pessimistic (below the mean when maximising)
    assert entry.min_seeds >= 2 or not math.isnan(entry.over([0.3]))
    if entry.direction is not None:
        assert (value < 2.5) == (entry.direction == "maximize") and value != 2.5


def test_window_mean_is_the_mean_of_the_last_window_values() -> None:
    """One window for the objective and the pruner: the last `window` values in step order, all when fewer."""
    steps = [0.5, 1.0, 2.0, 4.0]
    assert window_mean(steps, 1) == 4.0 and window_mean(steps, 2) == 3.0
    assert window_mean(steps, 4) == window_mean(steps, 10) == 1.875


def test_adaptive_seeds_look_at_the_spread_only(here: Path) -> None:
    from rlvrlab.sweep.trials import more_seeds

    text = GRID.replace("seeds: 2", "seeds: {initial: 5, max: 10, halfwidth: 0.03}")
    spec = load_sweep(str(_sweep_file(here, text)))
    assert spec.seeds == (0, 1, 2, 3, 4) and spec.max_seeds == 10 and spec.seed_list(7) == (0, 1, 2, 3, 4, 5, 6)
    assert spec.fingerprint() != load_sweep(str(_sweep_file(here, GRID.replace("seeds: 2", "seeds: 5")))).fingerprint()
    values = {s: 0.50 + 0.02 * s for s in range(5)}  # Stein: (t_{.975,4} sd/0.03)^2 = 8.56 -> 9 seeds
    assert more_seeds(spec, values) == 4
    assert more_seeds(spec, {s: v + 100.0 for s, v in values.items()}) == 4  # the means never matter
    assert more_seeds(spec, {s: 0.5 + 0.001 * s for s in range(5)}) == 0  # narrow enough already
    assert more_seeds(spec, {s: float(s) for s in range(5)}) == 5  # capped at max = 10


@pytest.mark.slow
def test_an_adaptive_sweep_adds_seeds_until_the_target_or_max(here: Path) -> None:
    """A target no trial can meet: every trial grows to max seeds, and --status says how many more it needs."""
    text = GRID.replace("seeds: 2", "seeds: {initial: 5, max: 6, halfwidth: 0.000001}").replace(
        "trainer.staleness: [0, 1]", "trainer.staleness: [0]")
    path = _sweep_file(here, text)
    result = _cli("sweep", str(path), cwd=here)
    assert result.returncode == 0, result.stderr
    seeds = _role(_runs(here, "grid"), "seed")
    assert sorted(int(r.data.tags["seed"]) for r in seeds) == [s for s in range(6) for _ in (0, 1)]  # 2 trials x 0..5
    assert "more seeds" in result.stdout and "(> max 6)" in result.stdout and "until ±1e-06" in result.stdout


# --------------------------------------------------------------------------------------------- grid execution
@pytest.mark.slow
def test_grid_study_runs_each_point_once_with_the_mlflow_hierarchy(here: Path) -> None:
    from optuna.trial import TrialState

    spec = load_sweep(str(_sweep_file(here)))
    sweep = open_sweep(spec)
    outcomes = work(sweep)
    assert [o.state for o in outcomes] == ["COMPLETE"] * 4

    trials = sweep.study.get_trials()
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted((t.params["algorithm.tau"], t.params["trainer.staleness"]) for t in trials) == \
        [(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)]

    runs = _runs(here, "grid")
    study_runs, trial_runs, seed_runs = _role(runs, "study"), _role(runs, "trial"), _role(runs, "seed")
    assert len(study_runs) == 1 and len(trial_runs) == 4 and len(seed_runs) == 8
    study_id = study_runs[0].info.run_id
    assert study_runs[0].info.status == "RUNNING"  # until finish_study_run (the CLI calls it at the end)
    client = _client(here)
    by_trial = {r.info.run_id: r for r in trial_runs}
    for trial in trials:
        trial_run = by_trial[trial.user_attrs[T.MLFLOW_RUN_ID]]
        assert trial_run.data.tags[T.PARENT] == study_id
        assert trial_run.data.tags[T.TRIAL] == str(trial.number) and trial_run.info.status == "FINISHED"
        children = [r for r in seed_runs if r.data.tags[T.PARENT] == trial_run.info.run_id]
        assert sorted(r.data.tags["seed"] for r in children) == ["0", "1"]
        assert {r.data.tags["config_hash"] for r in children} == {trial_run.data.tags["config_hash"]}
        assert all(r.info.status == "FINISHED" and r.data.tags[T.STUDY] == "grid" for r in children)
        assert children[0].data.params["algorithm.tau"] == str(trial.params["algorithm.tau"])
        # the objective: per seed the mean of the last 4 steps of the metric, read back independently
        per_seed = []
        for child in children:
            history = client.get_metric_history(child.info.run_id, "policy/toy_correct_uniformity")
            last = sorted(history, key=lambda m: m.step)[-4:]
            assert [m.step for m in last] == [8, 9, 10, 11]
            per_seed.append(np.mean([m.value for m in last]))
        assert trial.value == pytest.approx(np.mean(per_seed), abs=1e-12)
        assert trial_run.data.metrics["objective/mean"] == pytest.approx(trial.value, abs=1e-12)
    # 4 configurations, 4 config hashes; seeds of one configuration share theirs
    assert len({r.data.tags["config_hash"] for r in trial_runs}) == 4

    # a second invocation has nothing left to run and adds no runs
    again = work(open_sweep(spec))
    assert again == [] and len(_runs(here, "grid")) == len(runs)


@pytest.mark.slow
def test_cli_sweep_prints_the_table_and_finishes_the_study_run(here: Path) -> None:
    path = _sweep_file(here, GRID.replace("[0.0, 1.0]", "[0.5]"))
    result = _cli("sweep", str(path), cwd=here)
    assert result.returncode == 0, result.stderr
    assert "2/2 trials done" in result.stdout and "best" in result.stdout and "optuna-dashboard" in result.stdout
    assert "95% CI" in result.stdout
    study_run = _role(_runs(here, "grid"), "study")[0]
    assert study_run.info.status == "FINISHED" and study_run.data.tags[T.BEST_TRIAL] in ("0", "1")
    status = _cli("sweep", str(path), "--status", cwd=here)
    assert status.returncode == 0 and "2/2 trials done" in status.stdout
    # the same study name with another sweep behind it is refused
    changed = _cli("sweep", str(path), "--seeds", "3", cwd=here)
    assert changed.returncode == 1 and "different sweep" in changed.stderr and "--name" in changed.stderr


def test_the_objective_reads_the_same_steps_at_every_log_every(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tracking.log_every changes what is logged, not what is measured: the sweep logs each step of the objective's
    window (tracking.log_last), so a sweep logging every 5th step scores every trial exactly as one logging every
    step, and its seed runs log steps 0, 5, 10 and the window's 8-11 only."""
    values, logged = {}, {}
    for every in (1, 5):
        folder = here / f"every{every}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        spec = load_sweep(str(_sweep_file(folder)), [f"tracking.log_every={every}"])
        sweep = open_sweep(spec)
        assert [o.state for o in work(sweep)] == ["COMPLETE"] * 4
        values[every] = {tuple(sorted(t.params.items())): t.value for t in sweep.study.get_trials()}
        client = _client(folder)
        logged[every] = {tuple(sorted(m.step for m in client.get_metric_history(r.info.run_id, "train/reward")))
                         for r in _role(_runs(folder, "grid"), "seed")}
    assert values[5] == values[1]  # bit for bit
    assert logged == {1: {tuple(range(12))}, 5: {(0, 5, 8, 9, 10, 11)}}


@pytest.mark.slow
def test_killed_worker_is_resumed_and_nothing_runs_twice(here: Path) -> None:
    """A worker SIGKILLed inside the second seed of its first trial; the re-run marks that trial failed,
    retries it reusing the finished seed, and ends with every point complete once and every seed run in MLflow."""
    from optuna.trial import TrialState

    path = _sweep_file(here)
    killed = _cli("sweep", str(path), cwd=here, env={"RLVRLAB_KILL_AFTER_STEP": "5"})
    assert killed.returncode == -9  # the first seed run dies after its step 5

    # the first seed run is left RUNNING by the dead process; the study has one RUNNING trial
    runs = _runs(here, "grid")
    assert Counter(r.info.status for r in _role(runs, "seed")) == {"RUNNING": 1}

    resumed = _cli("sweep", str(path), cwd=here)
    assert resumed.returncode == 0, resumed.stderr
    spec = load_sweep(str(path))
    trials = open_sweep(spec).study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(complete) == 4 and len(failed) == 1 and len(trials) == 5
    points = Counter((t.params["algorithm.tau"], t.params["trainer.staleness"]) for t in complete)
    assert set(points.values()) == {1} and len(points) == 4
    assert failed[0].user_attrs[T.FAILURE] == "worker" and "died" in failed[0].user_attrs[T.FAIL_REASON]
    retry = next(t for t in complete if t.system_attrs.get("failed_trial") == failed[0].number)
    assert retry.params == failed[0].params

    runs = _runs(here, "grid")
    seeds = _role(runs, "seed")
    finished = [r for r in seeds if r.info.status == "FINISHED"]
    assert len(finished) == 8 and Counter(r.info.status for r in seeds) == {"FINISHED": 8, "KILLED": 1}
    assert {(r.data.tags["config_hash"], r.data.tags["seed"]) for r in finished} == \
        {(t.user_attrs[T.TRIAL_CONFIG_HASH], s) for t in complete for s in ("0", "1")}
    trial_runs = {r.info.run_id: r for r in _role(runs, "trial")}
    assert trial_runs[failed[0].user_attrs[T.MLFLOW_RUN_ID]].info.status == "KILLED"
    for r in finished:  # every finished seed hangs under a finished trial
        assert trial_runs[r.data.tags[T.PARENT]].info.status == "FINISHED"
    assert not [r for r in runs if r.info.status == "RUNNING" and r.data.tags[T.ROLE] != "study"]


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's parent here may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stop_when_both_workers_run(path: Path, here: Path, sig: int) -> tuple[subprocess.Popen, set[int], str]:
    """Start `rlvrlab sweep --workers 2`, wait until both workers train a seed, send `sig` to the parent alone."""
    import time

    from optuna.trial import TrialState

    proc = subprocess.Popen([RLVRLAB, "sweep", str(path), "--workers", "2"], cwd=here, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    spec, pids, deadline = load_sweep(str(path)), set(), time.monotonic() + 300
    training = 0
    while len(pids) < 2 or training < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
        if (here / "runs" / "optuna.journal").exists():
            running = open_sweep(spec, create=False).study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            pids = {int(t.system_attrs[T.WORKER].split(":")[1]) for t in running
                    if T.WORKER in t.system_attrs}
            training = sum(r.info.status == "RUNNING" for r in _role(_runs(here, "grid"), "seed"))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)
    end = time.monotonic() + 60  # SIGKILL: the workers get SIGTERM from the kernel and close their runs
    while any(_alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.2)
    return proc, pids, err


@pytest.mark.slow
def test_a_killed_sweep_takes_its_workers_with_it_and_the_rerun_finishes(here: Path) -> None:
    """SIGTERM, then SIGKILL, to `rlvrlab sweep --workers 2` alone (not its process group): no worker outlives it
    to go on training and writing records, the interrupted seed runs end KILLED, and the same command then
    finishes the study with each of its two points once."""
    import signal

    from optuna.trial import TrialState

    # 800 steps: each seed trains ~10 s, so both workers are seen training at once on a loaded 2-core machine
    # (at 150 steps a CI run once finished the whole study between two polls)
    path = _sweep_file(here, GRID.replace("steps=12", "steps=800").replace("  trainer.staleness: [0, 1]\n", ""))
    proc, pids, err = _stop_when_both_workers_run(path, here, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: sweep stopped by SIGTERM before the study was done")
    assert not [pid for pid in pids if _alive(pid)]
    seeds = _role(_runs(here, "grid"), "seed")
    assert "KILLED" in {r.info.status for r in seeds} and "RUNNING" not in {r.info.status for r in seeds}
    assert [r.info.status for r in _role(_runs(here, "grid"), "study")] == ["KILLED"]

    proc, pids, _ = _stop_when_both_workers_run(path, here, signal.SIGKILL)
    assert proc.returncode == -9 and not [pid for pid in pids if _alive(pid)]
    assert "RUNNING" not in {r.info.status for r in _role(_runs(here, "grid"), "seed")}

    resumed = _cli("sweep", str(path), cwd=here)
    assert resumed.returncode == 0, resumed.stderr
    complete = open_sweep(load_sweep(str(path))).study.get_trials(states=(TrialState.COMPLETE,))
    points = Counter(t.params["algorithm.tau"] for t in complete)
    assert len(points) == 2 and set(points.values()) == {1}
    assert Counter(r.info.status for r in _role(_runs(here, "grid"), "seed"))["FINISHED"] >= 4
    assert [r.info.status for r in _role(_runs(here, "grid"), "study")] == ["FINISHED"]  # KILLED, then continued


@pytest.mark.slow
def test_a_failing_run_fails_its_trial_with_the_reason_and_the_sweep_goes_on(here: Path) -> None:
    from optuna.trial import TrialState

    text = GRID.replace("  algorithm.tau: [0.0, 1.0]\n  trainer.staleness: [0, 1]\n",
                        "  trainer.weight_decay: [0.0, 1.0e+300]\n")
    spec = load_sweep(str(_sweep_file(here, text)))
    outcomes = work(open_sweep(spec))
    assert sorted(o.state for o in outcomes) == ["COMPLETE", "FAIL"]
    trials = open_sweep(spec).study.get_trials()
    bad = next(t for t in trials if t.state == TrialState.FAIL)
    assert bad.params["trainer.weight_decay"] == 1e300 and bad.user_attrs[T.FAILURE] == "run"
    assert "2/2 seeds failed" in bad.user_attrs[T.FAIL_REASON]
    assert "weight norm after the update is nan" in bad.user_attrs[T.FAIL_REASON]
    runs = _runs(here, "grid")
    trial_run = next(r for r in _role(runs, "trial") if r.info.run_id == bad.user_attrs[T.MLFLOW_RUN_ID])
    assert trial_run.info.status == "FAILED" and "weight norm" in trial_run.data.tags[T.FAIL_REASON]
    assert Counter(r.info.status for r in _role(runs, "seed")) == {"FINISHED": 2, "FAILED": 2}
    # a deterministic failure is not repeated by a re-run
    assert work(open_sweep(spec)) == []
    rows = summarize(open_sweep(spec)).rows
    assert {r.state for r in rows} == {"COMPLETE", "FAIL"} and summarize(open_sweep(spec)).finished == 2


@pytest.mark.slow
def test_median_pruner_stops_a_trial_that_does_not_learn(here: Path) -> None:
    from optuna.trial import TrialState

    text = """\
experiment: toy
overrides: [algorithm=grpo, steps=30, trainer.checkpoint_every=0]
sampler: grid
seeds: 2
space:
  trainer.lr: [0.2, 1.0e-9]
objective: {metric: policy/toy_correct_mass, direction: maximize, window: 5}
pruner: {type: median, warmup_steps: 10, startup_trials: 1}
"""
    spec = load_sweep(str(_sweep_file(here, text)))
    outcomes = work(open_sweep(spec))
    assert [o.state for o in outcomes] == ["COMPLETE", "PRUNED"]  # the grid runs in file order
    trials = open_sweep(spec).study.get_trials()
    pruned = next(t for t in trials if t.state == TrialState.PRUNED)
    assert pruned.params["trainer.lr"] == 1e-9
    # what the pruner was told at each seed's last step (offset by 30 steps a seed) is that seed's objective: one
    # window, to the bit
    learned = next(t for t in trials if t.state == TrialState.COMPLETE)
    assert [learned.intermediate_values[29], learned.intermediate_values[59]] == \
        [learned.user_attrs[T.VALUES][seed] for seed in ("0", "1")]
    # pruned at the first step past warm-up of its first seed; intermediate values are on the per-step metric
    assert max(pruned.intermediate_values) == 10 and min(pruned.intermediate_values) == 0
    runs = _runs(here, "grid")
    seed_runs = [r for r in _role(runs, "seed") if r.data.tags[T.TRIAL] == str(pruned.number)]
    assert [r.info.status for r in seed_runs] == ["KILLED"]


@pytest.mark.slow
def test_two_workers_share_the_journal_and_run_each_point_once(here: Path) -> None:
    from optuna.trial import TrialState

    result = _cli("sweep", str(_sweep_file(here)), "--workers", "2", cwd=here)
    assert result.returncode == 0, result.stderr
    assert "4/4 trials done" in result.stdout
    trials = open_sweep(load_sweep(str(here / "grid.yaml"))).study.get_trials()
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    workers = {t.system_attrs[T.WORKER] for t in trials}
    assert 1 <= len(workers) <= 2
    seeds = _role(_runs(here, "grid"), "seed")
    assert len(seeds) == 8 and all(r.info.status == "FINISHED" for r in seeds)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["opening the study", "before the workers are let go"])
def test_workers_started_early_end_when_the_sweep_fails_before_they_work(here: Path, monkeypatch,
                                                                         where: str) -> None:
    """Workers are spawned before the parent opens the study and wait for it: an error in between (the study cannot
    be opened, or the progress display fails) ends them, and nothing was trained."""
    import multiprocessing

    import rlvrlab.sweep.workers as workers_module
    from rlvrlab.sweep.workers import run_sweep

    def fail(*args, **kwargs):
        raise RlvrlabError("made to fail")

    if where == "opening the study":
        monkeypatch.setattr(workers_module, "open_sweep", fail)
    spec = load_sweep(str(_sweep_file(here)))
    with pytest.raises(RlvrlabError, match="made to fail"):
        run_sweep(spec, workers=2, on_progress=fail if where != "opening the study" else None)
    assert multiprocessing.active_children() == []
    assert _role(_runs(here, "grid"), "seed") == []


@pytest.mark.slow
def test_tpe_sampler_respects_the_trial_budget(here: Path) -> None:
    text = """\
experiment: toy
overrides: [algorithm=ucpo, steps=8, trainer.checkpoint_every=0]
sampler: tpe
seeds: 1
space:
  algorithm.tau: {low: 0.0, high: 1.0}
  trainer.lr: {low: 0.01, high: 0.5, log: true}
objective: {metric: train/reward, direction: maximize}
budget: {trials: 3}
"""
    spec = load_sweep(str(_sweep_file(here, text)))
    assert [o.state for o in work(open_sweep(spec))] == ["COMPLETE"] * 3
    # more budget continues the same study (budget is not part of the fingerprint)
    more = load_sweep(str(_sweep_file(here, text.replace("trials: 3", "trials: 4"))))
    assert more.fingerprint() == spec.fingerprint()
    assert len(work(open_sweep(more))) == 1
    values = [t.params["algorithm.tau"] for t in open_sweep(more).study.get_trials()]
    assert len(set(values)) == 4 and all(0.0 <= v <= 1.0 for v in values)


def test_unreachable_storage_is_one_error(here: Path) -> None:
    spec = load_sweep(str(_sweep_file(here)))
    with pytest.raises(RlvrlabError, match="cannot open the Optuna storage postgresql://u:\\*\\*\\*@127.0.0.1:1/x"):
        open_sweep(spec, "postgresql://u:secret@127.0.0.1:1/x")
