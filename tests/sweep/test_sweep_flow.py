"""A sweep's flow over failures (issue 46): fail-fast on a shared failure (rlvrlab/sweep/failfast.py), truthful exit
codes (exits.py), --retry-failed (retry.py) and the code-change guard (guard.py). The seed runs are tiny command
scripts (train.py in the test's folder) that log through mlflow as another trainer would.
Run: .venv/bin/pytest -q tests/sweep/test_sweep_flow.py"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.sweep import failfast
from rlvrlab.sweep.guard import CODE_DIGEST, changed_files, watched
from rlvrlab.sweep.spec import load_sweep
from rlvrlab.tracking import tags as T

RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))

BROKEN = """\
import sys
x, seed = sys.argv[1], int(sys.argv[2])
open("ran.txt", "a").write(f"{x} {seed}\\n")
print("Traceback (most recent call last):", file=sys.stderr)
print(f"ModuleNotFoundError: No module named 'datasets' (in /tmp/job-{seed}/site.py, 0x7f{seed}a9)", file=sys.stderr)
sys.exit(1)
"""
FIXED = """\
import sys, os
x, seed = sys.argv[1], int(sys.argv[2])
open("ran.txt", "a").write(f"{x} {seed}\\n")
if x == "bad" or (x == "flaky" and seed == 1 and not os.path.exists("healed")):
    print(f"RuntimeError: CUDA error at step {seed}", file=sys.stderr)
    sys.exit(2)
import mlflow
mlflow.start_run()
mlflow.log_metric("score", float(len(x) + seed), step=0)
mlflow.end_run()
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _sweep(folder: Path, values: list[str], seeds: int, extra: str = "") -> Path:
    import yaml

    command = f"{shlex.quote(sys.executable)} train.py {{x}} {{seed}}"
    path = folder / "flow.yaml"
    path.write_text(yaml.safe_dump({"name": "flow", "command": command, "seeds": seeds, "space": {"x": values},
                                    "objective": {"metric": "score", "window": 1}}) + extra)
    return path


def _cli(path: Path, folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RLVRLAB, "sweep", str(path), f"output_dir={folder}", *args], cwd=folder,
                          capture_output=True, text=True, timeout=600)


