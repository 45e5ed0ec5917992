"""Command sweeps (rlvrlab/sweep/command.py, template.py): a sweep file's `command:` is another trainer's command;
rlvrlab makes each seed's MLflow run (study -> trial -> seed, its tags), the command logs into it through
MLFLOW_RUN_ID, and the objective is read back from it. The commands here are `python -c` scripts that log through
`mlflow.start_run()` / `mlflow.log_metric` as transformers' MLflowCallback and verl's logger do.
Run: .venv/bin/pytest -q tests/sweep/test_command.py"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rlvrlab.errors import ConfigError
from rlvrlab.sweep.spec import load_sweep
from rlvrlab.sweep.template import command_hash, render
from rlvrlab.sweep.workers import run_sweep
from rlvrlab.tracking import tags as T

RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))
QUOTED = """it's "two words"; echo $HOME `id` ${USER}"""  # every shell metacharacter a value could carry

# logs x and score = len(x) + seed + step at steps 0..2 into the run of MLFLOW_RUN_ID; x == "fail" fails first
SCRIPT = ("import sys; x, seed = sys.argv[1], int(sys.argv[2]); "
          "x == 'fail' and (print('loading data', file=sys.stderr), print('ValueError: no such column', "
          "file=sys.stderr), sys.exit(3)); "
          "import mlflow; mlflow.start_run(); mlflow.log_param('x', x); "
          "[mlflow.log_metric('score', len(x) + seed + s, step=s) for s in range(3)]; mlflow.end_run()")
COMMAND = f"{shlex.quote(sys.executable)} -c {shlex.quote(SCRIPT)} {{x}} {{seed}}"


def _file(folder: Path, values: list[str], extra: str = "", command: str = COMMAND, name: str = "cmd.yaml") -> Path:
    import yaml

    path = folder / name
    path.write_text(yaml.safe_dump({"name": "cmd", "command": command, "seeds": 2, "space": {"x": values},
                                    "objective": {"metric": "score", "window": 1}}) + extra)
    return path


