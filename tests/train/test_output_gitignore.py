"""The default output folder (`output_dir=runs`, relative to where the command runs: often the user's own git
checkout) gets a `.gitignore` of `*` when rlvrlab creates it, so `git add -A` there does not take in checkpoints and
a growing mlflow.db (once tracked, every later run from that checkout would record git_dirty=true). A folder that
exists already, or another output_dir, is left as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlvrlab.config.schema import RunConfig
from rlvrlab.outputs import GITIGNORE, GITIGNORE_TEXT, make_output_dir

ROOT = Path(__file__).resolve().parents[2]


def test_only_a_new_default_folder_gets_a_gitignore(tmp_path: Path) -> None:
    made = make_output_dir(tmp_path / "a" / "runs", default=True)
    assert made == tmp_path / "a" / "runs" and made.is_dir()
    assert (made / GITIGNORE).read_text() == GITIGNORE_TEXT and GITIGNORE_TEXT.splitlines()[-1] == "*"
    assert make_output_dir(tmp_path / "b", default=False).is_dir() and not (tmp_path / "b" / GITIGNORE).exists()

    existing = tmp_path / "existing"  # the user's folder: nothing added, nothing changed
    existing.mkdir()
    (existing / "notes.txt").write_text("mine\n")
    make_output_dir(existing, default=True)
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / GITIGNORE).write_text("!important\n")
    make_output_dir(kept, default=True)
    assert (kept / GITIGNORE).read_text() == "!important\n"
    make_output_dir(made, default=True)  # made before: left as it is
    assert sorted(p.name for p in made.iterdir()) == [GITIGNORE]
    assert RunConfig.output_dir == "runs"  # the default the train command compares with


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=60).stdout


def _train(cwd: Path, *overrides: str) -> None:
    code = ("from rlvrlab.config import compose\nfrom rlvrlab.train.loop import train\n"
            f"train(compose('toy', ['steps=1', *{list(overrides)!r}]))\n")
    env = {**os.environ, "RLVRLAB_EXPERIMENTS_DIR": str(ROOT / "experiments"), "OMP_NUM_THREADS": "1"}
    env.pop("RLVRLAB_OUTPUT_DIR", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow  # three toy runs of one step, each a fresh process
def test_a_run_in_a_git_checkout_leaves_it_clean(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = tmp_path / "lab"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("# the lab's own code\n")
    _git(repo, "add", "train.py")

    _train(repo)  # output_dir's default: runs/ of the working directory, made by this run
    runs = repo / "runs"
    assert (runs / "mlflow.db").is_file() and (runs / GITIGNORE).read_text() == GITIGNORE_TEXT
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == "A  train.py\n"
    _git(repo, "add", "-A")
    assert _git(repo, "diff", "--cached", "--name-only") == "train.py\n"  # nothing of runs/ was taken in

    existing = tmp_path / "own" / "runs"  # a runs/ the user made: rlvrlab adds nothing to it
    existing.mkdir(parents=True)
    _train(existing.parent)
    assert (existing / "mlflow.db").is_file() and not (existing / GITIGNORE).exists()
    elsewhere = tmp_path / "given"
    _train(repo, f"output_dir={elsewhere}")  # another output_dir: not the default, no .gitignore
    assert (elsewhere / "mlflow.db").is_file() and not (elsewhere / GITIGNORE).exists()


def test_a_sweep_that_creates_the_default_folder_writes_it_too(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlvrlab sweep` creates output_dir first, for its journal: the default one gets the .gitignore, another not."""
    from rlvrlab.sweep.storage import open_storage, storage_url

    monkeypatch.chdir(tmp_path)
    open_storage(storage_url("runs", None))
    assert (tmp_path / "runs" / GITIGNORE).read_text() == GITIGNORE_TEXT
    open_storage(storage_url("elsewhere", None))
    assert (tmp_path / "elsewhere" / "optuna.journal").exists() and not (tmp_path / "elsewhere" / GITIGNORE).exists()
