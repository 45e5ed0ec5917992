"""rlvrlab.update.deepspeed_engine: DeepSpeed steps the optimizer itself where the caller ends its gradient
accumulation (backward(last=True), DeepSpeed's set_gradient_accumulation_boundary); a step() asked for before that
end is an error, not a step that silently did nothing (until 2026-12-04 tests/services/memory_check.py measured such
a non-step, and AdamW's states were never in its measure). A step may hold any number of micro-batches
(trainer.micro_batch_tokens packs rows by length), whatever accumulation DeepSpeed was configured with."""

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
    engine.backward(engine.module(x).sum(), last=False)
    with pytest.raises(RuntimeError, match="before a backward\\(last=True\\).*did not step"):
        engine.step()
    assert torch.equal(engine.module.weight, before)
    engine.backward(engine.module(x).sum(), last=True)  # DeepSpeed steps here
    norm = engine.step()
    assert norm > 0 and not torch.equal(engine.module.weight, before)
    with pytest.raises(RuntimeError):  # one step per accumulation, not two
        engine.step()


@pytest.mark.parametrize("micro_batches", [1, 3, 5])
def test_any_number_of_micro_batches_makes_the_step_plain_adamw_makes(micro_batches):
    """Configured for 2 micro-batches, DeepSpeed accumulates 1, 3 or 5 and steps once, as torch's AdamW does over
    the same summed gradient; then a second step of another count, with the AdamW states carried."""
    import torch

    from rlvrlab.update.torch_engine import TorchEngine

    engine, _ = _engine(accumulation_steps=2)
    torch.manual_seed(0)
    plain = TorchEngine(torch.nn.Linear(4, 1), lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=1.0)
    assert torch.equal(plain.module.weight, engine.module.weight)
    data = torch.randn(micro_batches + 2, 3, 4, generator=torch.Generator().manual_seed(1))
    for chunk in (data[:micro_batches], data[micro_batches:]):
        norms = []
        for side in (engine, plain):
            for i, x in enumerate(chunk):
                side.backward((side.module(x) ** 2).sum(), last=i == len(chunk) - 1)
            norms.append(side.step())
        assert norms[0] == pytest.approx(norms[1], rel=1e-6)
        torch.testing.assert_close(engine.module.weight, plain.module.weight, atol=1e-7, rtol=0)
        torch.testing.assert_close(engine.module.bias, plain.module.bias, atol=1e-7, rtol=0)


@pytest.mark.parametrize("stage", [0, 2, 3])  # ZeRO-1: tests/update/test_deepspeed_options.py trains a step
def test_fp32_accumulation_of_a_bf16_model_is_refused_exactly_where_deepspeed_refuses_it(stage):
    """DeepSpeed 0.19.8 builds no optimizer for a bf16 model that accumulates fp32 gradients without ZeRO
    (NotImplementedError in _do_optimizer_sanity_check); rlvrlab.config.rules refuses that configuration at
    composition, in one line, and no other stage."""
    import torch

    from rlvrlab.config import compose
    from rlvrlab.errors import ConfigError
    from rlvrlab.update.deepspeed_engine import DeepSpeedEngine

    refused = None
    try:
        compose(None, [f"trainer.zero_stage={stage}", "model.dtype=bfloat16", "trainer.grad_accum_fp32=true"])
    except ConfigError as error:
        refused = str(error)
    try:
        engine = DeepSpeedEngine(torch.nn.Linear(4, 1), lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=1.0,
                                 zero_stage=stage, bf16=True, micro_batch_size=2, accumulation_steps=2, world_size=1,
                                 grad_accum_fp32=True)
    except NotImplementedError:
        deepspeed_refuses = True
    else:
        deepspeed_refuses = False
        assert engine.engine.get_data_types() == (torch.bfloat16, torch.float32)
        engine.close()
    assert deepspeed_refuses == (stage == 0)
    assert (refused is not None) == deepspeed_refuses
    if refused is not None:
        assert "trainer.zero_stage" in refused and "trainer.grad_accum_fp32=false" in refused and "\n" not in refused
