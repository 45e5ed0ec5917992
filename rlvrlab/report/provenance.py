"""Which code the runs behind a table were trained with (their git_sha and git_dirty tags, or MLflow's
mlflow.source.git.commit for runs of another trainer), and the rule that a table published in results/ rests on runs
from one known, clean commit unless the author says otherwise (dirty or mixed: a flag; unknown: never)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.collect import Selection

UNKNOWN = "unknown"  # a run's git_sha when no tag names its commit
_REPO_RESULTS = Path(__file__).resolve().parents[2] / "results"


@dataclass(frozen=True)
class Provenance:
    commits: tuple[str, ...]  # distinct git_sha of the runs, most frequent first ("unknown" among them)
    runs: int
    dirty_runs: int  # runs trained from a tree with uncommitted changes
    unknown_runs: tuple[str, ...] = ()  # run ids without a git commit tag: unknown provenance
    unrecorded_tree_runs: int = 0  # runs with a commit but no record of whether their tree was clean

    @property
    def known_commits(self) -> tuple[str, ...]:
        return tuple(c for c in self.commits if c != UNKNOWN)

    @property
    def mixed(self) -> bool:
        return len(self.known_commits) > 1

    @property
    def clean(self) -> bool:
        return self.dirty_runs == 0 and not self.mixed and not self.unknown_runs and not self.unrecorded_tree_runs

    def as_dict(self) -> dict:
        return {"commits": list(self.commits), "runs": self.runs, "dirty_runs": self.dirty_runs,
                "unknown_provenance_runs": list(self.unknown_runs), "unrecorded_tree_runs": self.unrecorded_tree_runs}


def of(selection: Selection) -> Provenance:
    runs = [r for g in (selection.all_groups or selection.groups) for r in [*g.runs, *g.failed_runs]]
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.git_sha] = counts.get(r.git_sha, 0) + 1
    commits = tuple(sorted(counts, key=lambda sha: (-counts[sha], sha)))
    unknown = tuple(r.run_id for r in runs if r.git_sha == UNKNOWN)
    unrecorded = sum(not r.dirty_known for r in runs if r.git_sha != UNKNOWN)
    return Provenance(commits, len(runs), sum(r.git_dirty for r in runs), unknown, unrecorded)


def results_dir() -> Path:
    """The published results folder: $RLVRLAB_RESULTS_DIR, else results/ next to the package."""
    return Path(os.environ.get("RLVRLAB_RESULTS_DIR") or _REPO_RESULTS).expanduser().resolve()


def publishes(folder: Path) -> bool:
    folder, root = Path(folder).expanduser().resolve(), results_dir()
    return folder == root or root in folder.parents


def check(provenance: Provenance, folder: Path, *, allow_dirty: bool, allow_mixed: bool) -> None:
    """Refuse to write a table into results/ from dirty or mixed-commit runs (one line, how to fix)."""
    if not publishes(folder):
        return
    if provenance.unknown_runs:  # no flag: a published number must say which code made it
        ids = provenance.unknown_runs
        raise RlvrlabError(f"{len(ids)} of the {provenance.runs} runs behind this table have unknown provenance (no "
                           f"git commit tag: {', '.join(ids[:4])}{', ...' if len(ids) > 4 else ''}); log the commit "
                           "(mlflow.set_tag('mlflow.source.git.commit', SHA), or start the runs from a git checkout "
                           "so MLflow tags it), or write elsewhere with --out")
    if provenance.dirty_runs and not allow_dirty:
        raise RlvrlabError(f"{provenance.dirty_runs} of the {provenance.runs} runs behind this table were trained "
                           f"from a tree with uncommitted changes; re-run them from a clean commit, write elsewhere "
                           f"with --out, or pass --allow-dirty (the table then says so)")
    if provenance.mixed and not allow_mixed:
        shown = ", ".join(sha[:7] for sha in provenance.commits[:4])
        raise RlvrlabError(f"the runs behind this table come from {len(provenance.commits)} commits ({shown}); "
                           "re-run them from one commit, write elsewhere with --out, or pass --allow-mixed (the "
                           "table then says so)")


def note(provenance: Provenance) -> str:
    """The table's footer line."""
    commits = provenance.known_commits
    shas = ", ".join(sha[:7] for sha in commits[:4]) + (", ..." if len(commits) > 4 else "")
    if provenance.clean:
        return f"provenance: all {provenance.runs} runs from commit {shas}, clean tree"
    parts = []
    if provenance.unknown_runs:
        ids = provenance.unknown_runs
        parts.append(f"UNKNOWN PROVENANCE for {len(ids)} of {provenance.runs} runs (no git commit tag: "
                     f"{', '.join(i[:7] for i in ids[:6])}{', ...' if len(ids) > 6 else ''}; not publishable in "
                     "results/)")
    if provenance.mixed:
        parts.append(f"runs from {len(commits)} commits ({shas}; --allow-mixed)")
    elif commits:
        parts.append(f"{'other ' if provenance.unknown_runs else ''}runs from commit {shas}")
    if provenance.dirty_runs:
        parts.append(f"{provenance.dirty_runs} of {provenance.runs} runs from a tree with uncommitted changes "
                     "(--allow-dirty)")
    if provenance.unrecorded_tree_runs:
        parts.append(f"whether the tree was clean is not recorded for {provenance.unrecorded_tree_runs} runs "
                     "(MLflow's git tag has no dirty flag)")
    return "provenance: " + "; ".join(parts)


