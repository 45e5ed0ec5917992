"""The run folder's layout, readable by anyone (training writes it; evaluation and reports read it):

    <output_dir>/<run id>/
        config.yaml                       the resolved configuration the run trains with
        checkpoints/step_000010/
            model/                        weights as safetensors (+ tokenizer): a loadable HF folder (tiny, real)
            deepspeed/ | torch_engine.pt  the update engine's own state
            state_rank<r>.pt              step, data position, staleness queue, RNG states
            COMPLETE                      written last: a folder without it is ignored (a kill mid-save loses nothing)
        checkpoints/.tmp_step_000010/     a checkpoint being written
"""

from __future__ import annotations

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
