"""What makes a run reproducible and groupable: its flattened config as params, grouping and git tags, the
resolved config, the installed packages and (for a dirty tree) the diff."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlvrlab.config.compose import config_hash, warm_start_seed, yaml_and_tree
from rlvrlab.config.schema import RunConfig
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.base import Tracker


@dataclass(frozen=True)
class Provenance:
    """What a new run records about itself: its grouping and git tags (given to the MLflow run when it is created),
    and its git diff when the checkout is dirty."""

    tags: dict[str, str]
    diff: str


def provenance(cfg: RunConfig) -> Provenance:
    """The tags of a new training run (config hash without seed) and the checkout's diff."""
    sha, dirty, diff = git_state()
    tags = {
        T.ALGORITHM: cfg.algorithm.name, T.MODEL: cfg.model.path or cfg.model.tier, T.DATASET: cfg.dataset.name,
        T.CONFIG_HASH: config_hash(cfg), T.SEED: str(cfg.seed), T.GIT_SHA: sha, T.GIT_DIRTY: str(dirty).lower(),
        T.TIER: cfg.model.tier,
    }
    if cfg.model.tier == "tiny":  # the seed in use: the config's model.warm_start_seed may be null (the run's seed)
        tags[T.WARM_START_SEED] = str(warm_start_seed(cfg))
    return Provenance(tags, diff if dirty else "")


def record_run(tracker: Tracker, cfg: RunConfig, made: Provenance) -> str:
    """Params and artifacts of a new training run created with `made`.tags; returns the resolved config as YAML
    (rlvrlab.config.compose.to_yaml), which the run folder keeps too."""
    text, tree = yaml_and_tree(cfg)
    tracker.log_params(flatten(tree))
    files = {"config.yaml": text, "packages.txt": packages()}
    if made.diff:
        files["git.diff"] = made.diff
    tracker.log_texts(files)
    return text


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, check=True, timeout=60).stdout


def repo_state(folder: Path) -> tuple[Optional[str], bool]:
    """(HEAD commit, uncommitted changes to tracked files) of the git repository holding `folder`; (None, False)
    outside one (or without git)."""
    try:
        return (_git(folder, "rev-parse", "HEAD").strip(),
                bool(_git(folder, "status", "--porcelain", "--untracked-files=no").strip()))
    except (OSError, subprocess.SubprocessError):
        return None, False


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str, bool, str]:
    """(commit, dirty, diff against HEAD) of the rlvrlab checkout that runs; ("unknown", False, "") outside git.
    Read once per process, as the code it runs was imported once: a sweep worker's 100th seed run runs the code
    its first did, whatever the checkout holds by then (and skips 2-3 git processes per run)."""
    root = Path(__file__).resolve().parents[2]
    sha, dirty = repo_state(root)
    if sha is None:
        return "unknown", False, ""
    try:
        return sha, dirty, _git(root, "diff", "HEAD") if dirty else ""
    except (OSError, subprocess.SubprocessError):
        return "unknown", False, ""


@functools.lru_cache(maxsize=1)
def packages() -> str:
    """Installed distributions (~90 ms to read; once per process: a sweep trains many runs in one). A distribution
    whose metadata cannot be read (pip installing into the environment meanwhile) is skipped, not fatal."""
    from importlib.metadata import distributions

    names = set()
    for dist in distributions():
        try:
            names.add(f"{dist.metadata['Name']}=={dist.version}")
        except Exception:
            continue
    return "\n".join(sorted(names)) + "\n"
