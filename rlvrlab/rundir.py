"""The run folder's layout, readable by anyone (training writes it; evaluation and reports read it):

    <output_dir>/<run id>/
        config.yaml                       the resolved configuration the run trains with
        checkpoints/step_000010/
            model/                        weights as safetensors (+ tokenizer): a loadable HF folder (tiny, real)
            deepspeed/ | torch_engine.pt  the update engine's own state
            state_rank<r>.pt              step, data position, staleness queue, RNG states
            COMPLETE                      written last, with the sha256 of every file: a folder without it is
                                          ignored (a kill mid-save loses nothing); one whose files no longer match
                                          is skipped for the newest intact one (a damaged disk loses one interval)
        checkpoints/.tmp_step_000010/     a checkpoint being written
        .lock                             pid, host and start time of the process training the run (one writer)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
MODEL = "model"


def run_dir(output_dir: str | Path, run_id: str) -> Path:
    return Path(output_dir).expanduser().resolve() / run_id


def config_file(run_folder: Path) -> Path:
    return run_folder / CONFIG


def checkpoint_dir(run_folder: Path, step: int) -> Path:
    return run_folder / CHECKPOINTS / f"step_{step:06d}"


def partial_checkpoint_dir(run_folder: Path, step: int) -> Path:
    return run_folder / CHECKPOINTS / f".tmp_step_{step:06d}"


def step_of(folder: Path) -> int:
    """The step a checkpoint folder step_NNNNNN was saved at."""
    return int(folder.name.removeprefix("step_"))


def complete(run_folder: Path) -> list[Path]:
    """The run's complete checkpoint folders (COMPLETE written last), oldest first."""
    return sorted(p for p in (run_folder / CHECKPOINTS).glob("step_*") if (p / COMPLETE).exists())


def latest(run_folder: Path) -> Path | None:
    done = complete(run_folder)
    return done[-1] if done else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_complete(folder: Path, step: int) -> None:
    """Mark a fully written checkpoint folder complete: COMPLETE holds the step and the sha256 of every file in it
    (verified before the checkpoint is read: `damage`)."""
    sums = {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != COMPLETE}
    text = json.dumps({"step": step, "sha256": sums}, indent=1, sort_keys=True)
    tmp = folder / f".{COMPLETE}.tmp"
    tmp.write_text(text + "\n")
    tmp.rename(folder / COMPLETE)


def damage(folder: Path) -> str | None:
    """What is wrong with a complete checkpoint folder (a missing or changed file), or None when every file matches
    the checksums written with its COMPLETE marker. A checkpoint written before checksums existed (COMPLETE holds
    only the step) cannot be checked and counts as intact."""
    try:
        text = (folder / COMPLETE).read_text()
    except (OSError, UnicodeDecodeError) as error:
        return f"{COMPLETE} unreadable ({error.__class__.__name__})"
    if not text.lstrip().startswith("{"):
        return None  # written by an older rlvrlab: no checksums
    try:
        sums = json.loads(text)["sha256"]
    except (ValueError, KeyError, TypeError):
        return f"{COMPLETE} is damaged"
    for name, expected in sums.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if file_sha256(path) != expected:
            return f"{name} does not match its checksum"
    return None


def intact(run_folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The run's complete checkpoints whose files match their checksums (oldest first), and the damaged ones with
    what is wrong with each."""
    good, bad = [], []
    for folder in complete(run_folder):
        problem = damage(folder)
        if problem is None:
            good.append(folder)
        else:
            bad.append((folder, problem))
    return good, bad


def damage_note(bad: list[tuple[Path, str]]) -> str:
    """'checkpoint step_000020 is damaged (model.safetensors does not match its checksum)', for messages."""
    parts = [f"{folder.name} ({problem})" for folder, problem in bad]
    return f"checkpoint{'s' if len(parts) > 1 else ''} {', '.join(parts)} {'are' if len(parts) > 1 else 'is'} damaged"
