"""rlvrlab.update.deepspeed_engine: DeepSpeed steps the optimizer itself at the end of its gradient accumulation;
a step() asked for before that end is an error, not a step that silently did nothing (until 2026-12-04
tests/services/memory_check.py measured such a non-step, and AdamW's states were never in its measure)."""

import pytest


def _engine(accumulation_steps: int):
    import torch

    from rlvrlab.update.deepspeed_engine import DeepSpeedEngine

    torch.manual_seed(0)
    module = torch.nn.Linear(4, 1)
    engine = DeepSpeedEngine(module, lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=1.0, zero_stage=0,
                             bf16=False, micro_batch_size=2, accumulation_steps=accumulation_steps, world_size=1)
    return engine, torch.randn(2, 4)


def test_step_before_the_end_of_the_accumulation_is_refused_and_after_it_steps():
    import torch

    engine, x = _engine(accumulation_steps=2)
    before = engine.module.weight.detach().clone()
    engine.backward(engine.module(x).sum())
    with pytest.raises(RuntimeError, match="accumulation of 2 micro-batches: the optimizer did not step"):
        engine.step()
    assert torch.equal(engine.module.weight, before)
    engine.backward(engine.module(x).sum())  # the second of two: DeepSpeed steps here
    norm = engine.step()
    assert norm > 0 and not torch.equal(engine.module.weight, before)
    with pytest.raises(RuntimeError):  # one step per accumulation, not two
        engine.step()
