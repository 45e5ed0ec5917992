"""The run folder's layout, readable by anyone (training writes it; evaluation and reports read it):

    <output_dir>/<run id>/
        config.yaml                       the resolved configuration the run trains with
        checkpoints/step_000010/
            model/                        weights as safetensors (+ tokenizer): a loadable HF folder (tiny, real)
            deepspeed/ | torch_engine.pt  the update engine's own state
            state_rank<r>.pt              step, data position, staleness queue, RNG states
            COMPLETE                      written last, with the sha256 of every file (each hashed by the rank
                                          that wrote it: `writer_rank`): a folder without it is ignored (a kill
                                          mid-save loses nothing); one whose files no longer match is skipped for
                                          the newest intact one (a damaged disk loses one interval)
        checkpoints/.tmp_step_000010/     a checkpoint being written
        .lock                             pid, host and start time of the process training the run (one writer)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from rlvrlab.errors import RlvrlabError

CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
MODEL = "model"


def run_dir(output_dir: str | Path, run_id: str) -> Path:
    """`<output_dir>/<run_id>`. A run id is one folder name: a path (`../other/<id>`) would reach, and lock, a run of
    another output folder than the one whose store records it."""
    if run_id in ("", ".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
        raise RlvrlabError(f"{run_id!r} is not a run id (the name of a run's folder, e.g. 3f2a9c...); for a run of "
                           "another output folder give its id and that folder (output_dir= to train, --output-dir "
                           "to eval)")
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
    """The run's complete checkpoint folders (COMPLETE written last), oldest first. A link named like one is not a
    folder rlvrlab wrote: never listed, so never loaded or pruned (pruning removes the oldest of these)."""
    return sorted(p for p in (run_folder / CHECKPOINTS).glob("step_*")
                  if not p.is_symlink() and (p / COMPLETE).exists())


def latest(run_folder: Path) -> Path | None:
    done = complete(run_folder)
    return done[-1] if done else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_files(folder: Path) -> list[str]:
    """The files of a checkpoint folder that COMPLETE lists, as paths relative to it, sorted: all but COMPLETE."""
    return [str(p.relative_to(folder)) for p in sorted(folder.rglob("*")) if p.is_file() and p.name != COMPLETE]


def checksums(folder: Path, names: Iterable[str]) -> dict[str, str]:
    """name -> sha256 of the file `folder / name`."""
    return {name: file_sha256(folder / name) for name in names}


# the per-rank files of a checkpoint: this loop's state_rank<r>.pt and DeepSpeed's shards, whose names carry their
# data-parallel rank (zero_pp_rank_<r>_mp_rank_00_optim_states.pt under ZeRO 1-3, bf16_ prefixed with bf16, and
# zero_pp_rank_<r>_mp_rank_00_model_states.pt under ZeRO-3); with neither pipeline nor tensor parallel in DeepSpeed,
# the data-parallel rank is the global rank
_RANK_FILE = re.compile(r"(?:^|/)(?:state_rank(\d+)\.pt|(?:bf16_)?zero_pp_rank_(\d+)_[^/]*)$")


def writer_rank(name: str, world_size: int) -> int:
    """The rank that writes file `name` (relative to a checkpoint folder) of a run on `world_size` ranks: r for the
    per-rank files (state_rank<r>.pt, DeepSpeed's zero_pp_rank_<r>_... shards), else 0 (model/, DeepSpeed's
    mp_rank_00_model_states.pt and zero_to_fp32.py, the torch engine's file)."""
    match = _RANK_FILE.search(name)
    rank = int(match.group(1) or match.group(2)) if match else 0
    return rank if rank < world_size else 0


def write_complete(folder: Path, step: int, sums: dict[str, str] | None = None) -> None:
    """Mark a fully written checkpoint folder complete: COMPLETE holds the step and the sha256 of every file in it
    (verified before the checkpoint is read: `damage`). sums: those checksums, computed by the ranks that wrote the
    files (rlvrlab.train.checkpoint); None: computed here."""
    if sums is None:
        sums = checksums(folder, checkpoint_files(folder))
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


def newest_intact(run_folder: Path, run_id: str, *, purpose: str, fix: str, warn: Callable[[str], None]) -> Path:
    """The run's newest complete checkpoint whose files match their checksums: where a resume continues and what
    evaluation loads by default. Damaged newer ones are skipped with one warning naming them; with no intact one
    left, one RlvrlabError. purpose: what the checkpoint is for, as a participle ('resumed', 'evaluated'); fix: what
    to do when the run has no complete checkpoint at all."""
    good, bad = intact(run_folder)
    where = run_folder / CHECKPOINTS
    if not good:
        if bad:
            raise RlvrlabError(f"run {run_id} cannot be {purpose}: {damage_note(bad)} and no intact one is left in "
                               f"{where}; its records are unchanged")
        raise RlvrlabError(f"run {run_id} has no complete checkpoint in {where}; {fix}")
    newer = [(folder, problem) for folder, problem in bad if step_of(folder) > step_of(good[-1])]
    if newer:
        warn(f"run {run_id}: {damage_note(newer)}; the newest intact one, {good[-1].name}, is {purpose} instead")
    return good[-1]
