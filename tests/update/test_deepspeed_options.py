"""DeepSpeed options of rlvrlab.update.deepspeed_engine on the CPU: optimizer offload and fp32 gradient
accumulation reach DeepSpeed's config and train a step."""

import math

import pytest

from rlvrlab.config import compose
from rlvrlab.train.loop import TrainState, train_step
from rlvrlab.train.setup import build

pytestmark = pytest.mark.slow

# the entropy bonus gives a gradient even when every reward of the batch is equal
SMALL = ("steps=1", "trainer.checkpoint_every=0", "rollout.prompts_per_step=4", "rollout.group_size=4",
         "algorithm.entropy_coef=0.01")


@pytest.mark.parametrize("options", [
    ("trainer.zero_stage=2", "trainer.offload_optimizer=true"),
    ("trainer.zero_stage=1", "model.dtype=bfloat16", "trainer.grad_accum_fp32=true"),
])
def test_an_option_reaches_deepspeed_and_a_step_trains(tmp_path, options):
    import torch

    cfg = compose(None, [*SMALL, *options, f"output_dir={tmp_path}"])
    run = build(cfg)
    try:
        engine = run.update.engine  # type: ignore[attr-defined]
        if cfg.trainer.offload_optimizer:
            assert engine.zero_cpu_offload()  # (on this CPU-only machine every state is in CPU memory anyway)
        if cfg.trainer.grad_accum_fp32:
            assert engine.get_data_types() == (torch.bfloat16, torch.float32)
        stats, _ = train_step(run, TrainState(), 0)
        assert math.isfinite(stats.grad_norm) and stats.grad_norm > 0
    finally:
        run.tracker.finish("FINISHED")
        run.rollout.close()
        run.verifier.close()