def _runs(folder: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    found = client.get_experiment_by_name("cmd")
    return client.search_runs([found.experiment_id], max_results=1000) if found else []


def _role(runs: list, role: str) -> list:
    return [r for r in runs if r.data.tags.get(T.ROLE) == role]


# ------------------------------------------------------------------------------------------------ the template
def test_values_are_shell_quoted_and_shell_variables_left_alone() -> None:
    rendered = render("echo {x} ${HOME} {seed} '{print $1}' {a,b} {{x}}", {"x": QUOTED, "seed": "3"})
    assert rendered == f"echo {shlex.quote(QUOTED)} ${{HOME}} 3 '{{print $1}}' {{a,b}} {{x}}"
    said = subprocess.run(["/bin/sh", "-c", render("printf %s {x}", {"x": QUOTED})], capture_output=True, text=True)
    assert said.stdout == QUOTED  # one word, nothing expanded or run
    assert command_hash("t {x}", {"x": "1", "seed": "0"}) == command_hash("t {x}", {"x": "1", "seed": "4"})
    assert command_hash("t {x}", {"x": "1"}) != command_hash("t {x}", {"x": "2"}) != command_hash("u {x}", {"x": "2"})


BAD = [
    ({"command": "train --lr {lr} --seed {seed}"}, "unknown placeholder {lr}; this sweep gives {seed}, {study}, {x}"),
    ({"command": "train --x {x}"}, "has no {seed}"),
    ({"command": "train --seed {seed}"}, "space key x in"),
    ({"experiment": "toy"}, "gives both experiment and command"),
    ({"overrides": ["steps=3"]}, "a command sweep's overrides say only where its records go"),
    ({"pruner": {"type": "median"}}, "pruner median in"),
    ({"launcher": "inprocess"}, "launcher inprocess in"),
    ({"launcher": {"type": "process", "nproc": 2}}, "launcher nproc 2 in"),
    ({"space": {"x": [1]}, "variants": {"a": ["y=1"], "b": ["z=2"]}, "command": "t {x} {y} {seed}"},
     "variants.b in .* gives no value for {y}"),
    ({"variants": {"a": ["x=1"]}}, "sets 'x', which must be space: searches it too"),
    ({"command": ""}, "command in .* must be a shell command"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_command_sweeps_are_one_line_errors(here: Path, change: dict, message: str) -> None:
    import yaml

    body = {"name": "cmd", "command": "train --x {x} --seed {seed}", "seeds": 2, "space": {"x": [1, 2]},
            "objective": {"metric": "anything/the_command_logs"}, **change}
    path = here / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")) as error:
        load_sweep(str(path))
    assert "\n" not in str(error.value)


def test_variants_name_their_values() -> None:
    spec_text = {"command": "t {estimator} {variant} {lr} {seed}", "variants": {"grpo": ["estimator=grpo"],
                                                                                "up eps": ["estimator=up"]},
                 "space": {"lr": [0.1, 0.2]}}
    import tempfile

    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.yaml"
        path.write_text(yaml.safe_dump({"name": "v", "seeds": 1, "objective": {"metric": "m"}, **spec_text}))
        spec = load_sweep(str(path))
    assert [p["variant"] for p in spec.grid()] == ["grpo", "grpo", "up eps", "up eps"]
    values = spec.command_values({"variant": "up eps", "lr": 0.2}, 4)
    assert render(spec.command or "", values) == "t up 'up eps' 0.2 4"
    assert spec.launcher.type == "process"  # a command is its own process
    assert spec.trial_hash({"variant": "grpo", "lr": 0.1}) != spec.trial_hash({"variant": "up eps", "lr": 0.1})


# ------------------------------------------------------------------------------------------------ runs
@pytest.mark.slow
def test_a_command_sweep_makes_the_runs_the_commands_log_into(here: Path) -> None:
    """Two values (one full of quotes and shell syntax) x two seeds: each seed's run is the one the command's
    mlflow.start_run() re-attached to, nested under its trial with rlvrlab's seed-run tags and the command's
    provenance; the objective is read back from it; a second invocation runs nothing."""
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
                   check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    spec = load_sweep(str(_file(here, ["plain", QUOTED])), [f"output_dir={here}"])
    sweep = run_sweep(spec)
    trials = sweep.study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert {t.params["x"]: t.value for t in trials} == {"plain": 5 + 2 + 0.5, QUOTED: len(QUOTED) + 2 + 0.5}

    runs = _runs(here)
    (study,), trial_runs, seeds = _role(runs, "study"), _role(runs, "trial"), _role(runs, "seed")
    assert study.data.params["command"] == COMMAND and len(trial_runs) == 2 and len(seeds) == 4
    by_trial = {r.info.run_id: r for r in trial_runs}
    for trial in trials:
        run = by_trial[trial.user_attrs[T.MLFLOW_RUN_ID]]
        assert run.data.tags[T.PARENT] == study.info.run_id and run.data.params["x"] == trial.params["x"]
    for seed_run in seeds:
        tags, trial = seed_run.data.tags, by_trial[seed_run.data.tags[T.PARENT]]
        assert seed_run.info.status == "FINISHED" and tags[T.STUDY] == "cmd" and tags[T.TRIAL] == trial.data.tags[
            T.TRIAL]
        assert tags[T.CONFIG_HASH] == trial.data.tags[T.CONFIG_HASH]
        x, seed = seed_run.data.params["x"], int(tags[T.SEED])  # the param the command itself logged
        assert x == trial.data.params["x"] and seed_run.data.metrics["score"] == len(x) + seed + 2
        assert tags["mlflow.source.git.commit"] == tags[T.GIT_SHA] == head and tags[T.GIT_DIRTY] == "false"
        assert tags[T.attr("command")] == COMMAND.replace("{x}", shlex.quote(x)).replace("{seed}", str(seed))
        assert tags[T.OBJECTIVE] == str(float(len(x) + seed + 2))
    assert len({r.data.tags[T.CONFIG_HASH] for r in seeds}) == 2

    again = run_sweep(load_sweep(str(_file(here, ["plain", QUOTED])), [f"output_dir={here}"]))
    assert len(again.study.get_trials()) == 2 and len(_role(_runs(here), "seed")) == 4

    from rlvrlab.report.collect import select

    chosen = select(f"sqlite:///{here / 'mlflow.db'}", study="cmd")  # `rlvrlab report --study cmd` reads these
    assert sorted(g.label for g in chosen.groups) == sorted(["x=plain", f"x={QUOTED}"])  # the trial's value, not
    assert all(g.seeds == [0, 1] for g in chosen.groups)  # the command's own params


def test_a_failing_command_fails_its_seed_with_its_stderr(here: Path) -> None:
    """Its runs end FAILED (kept, with the reason) and the trial fails with the stderr's last lines."""
    path = _file(here, ["fail"])
    sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    (trial,) = sweep.study.get_trials()
    reason = trial.user_attrs[T.FAIL_REASON]
    assert trial.state.name == "FAIL" and reason.startswith("2/2 seeds failed; seed 0: the command failed (exit "
                                                            "code 3): loading data | ValueError: no such column")
    seeds = _role(_runs(here), "seed")
    assert [r.info.status for r in seeds] == ["FAILED", "FAILED"]
    assert all("ValueError: no such column" in r.data.tags[T.FAIL_REASON] for r in seeds)


STOPPING = (  # seed 1 of "plain", the first time: SIGTERM to the `rlvrlab sweep` above it, then wait to be stopped
    "import os, sys, time; x, seed = sys.argv[1], int(sys.argv[2]); "
    "pid = os.getppid()\n"
    "while b'\\0sweep\\0' not in open(f'/proc/{{pid}}/cmdline', 'rb').read(): "  # {{pid}}: the text {pid}
    "pid = int(open(f'/proc/{{pid}}/stat').read().rsplit(')', 1)[1].split()[1])\n"
    "open('ran.txt', 'a').write(x + ' ' + str(seed) + '\\n')\n"
    "if (x, seed) == ('plain', 1) and not os.path.exists('stopped'):\n"
    "    open('stopped', 'w').close(); os.kill(pid, 15); time.sleep(60)\n"
    "import mlflow; mlflow.start_run(); [mlflow.log_metric('score', len(x) + seed + s, step=s) for s in range(3)]")


@pytest.mark.slow
def test_a_stopped_command_sweep_reuses_its_finished_seeds(here: Path) -> None:
    """SIGTERM to `rlvrlab sweep` while trial 0's second command runs: the command is stopped, its run ends KILLED
    and the trial is re-enqueued; the same command again reuses the finished seed run (by config hash and seed)
    and runs only what is missing; `--status` shows the study. The command here ends without end_run(): rlvrlab
    marks its run FINISHED."""
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(STOPPING)} {{x}} {{seed}}"
    path = _file(here, ["plain", "other"], command=command)

    def sweep() -> subprocess.CompletedProcess:
        return subprocess.run([RLVRLAB, "sweep", str(path), f"output_dir={here}"], capture_output=True, text=True,
                              timeout=600)

    stopped = sweep()
    assert stopped.returncode == 128 + signal.SIGTERM and "sweep stopped by SIGTERM" in stopped.stderr, stopped.stderr
    assert Counter(r.info.status for r in _role(_runs(here), "seed")) == {"FINISHED": 1, "KILLED": 1}
    resumed = sweep()
    assert resumed.returncode == 0, resumed.stderr
    ran = Counter((here / "ran.txt").read_text().splitlines())
    assert ran == {"plain 0": 1, "plain 1": 2, "other 0": 1, "other 1": 1}  # plain 0 was not run again
    seeds = _role(_runs(here), "seed")
    assert Counter(r.info.status for r in seeds) == {"FINISHED": 4, "KILLED": 1}
    finished = {(r.data.tags[T.TRIAL], r.data.tags[T.SEED]) for r in seeds if r.info.status == "FINISHED"}
    assert finished == {("2", "0"), ("2", "1"), ("1", "0"), ("1", "1")}  # trial 0's retry (2) adopted seed 0's run

    shown = subprocess.run([RLVRLAB, "sweep", str(path), "--status", f"output_dir={here}"], capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert "2/2 trials done" in shown.stdout and "retry of trial 0" in shown.stdout, shown.stdout


def test_the_verl_sweep_file_of_the_docs_validates() -> None:
    """docs/sweeps.md's verl example: its placeholders, variants and GPU placement are a valid command sweep."""
    import re
    import tempfile

    docs = (Path(__file__).resolve().parents[2] / "docs" / "sweeps.md").read_text()
    (text,) = re.findall(r"```yaml\n(name: verl_estimators\n.*?)```", docs, re.S)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "verl.yaml"
        path.write_text(text)
        spec = load_sweep(str(path))
    assert (spec.launcher.type, spec.launcher.nproc, spec.launcher.gpus_per_run) == ("process", 1, 2)
    rendered = render(spec.command or "", spec.command_values({"variant": "rloo"}, 3))
    assert "data.seed=3 algorithm.adv_estimator=rloo trainer.project_name=verl_estimators" in rendered
    assert "trainer.experiment_name=rloo-seed3 'trainer.logger=[console,mlflow]'" in rendered
    assert "data.train_files=$HOME/data" in rendered  # the shell's, left alone


VERL_LIKE = (  # as verl's MLflow logger: set_experiment(project_name), then start_run(experiment_id, run_name)
    "import sys, mlflow; x, seed, study = sys.argv[1], int(sys.argv[2]), sys.argv[3]; "
    "e = mlflow.set_experiment(study); mlflow.start_run(experiment_id=e.experiment_id, run_name=f'{{x}}-{{seed}}'); "
    "mlflow.log_metric('score', seed + 1.0, step=0)")


@pytest.mark.slow
def test_a_command_that_sets_the_study_as_its_experiment_reattaches(here: Path) -> None:
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(VERL_LIKE)} {{x}} {{seed}} {{study}}"
    sweep = run_sweep(load_sweep(str(_file(here, ["a"], command=command)), [f"output_dir={here}"]))
    assert [t.value for t in sweep.study.get_trials()] == [1.5]
    seeds = _role(_runs(here), "seed")
    assert sorted(r.info.run_name for r in seeds) == ["a-0", "a-1"] and len(_runs(here)) == 4  # no other run
