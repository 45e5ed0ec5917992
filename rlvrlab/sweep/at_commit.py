"""The code of a recorded commit, for `rlvrlab reproduce --at-recorded-commit`: a checkout of that commit in a
temporary folder, and a seed run as a child `rlvrlab train` of that code.

The checkout is a shared clone (`git clone --shared --no-checkout`, then `git checkout --detach SHA`): it reads the
repository's object store and changes nothing in the repository (no worktree is registered, no ref moves), and is
deleted on leaving. The child is the sweep's own child command (rlvrlab.sweep.launch.train_command) run with the
clone first on PYTHONPATH and as its working folder, so it imports, composes and records with the recorded
commit's code, experiments/ and git state (its runs' git_sha is that commit's, git_dirty false)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.sweep.launch import child_env, failure_reason, train_command
from rlvrlab.sweep.spec import SweepSpec
from rlvrlab.tracking import tags as T

REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout this code runs from
GIT_SECONDS = 300


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_SECONDS)


def commit_of(commits: Sequence[str], error: type[RlvrlabError] = RlvrlabError) -> str:
    """The one recorded commit of the runs to re-run, known to this repository; `error` naming what to do
    otherwise."""
    known = sorted(set(commits) - {"", "unknown"})
    if len(known) != 1 or len(set(commits)) != 1:
        raise error(f"--at-recorded-commit: the runs to re-run were recorded at {len(set(commits))} commits "
                    f"({', '.join(sorted(set(commits))) or 'none'}); choose groups of one commit with --groups, or "
                    "drop --at-recorded-commit")
    if _git("cat-file", "-e", f"{known[0]}^{{commit}}", cwd=REPOSITORY).returncode != 0:
        raise error(f"--at-recorded-commit: commit {known[0]} is not in the repository at {REPOSITORY}; fetch it "
                    "(git fetch origin) or drop --at-recorded-commit")
    return known[0]


@contextlib.contextmanager
def checkout(sha: str) -> Iterator[Path]:
    """A temporary checkout of `sha` (a shared clone of this repository), removed on leaving."""
    folder = Path(tempfile.mkdtemp(prefix=f"rlvrlab-{sha[:12]}-"))
    try:
        code = folder / "rlvrlab"
        for args, where in ((("clone", "--quiet", "--shared", "--no-checkout", str(REPOSITORY), str(code)), folder),
                            (("checkout", "--quiet", "--detach", sha), code)):
            done = _git(*args, cwd=where)
            if done.returncode != 0:
                raise RlvrlabError(f"--at-recorded-commit: git {' '.join(args[:2])} failed: "
                                   f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
        yield code
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def seed_run(code: Path, spec: SweepSpec, overrides: Sequence[str], client: Any, experiment: str,
             seed: int) -> tuple[Optional[str], str]:
    """One seed run as the sweep's child `rlvrlab train` with the code at `code`: (run id, "") or (None, why).
    overrides must hold an absolute output_dir (the child runs in `code`) and experiment=`experiment`."""
    env = {**child_env(spec.launcher.nproc), "PYTHONPATH": os.pathsep.join(
        [str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(train_command(spec, overrides, {T.ROLE: "reproduce"}), cwd=code, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None, failure_reason(done.returncode, done.stderr.splitlines())
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], filter_string=(
        f"tags.seed = '{seed}' and tags.`{T.ROLE}` = 'reproduce' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"], max_results=1) if found else []
    return (runs[0].info.run_id, "") if runs else (None, "the child `rlvrlab train` ended without a finished run")
