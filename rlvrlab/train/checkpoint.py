"""Checkpoints: everything needed to continue a run exactly where it stopped (the folder layout is
`rlvrlab.rundir`'s). The last KEEP checkpoints are kept; older ones are deleted after a newer one is complete.
"""

from __future__ import annotations

import random
import shutil
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlvrlab import rundir
from rlvrlab.rundir import complete, latest, step_of
from rlvrlab.train.batch import RolloutBatch, Sampled, TrainerLogp
from rlvrlab.update.base import full_weights
from rlvrlab.update.dist import all_gather_objects, barrier

KEEP = 2


@dataclass
class TrainState:
    step: int = 0  # the next step to run
    next_batch: int = 0  # data position: index of the next rollout batch to generate
    queue: deque[Sampled] = field(default_factory=deque)  # generated, not yet consumed (staleness)


def save(run, state: TrainState, *, before_complete: Callable[[], None] | None = None) -> Path:
    """Write the checkpoint of `state` (after step state.step - 1). before_complete: called on rank 0 once every file
    is written, before the folder is marked COMPLETE (the loop waits there for the metrics of the checkpoint's steps
    to be stored: a complete checkpoint never runs ahead of them); an error there leaves the folder incomplete."""
    final = rundir.checkpoint_dir(run.run_dir, state.step)
    tmp = rundir.partial_checkpoint_dir(run.run_dir, state.step)
    where = f"checkpoint {final.name}"
    if run.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(where)
    run.update.save(tmp)  # collective under DeepSpeed
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"step": state.step, "next_batch": state.next_batch, "queue": list(state.queue), "rng": rng},
               tmp / f"state_rank{run.rank}.pt")
    # ZeRO-3 shards every weight: all ranks take part in gathering them; rank 0 writes the full tensors and is the
    # only one to keep them
    full = full_weights(run.update.weights(), keep=run.rank == 0) if getattr(run.update, "zero_stage", 0) == 3 else None
    if run.rank == 0:
        run.policy.save_model(run.update.module, tmp / rundir.MODEL, full)
    barrier(where)  # every file is written
    sums = _checksums(tmp, run.rank, run.world_size, where)
    if sums is not None:  # rank 0
        if before_complete is not None:
            before_complete()
        rundir.write_complete(tmp, state.step, sums)  # the step and the sha256 of every file, written last
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in complete(run.run_dir)[:-KEEP]:
            shutil.rmtree(old)
    barrier(where)
    return final


def _checksums(folder: Path, rank: int, world_size: int, where: str) -> dict[str, str] | None:
    """On rank 0 the sha256 of every file of the checkpoint folder, None on the others. Each rank hashes the files
    it wrote (rundir.writer_rank) and rank 0 gathers them: the ranks wait for the slowest rank's own files (an
    8B model's ZeRO shards on 8 ranks: ~16 GB each), not for rank 0 to hash all of them (~130 GB). Rank 0 hashes
    any file its listing holds that no rank hashed, so that every file is listed whatever the shards' names."""
    names = rundir.checkpoint_files(folder)
    mine = rundir.checksums(folder, [n for n in names if rundir.writer_rank(n, world_size) == rank])
    parts = all_gather_objects(mine, f"{where} (the checksums of each rank's files)")
    if rank != 0:
        return None
    sums = {name: digest for part in parts for name, digest in part.items()}
    sums.update(rundir.checksums(folder, [n for n in names if n not in sums]))
    return sums


def restore(run, folder: Path) -> TrainState:
    """Load engine, weights, queue and RNG states; the rollout engine gets the restored weights."""
    run.update.load(folder)  # weights and optimizer
    saved = torch.load(folder / f"state_rank{run.rank}.pt", weights_only=False)
    random.setstate(saved["rng"]["python"])
    np.random.set_state(saved["rng"]["numpy"])
    torch.set_rng_state(saved["rng"]["torch"])
    run.rollout.sync_weights(run.update.weights())
    return TrainState(step=saved["step"], next_batch=saved["next_batch"],
                      queue=deque(_sampled(item) for item in saved["queue"]))


_SAMPLED_FIELDS = ("input_ids", "attention_mask", "mask", "prompt_width", "group_ids", "rewards", "engine_logp",
                   "texts", "version", "batch_index", "scores", "truncated", "generate_seconds",
                   "generated_batches", "filled_groups")


def _sampled(item: object) -> Sampled:
    """A queued batch as this version holds it. Checkpoints written before the batch and the trainer's log-probs
    were separate objects (up to a8ea15d) hold one RolloutBatch with the log-probs as optional attributes (unpickled
    into its __dict__); they become the same Sampled a run of this version would have queued."""
    if isinstance(item, Sampled):
        return item
    old = vars(item)
    batch = RolloutBatch(**{name: old[name] for name in _SAMPLED_FIELDS if name in old})
    trainer = None if old.get("old_logp") is None else TrainerLogp(old["old_logp"], old["raw_logp"],
                                                                    old.get("old_entropy"))
    return Sampled(batch, trainer, old.get("ref_logp"))


__all__ = ["KEEP", "TrainState", "complete", "latest", "restore", "save", "step_of"]