@dataclass(frozen=True)
class Protocol:
    """A study's protocol file and whether the study may be called pre-registered (`rlvrlab report --protocol`).

    Pre-registered means: the file is committed, unchanged since before the first seed run of the study started
    (its last commit is older than that run's start), and that commit is in the history of every commit the runs
    were trained from. Anything else is recorded with the reason, and the table says "not pre-registered"."""

    path: str
    first_commit: str | None  # the commit that added the file: the registration
    last_commit: str | None  # the last commit that changed it
    last_commit_time: str | None  # ISO 8601, UTC
    first_run_start: str  # ISO 8601, UTC, the earliest start of the study's seed runs (finished or failed)
    pre_registered: bool
    reason: str  # why not, or "" when pre-registered

    def as_dict(self) -> dict:
        return asdict(self)

    def note(self) -> str:
        where = f"{self.path} (committed {self.first_commit[:7]}" if self.first_commit else f"{self.path} (uncommitted"
        if self.last_commit and self.last_commit != self.first_commit:
            where += f", last changed {self.last_commit[:7]}"
        if self.pre_registered:
            return f"protocol: {where}; pre-registered: its last change precedes the first run)"
        return f"protocol: {where}); NOT pre-registered: {self.reason}"


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def protocol(path: Path, run_commits: tuple[str, ...], first_run_start_ms: int) -> Protocol:
    """The protocol record of `path` for runs from `run_commits` whose first started at `first_run_start_ms`."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise RlvrlabError(f"--protocol {path} does not exist; give the study's protocol file, e.g. "
                           "results/protocols/NAME.md")
    folder = path.parent
    start = datetime.fromtimestamp(first_run_start_ms / 1000, tz=timezone.utc)
    history = _git(folder, "log", "--follow", "--format=%H %ct", "--", path.name).splitlines()
    dirty = bool(_git(folder, "status", "--porcelain", "--", path.name))
    if not history:
        return Protocol(str(path), None, None, None, start.isoformat(), False, "the file is not committed")
    last_sha, last_time = history[0].split()
    first_sha = history[-1].split()[0]
    changed = datetime.fromtimestamp(int(last_time), tz=timezone.utc)
    reason = ""
    if dirty:
        reason = "the file has uncommitted changes"
    elif changed.timestamp() + 1 > start.timestamp():  # commit times are whole seconds: a tie is not "before"
        reason = (f"its last change ({last_sha[:7]}, {changed.isoformat()}) is not before the first run started "
                  f"({start.isoformat()})")
    else:
        missing = [c for c in run_commits if c != "unknown" and
                   subprocess.run(["git", "-C", str(folder), "merge-base", "--is-ancestor", last_sha, c],
                                  capture_output=True, check=False).returncode != 0]
        if missing or "unknown" in run_commits:
            reason = f"runs were trained from commits without it ({', '.join(c[:7] for c in missing) or 'unknown'})"
    return Protocol(str(path), first_sha, last_sha, changed.isoformat(), start.isoformat(), not reason, reason)


def first_run_start(client, selection: Selection) -> int:
    """The earliest start time (ms) among the selection's seed runs, finished or failed."""
    return min(client.get_run(r.run_id).info.start_time for g in (selection.all_groups or selection.groups)
               for r in [*g.runs, *g.failed_runs])
