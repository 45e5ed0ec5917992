"""Which code the runs behind a table were trained with (their git_sha and git_dirty tags), and the rule that a
table published in results/ rests on runs from one clean commit unless the author says otherwise."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.collect import Selection

_REPO_RESULTS = Path(__file__).resolve().parents[2] / "results"


@dataclass(frozen=True)
class Provenance:
    commits: tuple[str, ...]  # distinct git_sha of the runs, most frequent first
    runs: int
    dirty_runs: int  # runs trained from a tree with uncommitted changes

    @property
    def mixed(self) -> bool:
        return len(self.commits) > 1

    @property
    def clean(self) -> bool:
        return self.dirty_runs == 0 and not self.mixed

    def as_dict(self) -> dict:
        return {"commits": list(self.commits), "runs": self.runs, "dirty_runs": self.dirty_runs}


def of(selection: Selection) -> Provenance:
    runs = [r for g in selection.groups for r in g.runs]
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.git_sha] = counts.get(r.git_sha, 0) + 1
    commits = tuple(sorted(counts, key=lambda sha: (-counts[sha], sha)))
    return Provenance(commits, len(runs), sum(r.git_dirty for r in runs))


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
    shas = ", ".join(sha[:7] for sha in provenance.commits[:4]) + (", ..." if len(provenance.commits) > 4 else "")
    if provenance.clean:
        return f"provenance: all {provenance.runs} runs from commit {shas}, clean tree"
    parts = []
    if provenance.mixed:
        parts.append(f"runs from {len(provenance.commits)} commits ({shas}; --allow-mixed)")
    else:
        parts.append(f"runs from commit {shas}")
    if provenance.dirty_runs:
        parts.append(f"{provenance.dirty_runs} of {provenance.runs} runs from a tree with uncommitted changes "
                     "(--allow-dirty)")
    return "provenance: " + "; ".join(parts)
