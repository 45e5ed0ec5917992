"""A toy DAPO run (DeepSpeed, 2 ranks on gloo) whose ranks need different numbers of generate batches and whose
checkpoint files are slow to hash, under a short collective timeout.

    torchrun --nproc_per_node 2 tests/services/collective_check.py OUT_DIR BLANK SLOW [override ...]

BLANK: on rank 1, the first BLANK batches of every generate() lose their signal (every group's scores and rewards
set to 0, so dynamic sampling sets them all aside): rank 1 needs more than BLANK batches, rank 0 usually fewer.
SLOW: "step:seconds:ranks" items joined by "/", e.g. "2:16:0,1/3:30:0": in the checkpoint of that step, hashing the
state_rank<r>.pt file of each listed rank takes that many seconds (a stand-in for a rank's ~16 GB of ZeRO shards),
whichever rank hashes it.
The overrides set trainer.dist_timeout_minutes, steps and checkpoint_every; the run goes to OUT_DIR/runs. After each
step each rank writes OUT_DIR/rank<r>.json: per step the batches it sampled (rollout/generated_batches), the batches
it needed on its own (the first count at which its groups with signal filled its prompts) and its filled groups;
and the timeout of every process group.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from rlvrlab import rundir
from rlvrlab.algorithms import groups_with_signal
from rlvrlab.config import compose
from rlvrlab.train import loop, rollouts


def main(out: str, blank: int, slow: dict[tuple[int, int], float], overrides: list[str]) -> None:
    cfg = compose("toy", [f"output_dir={Path(out) / 'runs'}", "trainer.engine=deepspeed", "algorithm=dapo",
                          *overrides])  # one output_dir for both ranks: they write one checkpoint folder
    sampled: list[list[int]] = []  # per generate(): the number of groups with signal of each batch it sampled

    hash_file = rundir.file_sha256

    def slow_hash(path: Path) -> str:
        if path.name.startswith("state_rank"):  # in checkpoints/.tmp_step_NNNNNN/
            step = int(path.parent.name.removeprefix(".tmp_step_"))
            time.sleep(slow.get((step, int(path.stem.removeprefix("state_rank"))), 0.0))
        return hash_file(path)

    generate, sample_groups = rollouts.generate, rollouts._sample_groups

    def counted_generate(run, state, **kwargs):
        sampled.append([])
        return generate(run, state, **kwargs)

    def blanked_groups(run, batch_index, timings):
        groups = sample_groups(run, batch_index, timings)
        if run.rank == 1 and len(sampled[-1]) < blank:
            for g in groups:
                g.scores, g.rewards = [0.0] * len(g.scores), [0.0] * len(g.rewards)
        scores = np.asarray([s for g in groups for s in g.scores], dtype=np.float64)
        sampled[-1].append(len(groups_with_signal([i for i, g in enumerate(groups) for _ in g.scores], scores)))
        return groups

    rundir.file_sha256 = slow_hash
    loop.generate, rollouts._sample_groups = counted_generate, blanked_groups
    steps: list[dict] = []
    groups_timeouts: list[float] = []

    def on_step(step, batch, run, stats):
        quota = cfg.rollout.prompts_per_step // run.world_size
        own = next((i + 1 for i in range(len(sampled[-1])) if sum(sampled[-1][:i + 1]) >= quota), None)
        steps.append({"generated_batches": batch.generated_batches, "own_need": own,
                      "filled_groups": batch.filled_groups, "rows": len(batch)})
        if not groups_timeouts:
            for group in dist.distributed_c10d._world.pg_map:
                backend = group._get_backend(torch.device("cpu"))
                groups_timeouts.append(backend.options._timeout.total_seconds())
        Path(out, f"rank{run.rank}.json").write_text(json.dumps({"steps": steps, "group_timeouts_s": groups_timeouts}))

    loop.train(cfg, on_step=on_step)


def _slow(spec: str) -> dict[tuple[int, int], float]:
    """The SLOW argument as {(step, rank): seconds}: "2:16:0,1/3:30:0" -> {(2, 0): 16, (2, 1): 16, (3, 0): 30}."""
    out = {}
    for item in filter(None, spec.split("/")):
        step, seconds, ranks = item.split(":")
        out.update({(int(step), int(r)): float(seconds) for r in ranks.split(",")})
    return out


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), _slow(sys.argv[3]), sys.argv[4:])
