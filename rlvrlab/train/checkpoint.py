"""Checkpoints: everything needed to continue a run exactly where it stopped.

    <run_dir>/checkpoints/step_000010/
        model/              weights as safetensors (+ tokenizer): a loadable HF folder for the tiny/real tiers
        deepspeed/ | torch_engine.pt   the update engine's own state: weights, optimizer moments, ZeRO shards
        state_rank<r>.pt    step, data position, the staleness queue of rollouts, RNG states
        COMPLETE            written last: a folder without it is ignored (a kill mid-save loses nothing)

The last KEEP checkpoints are kept; older ones are deleted after a newer one is complete.
"""

from __future__ import annotations

import random
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from rlvrlab.train.batch import RolloutBatch

KEEP = 2


@dataclass
class TrainState:
    step: int = 0  # the next step to run
    next_batch: int = 0  # data position: index of the next rollout batch to generate
    queue: deque[RolloutBatch] = field(default_factory=deque)  # generated, not yet consumed (staleness)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save(run, state: TrainState) -> Path:
    root = run.run_dir / "checkpoints"
    final = root / f"step_{state.step:06d}"
    tmp = root / f".tmp_step_{state.step:06d}"
    if run.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    run.update.save(tmp)  # collective under DeepSpeed
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"step": state.step, "next_batch": state.next_batch, "queue": list(state.queue), "rng": rng},
               tmp / f"state_rank{run.rank}.pt")
    if run.rank == 0:
        run.save_model(run.update.module, tmp / "model")
    _barrier()
    if run.rank == 0:
        (tmp / "COMPLETE").write_text(f"{state.step}\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in complete(run.run_dir)[:-KEEP]:
            shutil.rmtree(old)
    _barrier()
    return final


def step_of(folder: Path) -> int:
    """The step a checkpoint folder step_NNNNNN was saved at."""
    return int(folder.name.removeprefix("step_"))


def complete(run_dir: Path) -> list[Path]:
    """The run's complete checkpoint folders (COMPLETE written last), oldest first."""
    return sorted(p for p in (run_dir / "checkpoints").glob("step_*") if (p / "COMPLETE").exists())


def latest(run_dir: Path) -> Path | None:
    done = complete(run_dir)
    return done[-1] if done else None


def restore(run, folder: Path) -> TrainState:
    """Load engine, weights, queue and RNG states; the rollout engine gets the restored weights."""
    run.update.load(folder)  # weights and optimizer
    saved = torch.load(folder / f"state_rank{run.rank}.pt", weights_only=False)
    random.setstate(saved["rng"]["python"])
    np.random.set_state(saved["rng"]["numpy"])
    torch.set_rng_state(saved["rng"]["torch"])
    run.rollout.sync_weights(run.update.weights())
    return TrainState(step=saved["step"], next_batch=saved["next_batch"], queue=deque(saved["queue"]))
