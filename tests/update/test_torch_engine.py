"""rlvrlab.update.torch_engine.TorchEngine: its step is gradient clipping as the norm formula says, then torch's
AdamW, to the bit the single-tensor update the toy tier ran before (results reproduce across that change)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvrlab.update.base import total_norm
from rlvrlab.update.torch_engine import TorchEngine

SHAPES = [(8, 16), (5,), (3, 2, 4)]


class Params(torch.nn.Module):
    def __init__(self, seed: int, dtype: torch.dtype):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.tensors = torch.nn.ParameterList(torch.randn(shape, generator=g, dtype=dtype) for shape in SHAPES)


def _grads(step: int, seed: int, dtype: torch.dtype) -> list[torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed * 1000 + step)
    # gradients of several scales, and some steps leave a parameter without one (its state starts later)
    return [None if (step + j) % 5 == 4 else torch.randn(shape, generator=g, dtype=dtype) * 10 ** (step % 3 - 1)
            for j, shape in enumerate(SHAPES)]


def _clip_by_hand(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """The 2-norm of all gradients (per-tensor norms, then the norm of those), each scaled by
    min(1, max_norm / (norm + 1e-6)): clip_grad_norm_'s definition, one tensor at a time."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    for g in grads:
        g.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return float(norm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad_clip, weight_decay", [(1.0, 0.0), (0.05, 0.1), (0.0, 0.01)])
def test_a_step_is_the_hand_clipped_single_tensor_adamw_to_the_bit(dtype, grad_clip: float,
                                                                   weight_decay: float) -> None:
    """Weights, optimizer state and returned norms of 12 engine steps equal, bit for bit, clipping by hand followed
    by AdamW's single-tensor update (foreach=False; torch's default on CPU, which the engine takes)."""
    lr, betas = 0.05, (0.9, 0.999)
    for seed in range(2):
        ours, theirs = Params(seed, dtype), Params(seed, dtype)
        engine = TorchEngine(ours, lr=lr, weight_decay=weight_decay, betas=betas, grad_clip=grad_clip)
        reference = torch.optim.AdamW(theirs.parameters(), lr=lr, weight_decay=weight_decay, betas=betas, foreach=False)
        for step in range(12):
            for module in (ours, theirs):
                for p, g in zip(module.parameters(), _grads(step, seed, dtype)):
                    p.grad = None if g is None else g.clone()
            norm = engine.step()
            expected = _clip_by_hand(list(theirs.parameters()), grad_clip if grad_clip > 0 else math.inf)
            reference.step()
            reference.zero_grad(set_to_none=True)
            assert norm == expected, (seed, step)
            assert all(p.grad is None for p in ours.parameters())
        for a, b in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(a, b), (seed, dtype)
        ours_state, theirs_state = engine.optimizer.state_dict()["state"], reference.state_dict()["state"]
        assert ours_state.keys() == theirs_state.keys()
        for key in ours_state:
            for name, value in ours_state[key].items():
                assert torch.equal(value, theirs_state[key][name]), (key, name)


def test_clipping_scales_the_gradients_by_the_norm_formula() -> None:
    """Gradients 3 and 4 (norm 5) clipped to 1 become 3 and 4 times 1 / (5 + 1e-6); the norm before is returned."""
    module = torch.nn.Linear(1, 1, bias=False).double()
    module.weight.grad = torch.tensor([[3.0]], dtype=torch.float64)
    extra = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    extra.grad = torch.tensor([4.0], dtype=torch.float64)
    module.register_parameter("extra", extra)
    engine = TorchEngine(module, lr=0.0, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=1.0)
    grads: list[torch.Tensor] = []
    engine.optimizer.register_step_pre_hook(
        lambda *args: grads.extend(p.grad.clone() for p in module.parameters() if p.grad is not None))
    assert engine.step() == 5.0
    scale = 1.0 / (5.0 + 1e-6)
    assert [g.item() for g in grads] == pytest.approx([3.0 * scale, 4.0 * scale], rel=1e-15)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_norm_leaves_the_weights_and_state_untouched(bad: float) -> None:
    module = Params(0, torch.float32)
    engine = TorchEngine(module, lr=0.05, weight_decay=0.1, betas=(0.9, 0.999), grad_clip=1.0)
    before = [p.detach().clone() for p in module.parameters()]
    for p, g in zip(module.parameters(), _grads(0, 0, torch.float32)):
        p.grad = g
    next(iter(module.parameters())).grad[0, 0] = bad  # type: ignore[index]
    assert not math.isfinite(engine.step())
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), before))
    assert engine.optimizer.state_dict()["state"] == {} and all(p.grad is None for p in module.parameters())


def test_total_norm_is_the_norm_of_all_entries_together() -> None:
    tensors = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0], [12.0]])]
    assert float(total_norm(tensors)) == 13.0