def _seed_runs(folder: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    found = client.get_experiment_by_name("flow")
    runs = client.search_runs([found.experiment_id], max_results=1000) if found else []
    return [r for r in runs if r.data.tags.get(T.ROLE) == "seed"]


def _ran(folder: Path) -> Counter:
    ran = folder / "ran.txt"
    return Counter(ran.read_text().splitlines()) if ran.exists() else Counter()


# ------------------------------------------------------------------------------------------------ signatures
def test_a_signature_keeps_the_exit_status_and_the_last_error_line_without_what_varies() -> None:
    one = ("the command failed (exit code 1): Traceback (most recent call last): | ModuleNotFoundError: No module "
           "named 'datasets' (in /tmp/job-0/site.py, 0x7f0a9); log: /out/logs/flow/trial-0-seed-0.log")
    two = one.replace("job-0", "job-7").replace("0x7f0a9", "0x7f7a9").replace("trial-0-seed-0", "trial-3-seed-2")
    assert failfast.signature(one) == failfast.signature(two) == (
        "exit code 1: ModuleNotFoundError: No module named 'datasets' (in <path>, <hex>)")
    assert failfast.signature(one) != failfast.signature(one.replace("exit code 1", "exit code 2"))
    assert failfast.signature("run 0123456789abcdef0123456789abcdef logged no 'score'; it logged nothing") == \
        failfast.signature("run fedcba9876543210fedcba9876543210 logged no 'score'; it logged loss") == \
        "logged no 'score'"
    assert failfast.signature("step 3: the weight norm after the update is nan; run x is marked FAILED") is None
    assert failfast.signature("KeyError: 12 in run 0123456789abcdef0123456789abcdef") == "KeyError: <n> in run <run>"


class _Study:
    """The study user attrs fail-fast reads and writes, in memory."""

    def __init__(self) -> None:
        self.user_attrs: dict[str, Any] = {}

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value


def test_the_rule_stops_on_the_first_two_failures_alike_before_any_success() -> None:
    same = "the command failed (exit code 1): OSError: no such file /data/train-{}.jsonl"
    study = _Study()
    epoch = failfast.arm(study, True)
    assert failfast.record(study, epoch, 0, 0, same.format(0)) is None
    stop = failfast.record(study, epoch, 1, 0, same.format(1))
    assert stop is not None and stop["seeds"] == ["trial 0 seed 0", "trial 1 seed 0"]
    assert failfast.stopped(study, epoch) == stop and "fail-fast" in failfast.stop_line(stop)

    success_first = _Study()
    epoch = failfast.arm(success_first, True)
    failfast.record(success_first, epoch, 0, 0, None)
    assert failfast.record(success_first, epoch, 0, 1, same.format(0)) is None
    assert failfast.record(success_first, epoch, 1, 0, same.format(1)) is None

    different = _Study()
    epoch = failfast.arm(different, True)
    failfast.record(different, epoch, 0, 0, same.format(0))
    assert failfast.record(different, epoch, 0, 1, "the command failed (exit code 2): other") is None
    assert failfast.record(different, epoch, 1, 0, same.format(1)) is None  # decided: the first two differ
    assert len(different.user_attrs) == 3  # the epoch and the two failures: nothing more is recorded

    diverged = _Study()
    epoch = failfast.arm(diverged, True)
    for seed in range(3):
        assert failfast.record(diverged, epoch, 0, seed, f"step {seed}: the loss is nan; run x") is None

    off = _Study()
    epoch = failfast.arm(off, False)  # --keep-going
    for seed in range(3):
        assert failfast.record(off, epoch, 0, seed, same.format(seed)) is None
    assert failfast.stopped(off, epoch) is None


# ------------------------------------------------------------------------------------------------ the guard
def test_the_guard_watches_the_commands_files_and_the_watch_globs(here: Path) -> None:
    (here / "train.py").write_text("print(1)\n")
    (here / "src").mkdir()
    (here / "src" / "model.py").write_text("x = 1\n")
    (here / "conf.yaml").write_text("a: 1\n")
    path = _sweep(here, ["a"], 1, "watch: ['src/**/*.py']\n")
    path.write_text(path.read_text().replace("train.py {x}", "train.py --config=conf.yaml {x}"))
    spec = load_sweep(str(path))
    assert sorted(watched(spec)) == ["conf.yaml", "src/model.py", "train.py"]  # not the Python interpreter
    assert changed_files({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b (changed)", "c (new)"]
    missing = load_sweep(str(_sweep(here, ["a"], 1, "watch: ['lib/*.py']\n")))
    with pytest.raises(RlvrlabError, match=r"watch: 'lib/\*\.py' in .* matches no file"):
        watched(missing)
    own = load_sweep(str(Path(__file__).resolve().parents[2] / "sweeps" / "tiny_ucpo_tau.yaml"))
    assert "rlvrlab/sweep/guard.py" in watched(own)  # rlvrlab's own trainer: rlvrlab's source


def test_the_guard_refuses_changed_code_unless_allowed(here: Path) -> None:
    """Recorded on a new study; the same code passes; a changed file is refused in one line naming it; allowed, the
    new code is recorded, with the history of digests tagged on the study run."""
    from types import SimpleNamespace

    from rlvrlab.sweep import guard

    tagged: list[dict] = []
    client = SimpleNamespace(log_batch=lambda run_id, tags: tagged.append({t.key: t.value for t in tags}))
    (here / "train.py").write_text("print(1)\n")
    sweep = SimpleNamespace(spec=load_sweep(str(_sweep(here, ["a"], 1))), study=_Study(), study_run_id="r",
                            client=lambda: client, code_digest=None)
    first = guard.check(sweep, allow=False)
    assert sweep.code_digest == first["digest"] and list(first["files"]) == ["train.py"] and len(tagged) == 1
    guard.check(sweep, allow=False)
    assert len(tagged) == 1  # nothing changed: nothing written
    (here / "train.py").write_text("print(2)\n")
    with pytest.raises(RlvrlabError, match=r"changed since its seed runs ran .*: train.py \(changed\); add "
                                           r"--allow-code-change") as refused:
        guard.check(sweep, allow=False)
    assert "\n" not in str(refused.value) and sweep.code_digest == first["digest"]
    warned: list[str] = []
    second = guard.check(sweep, allow=True, warn=warned.append)
    assert sweep.code_digest == second["digest"] != first["digest"] and "train.py (changed)" in warned[0]
    assert tagged[-1][CODE_DIGEST] == second["digest"]
    assert tagged[-1][guard.CODE_DIGESTS] == f"{first['digest']},{second['digest']}"


# ------------------------------------------------------------------------------------------------ the flow
@pytest.mark.slow
def test_a_shared_failure_stops_the_sweep_then_the_fix_is_guarded_and_retried(here: Path) -> None:
    """4 values x 3 seeds over a script that fails at start: fail-fast stops after 2 seed runs (exit 3, one line
    naming the log); --status still exits 0. The fixed script is another code: refused (exit 1, naming it) until
    --allow-code-change; --retry-failed then re-runs the failed trial as attempt 2 and the grid's other points run;
    the new seed runs carry the new code digest."""
    (here / "train.py").write_text(BROKEN)
    path = _sweep(here, ["a", "bb", "ccc", "dddd"], 3)
    stopped = _cli(path, here)
    assert stopped.returncode == 3, stopped.stderr
    assert sum(_ran(here).values()) == 2
    line = stopped.stderr.strip().splitlines()[-1]
    assert line.startswith("error: sweep stopped by fail-fast: the first 2 failed seed runs (trial 0 seed 0, trial 0 "
                           "seed 1) failed the same way") and "ModuleNotFoundError" in line and "; log: " in line, line
    assert "Traceback" not in stopped.stderr.replace("Traceback (most recent call last):", "")

    status = _cli(path, here, "--status")
    assert status.returncode == 0 and "0/4 trials" not in status.stdout, status.stdout
    assert "1/4 trials done" in status.stdout, status.stdout

    (here / "train.py").write_text(FIXED)
    refused = _cli(path, here, "--retry-failed")
    assert refused.returncode == 1 and "train.py (changed)" in refused.stderr, refused.stderr
    assert "--allow-code-change" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    done = _cli(path, here, "--retry-failed", "--allow-code-change")
    assert done.returncode == 0, done.stderr
    assert "4/4 trials done" in done.stdout and "retry of trial 0" in done.stdout, done.stdout
    seeds = _seed_runs(here)
    finished = [r for r in seeds if r.info.status == "FINISHED"]
    assert len(finished) == 12 and Counter(r.info.status for r in seeds)["FAILED"] == 2
    retried = [r for r in finished if r.data.tags.get(T.RETRY_OF) == "0"]
    assert len(retried) == 3 and {r.data.tags[T.attr("attempt")] for r in retried} == {"2"}
    assert {r.data.tags[T.attr("attempt")] for r in seeds if r not in retried} == {"1"}
    old, new = ({r.data.tags[CODE_DIGEST] for r in group} for group in (
        [r for r in seeds if r.info.status == "FAILED"], finished))
    assert len(old) == len(new) == 1 and old != new  # a report can tell the seeds of the two codes apart
    assert _ran(here) == {"a 0": 2, "a 1": 2, "a 2": 1, **{f"{x} {s}": 1 for x in ("bb", "ccc", "dddd") for s in range(3)}}


@pytest.mark.slow
def test_failed_seeds_are_retried_alone_and_the_exit_code_says_what_failed(here: Path) -> None:
    """A trial whose seed 1 fails (after seed 0 succeeded: no fail-fast) and a trial that always fails: exit 2 with
    both named; --retry-failed re-runs only their failed seeds (seed 0 of "flaky" is reused), the healed one
    completes as attempt 2 and the other fails again (exit 2 still); --status shows the attempts and exits 0."""
    from rlvrlab.sweep.exits import outcome
    from rlvrlab.sweep.summary import summarize
    from rlvrlab.sweep.workers import run_sweep

    (here / "train.py").write_text(FIXED)
    path = _sweep(here, ["flaky", "bad"], 2)
    first = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    code, line = outcome(first)
    assert code == 2 and line is not None and line.startswith("2 trials of study 'flow' failed (trial 0: 1/2 seeds "
                                                              "failed; seed 1: the command failed (exit code 2)")
    assert "--retry-failed" in line
    assert _ran(here) == {"flaky 0": 1, "flaky 1": 1, "bad 0": 1, "bad 1": 1}

    (here / "healed").touch()
    again = run_sweep(load_sweep(str(path), [f"output_dir={here}"]), retry_failed=True)
    assert _ran(here) == {"flaky 0": 1, "flaky 1": 2, "bad 0": 2, "bad 1": 2}  # flaky 0 was reused
    rows = {(row.params["x"], row.attempt): row for row in summarize(again).rows}
    assert rows[("flaky", 2)].state == "COMPLETE" and rows[("flaky", 2)].retry_of == 0
    assert rows[("flaky", 1)].retried and rows[("bad", 2)].state == "FAIL"
    code, line = outcome(again)
    assert code == 2 and line is not None and line.startswith("1 trial of study 'flow' failed (trial 3:")
    assert summarize(again).finished == 2  # each grid point once

    shown = _cli(path, here, "--status")
    flat = " ".join(shown.stdout.replace("│", " ").split())  # a note wraps inside its column
    assert shown.returncode == 0 and "attempt" in shown.stdout and "re-run by a later attempt" in flat, shown.stdout


@pytest.mark.slow
def test_fail_fast_with_several_workers(here: Path) -> None:
    """Two worker processes share the rule through the study's storage: the sweep stops long before its 12 seed
    runs, exit 3; --keep-going runs every seed and exits 2."""
    (here / "train.py").write_text(BROKEN)
    path = _sweep(here, ["a", "bb", "ccc", "dddd"], 3)
    stopped = _cli(path, here, "--workers", "2", "--oversubscribe")
    assert stopped.returncode == 3 and "sweep stopped by fail-fast" in stopped.stderr, stopped.stderr
    assert sum(_ran(here).values()) <= 4
    kept = _cli(path, here, "--keep-going", "--retry-failed")
    assert kept.returncode == 2 and "4 trials of study 'flow' failed" in kept.stderr, kept.stderr
    assert sum(_ran(here).values()) >= 12


TOY = """\
experiment: toy
overrides: [algorithm=ucpo, steps=3, trainer.checkpoint_every=0]
sampler: grid
seeds: 3
space:
  algorithm.tau: [0.0, 0.25, 0.5, 1.0]
objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 1}
"""


def test_fail_fast_stops_in_process_seed_runs_of_rlvrlabs_own_trainer(here: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule for in-process seeds: a trainer that fails at start (here made to) stops the sweep after 2 of
    its 12 seed runs; the seed runs were given their attempt and rlvrlab's source digest as tags."""
    import rlvrlab.train.loop
    from rlvrlab.sweep.exits import outcome
    from rlvrlab.sweep.workers import run_sweep

    given: list[dict] = []

    def fails(cfg: Any, *, tags: dict, **kwargs: Any) -> str:
        given.append(tags)
        raise RuntimeError(f"cannot open /data/shard-{cfg.seed}.bin")

    monkeypatch.setattr(rlvrlab.train.loop, "train", fails)
    (here / "toy.yaml").write_text(TOY)
    opened = run_sweep(load_sweep(str(here / "toy.yaml"), [f"output_dir={here}"]))
    code, line = outcome(opened)
    assert code == 3 and line is not None and "RuntimeError: cannot open /data/shard-1.bin" in line, line
    assert len(given) == 2 and {t[T.attr("attempt")] for t in given} == {"1"}
    assert {t[CODE_DIGEST] for t in given} == {opened.code_digest} and opened.code_digest
    states = Counter(t.state.name for t in opened.study.get_trials())
    assert states == {"FAIL": 1, "WAITING": 3}
    study_run = opened.client().get_run(opened.study_run_id)
    assert study_run.info.status == "FAILED" and "fail-fast" in study_run.data.tags[T.FAIL_REASON]
    assert study_run.data.tags[CODE_DIGEST] == opened.code_digest
