"""Which code the runs behind a table were trained with (their git_sha and git_dirty tags, or MLflow's
mlflow.source.git.commit for runs of another trainer), and the rule that a table published in results/ rests on runs
from one known, clean commit unless the author says otherwise (dirty or mixed: a flag; unknown: never); the initial
models the runs started from (their digest tags: groups compared across different ones need the same flag); and
paths made portable, so that a sources.json names no directory of the machine that wrote it."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.collect import Group, Selection

UNKNOWN = "unknown"  # a run's git_sha when no tag names its commit
REPO_ROOT = Path(__file__).resolve().parents[2]
_REPO_RESULTS = REPO_ROOT / "results"


@dataclass(frozen=True)
class Provenance:
    commits: tuple[str, ...]  # distinct git_sha of the runs, most frequent first ("unknown" among them)
    runs: int
    dirty_runs: int  # runs trained from a tree with uncommitted changes
    unknown_runs: tuple[str, ...] = ()  # run ids without a git commit tag: unknown provenance
    unrecorded_tree_runs: int = 0  # runs with a commit but no record of whether their tree was clean
    # two groups compared across different recorded initial models: (label a, digest a, label b, digest b)
    initial_mismatch: tuple[str, ...] = ()

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
    return Provenance(commits, len(runs), sum(r.git_dirty for r in runs), unknown, unrecorded,
                      initial_mismatch(selection.groups))


def initial_mismatch(groups: list[Group]) -> tuple[str, ...]:
    """The first pair of groups whose comparison crosses initial models, as (label, digest, label, digest): a seed
    both have whose recorded digests differ (a paired comparison pairs the runs of that seed), or two groups that
    each started from one recorded digest, different ones. () when every comparison stays within one initial model
    as far as the digest tags tell (runs without the tag are not compared)."""
    digests = [{r.seed: r.initial_model for r in g.runs if r.initial_model} for g in groups]
    for i, a in enumerate(groups):
        for j in range(i + 1, len(groups)):
            b, da, db = groups[j], digests[i], digests[j]
            crossed = [s for s in sorted(set(da) & set(db)) if da[s] != db[s]]
            if crossed:
                return a.label, da[crossed[0]], b.label, db[crossed[0]]
            ones_a, ones_b = set(da.values()), set(db.values())
            if len(ones_a) == 1 and len(ones_b) == 1 and ones_a != ones_b:
                return a.label, next(iter(ones_a)), b.label, next(iter(ones_b))
    return ()


def results_dir() -> Path:
    """The published results folder: $RLVRLAB_RESULTS_DIR, else results/ next to the package."""
    return Path(os.environ.get("RLVRLAB_RESULTS_DIR") or _REPO_RESULTS).expanduser().resolve()


def publishes(folder: Path) -> bool:
    folder, root = Path(folder).expanduser().resolve(), results_dir()
    return folder == root or root in folder.parents


def check(provenance: Provenance, folder: Path, *, allow_dirty: bool, allow_mixed: bool) -> None:
    """Refuse to write a table into results/ from dirty or mixed-commit runs, or comparing groups that started from
    different recorded initial models (one line, how to fix). Elsewhere the footer says so and nothing is refused:
    groups may differ in their initial model on purpose (another model size, another task's table)."""
    if not publishes(folder):
        return
    if provenance.initial_mismatch and not allow_mixed:
        a, digest_a, b, digest_b = provenance.initial_mismatch
        raise RlvrlabError(f"groups {a!r} and {b!r} started from different initial models (sha256 {digest_a[:12]} "
                           f"vs {digest_b[:12]}): their difference mixes the model with the method; re-run one of "
                           "them from the other's initial model, write elsewhere with --out, or pass --allow-mixed "
                           "(the table then says so)")
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


# A dated appendix ("## Appendix (2026-12-07): ...") added to a protocol after its runs translates or annotates the
# pre-registered text (e.g. its rules as a ```verdict block) and changes no rule: it is not part of the registration,
# so the check below reads the text above the first such heading only.
APPENDIX = re.compile(r"^## Appendix \(", re.MULTILINE)


def registered_text(text: str) -> str:
    """The pre-registered part of a protocol: its text above the first `## Appendix (` heading."""
    found = APPENDIX.search(text)
    return (text[:found.start()] if found else text).rstrip()


def protocol(path: Path, run_commits: tuple[str, ...], first_run_start_ms: int) -> Protocol:
    """The protocol record of `path` for runs from `run_commits` whose first started at `first_run_start_ms`.

    "Last change" is the last commit that changed the registered text (registered_text): commits that only add or
    edit a dated appendix after the runs do not unregister a study."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise RlvrlabError(f"--protocol {path} does not exist; give the study's protocol file, e.g. "
                           "results/protocols/NAME.md")
    folder = path.parent
    start = datetime.fromtimestamp(first_run_start_ms / 1000, tz=timezone.utc)
    history = _history(folder, path.name)  # newest first: (sha, commit time, the file's path at that commit)
    if not history:
        return Protocol(portable(str(path)), None, None, None, start.isoformat(), False, "the file is not committed")
    texts = [registered_text(_git(folder, "show", f"{sha}:{name}")) for sha, _, name in history]
    changed_at = next((i for i in range(len(history) - 1) if texts[i] != texts[i + 1]), len(history) - 1)
    last_sha, last_time, _ = history[changed_at]
    first_sha = history[-1][0]
    dirty = registered_text(path.read_text(encoding="utf-8", errors="replace")) != texts[0]
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
    return Protocol(portable(str(path)), first_sha, last_sha, changed.isoformat(), start.isoformat(), not reason,
                    reason)


def _history(folder: Path, name: str) -> list[tuple[str, str, str]]:
    """(sha, commit time, path relative to the repository root at that commit) of every commit that touched the file,
    newest first, following renames."""
    out = _git(folder, "log", "--follow", "--format=@%H %ct", "--name-only", "--", name)
    history: list[tuple[str, str, str]] = []
    for block in out.split("@")[1:]:
        lines = [line for line in block.splitlines() if line.strip()]
        sha, time = lines[0].split()
        history.append((sha, time, lines[-1].strip()))
    return history


def first_run_start(client, selection: Selection) -> int:
    """The earliest start time (ms) among the selection's seed runs, finished or failed."""
    return min(client.get_run(r.run_id).info.start_time for g in (selection.all_groups or selection.groups)
               for r in [*g.runs, *g.failed_runs])


# ----------------------------------------------------------------------------------------------- portable paths
OUTSIDE = "<outside the repository>"  # stands for a directory of the machine that wrote a file
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_URI_PATHS = ("sqlite:///", "file://")  # URIs whose rest is a file path (sqlite:////abs/mlflow.db, file:///abs)
# an absolute path or a file URI inside free text (a note): not after a word character, a dot, a slash or the ">" of
# OUTSIDE (so that a portable text stays as it is)
_IN_TEXT = re.compile(r"(?:sqlite|file):///?[^\s;,()'\"]+|(?<![\w.:/~\\>-])(?:/|[A-Za-z]:[\\/])[^\s;,()'\"]+")


def is_absolute(text: str) -> bool:
    """A POSIX (/x), Windows (C:\\x, C:/x) or UNC (\\\\host\\x) absolute path."""
    return text.startswith(("/", "\\\\")) or bool(_DRIVE.match(text))


def portable(value: str, root: Optional[Path] = None) -> str:
    """`value` (a path, a tracking URI or a command-line argument) as a sources.json writes it: an absolute path
    under the repository root `root` (default: this checkout) relative to it, any other absolute path as
    `<outside the repository>/<its last two parts>`; a sqlite or file URI with its file part so made portable, a
    server URI with its password masked (rlvrlab.tracking.store.masked); `--option=/path` by its path; anything
    else unchanged."""
    from rlvrlab.tracking.store import masked

    for scheme in _URI_PATHS:
        if value.startswith(scheme):
            rest = value[len(scheme):]
            return scheme + _portable_path(rest, root) if is_absolute(rest) else value
    if "://" in value:
        return masked(value)
    if value.startswith("-") and "=" in value:
        option, _, rest = value.partition("=")
        return f"{option}={portable(rest, root)}"
    return _portable_path(value, root) if is_absolute(value) else value


def _portable_path(text: str, root: Optional[Path]) -> str:
    root = Path(root) if root is not None else REPO_ROOT
    windows = not text.startswith("/")
    path = PureWindowsPath(text) if windows else PurePosixPath(os.path.normpath(text))
    if not windows:
        for base in dict.fromkeys([PurePosixPath(os.path.normpath(str(root))), PurePosixPath(root.resolve())]):
            if path == base:
                return "."
            if base in path.parents:
                return path.relative_to(base).as_posix()
    parts = [part for part in path.parts[1:] if part not in ("\\", "/")]
    return "/".join([OUTSIDE, *parts[-2:]])


def portable_text(text: str, root: Optional[Path] = None) -> str:
    """Free text (a table note) with every absolute path and file URI in it made portable (`portable`)."""
    return _IN_TEXT.sub(lambda m: portable(m.group(0), root), text)


def portable_source(text: str) -> str:
    """An initial model's source tag (`warm_start:<folder>`, `hf:<folder>@<revision>`, ...) with its path portable."""
    kind, colon, rest = text.partition(":")
    return f"{kind}:{portable(rest)}" if colon and is_absolute(rest) else portable_text(text)


# ------------------------------------------------------------------------ initial models and environments
_NO_DIGEST = ("runs recorded without an rlvrlab.initial_model.sha256 tag (before rlvrlab tagged initial-model "
              "digests, or by another trainer)")
_NO_ENVIRONMENT = ("runs recorded without rlvrlab.env.* tags (before rlvrlab tagged the environment, or by "
                   "another trainer)")


def initial_models(groups: list[Group]) -> dict:
    """sources.json's `initial_models`: each distinct digest of the runs' initial weights with the groups (and
    their run counts) that started from it and its recorded sources; runs that overrode a protocol's digest; and
    `recorded: false` with the reason where runs carry no digest tag."""
    runs = [(g.label, r) for g in groups for r in [*g.runs, *g.failed_runs]]
    digests: dict[str, dict] = {}
    for label, r in runs:
        if r.initial_model:
            entry = digests.setdefault(r.initial_model, {"sha256": r.initial_model, "runs": 0, "groups": {},
                                                         "sources": []})
            entry["runs"] += 1
            entry["groups"][label] = entry["groups"].get(label, 0) + 1
            source = portable_source(r.initial_model_source) if r.initial_model_source else None
            if source and source not in entry["sources"]:
                entry["sources"].append(source)
    untagged = sum(not r.initial_model for _, r in runs)
    block: dict = {"recorded": untagged == 0 and bool(runs), "digests": list(digests.values())}
    if untagged:
        block["reason"] = f"{untagged} of {len(runs)} {_NO_DIGEST}"
    overrides = [{"run_id": r.run_id, "sha256": r.initial_model, "expected": r.initial_model_expected}
                 for _, r in runs if r.initial_model_expected]
    if overrides:
        block["overrides"] = overrides
    return block


def environments(groups: list[Group], eval_runs: Optional[dict[str, list]] = None) -> dict:
    """sources.json's `environment`: each distinct environment (its rlvrlab.env.* tags as a dict) with the count
    of training runs (and evaluation runs) recorded under it; `recorded: false` with the reason where runs carry
    none."""
    found: dict[str, dict] = {}
    untagged = total = 0
    members = [("runs", r) for g in groups for r in [*g.runs, *g.failed_runs]]
    members += [("eval_runs", e) for runs in (eval_runs or {}).values() for e in runs if hasattr(e, "environment")]
    for kind, r in members:
        total += 1
        if not r.environment:
            untagged += 1
            continue
        key = repr(sorted(r.environment.items()))
        entry = found.setdefault(key, {"environment": dict(sorted(r.environment.items())), "runs": 0,
                                       "eval_runs": 0})
        entry[kind] += 1
    block: dict = {"recorded": untagged == 0 and bool(total), "environments": list(found.values())}
    if untagged:
        block["reason"] = f"{untagged} of {total} {_NO_ENVIRONMENT}"
    return block
