"""rlvrlab.update.torch_engine.adamw_step against torch's own AdamW.step(), bit for bit, and the cases where it must
hand over to step()."""

from __future__ import annotations

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from rlvrlab.update.torch_engine import TorchEngine, adamw_step, plain_adamw

OPTIONS = {
    "defaults": {},
    "the toy tier's": {"lr": 0.05, "weight_decay": 0.0, "betas": (0.9, 0.999)},
    "weight decay": {"lr": 1e-2, "weight_decay": 0.1},
    "amsgrad": {"lr": 1e-2, "amsgrad": True},
    "maximize": {"lr": 1e-3, "maximize": True},
    "foreach": {"lr": 1e-2, "foreach": True, "weight_decay": 0.01},
    "single tensor": {"lr": 1e-2, "foreach": False, "weight_decay": 0.01},
    "tensor lr": {"lr": torch.tensor(1e-2), "foreach": False},
}


def _params(seed: int, dtype: torch.dtype) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g, dtype=dtype)) for shape in [(8, 16), (5,), (3, 2, 4)]]


def _run(step, seed: int, dtype: torch.dtype, options: dict, groups: bool) -> tuple[list, dict]:
    params = _params(seed, dtype)
    if groups:  # two groups with their own learning rates
        optimizer = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "lr": 3e-3}], **options)
    else:
        optimizer = torch.optim.AdamW(params, **options)
    g = torch.Generator().manual_seed(seed + 1000)
    for i in range(12):
        for j, p in enumerate(params):
            # some steps leave a parameter without a gradient (its state starts later / is not stepped)
            p.grad = None if (i + j) % 5 == 4 else torch.randn(p.shape, generator=g, dtype=dtype) * 10 ** (i % 3 - 1)
        step(optimizer)
    return [p.detach().clone() for p in params], optimizer.state_dict()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("groups", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_adamw_step_gives_torchs_weights_and_state(name: str, dtype: torch.dtype, groups: bool) -> None:
    options = OPTIONS[name]
    for seed in range(3):
        ours = _run(adamw_step, seed, dtype, options, groups)
        theirs = _run(lambda optimizer: optimizer.step(), seed, dtype, options, groups)
        assert _same(ours, theirs), (name, dtype, groups, seed)


def test_the_engines_optimizer_takes_the_direct_path() -> None:
    """Guards the speed-up itself: a torch upgrade that renames what adamw_step calls sends it to step() (still
    correct), and this test says so."""
    engine = TorchEngine(torch.nn.Linear(4, 3), lr=0.05, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=1.0)
    assert plain_adamw(engine.optimizer)


def test_hooks_profiler_and_other_optimizers_go_through_step() -> None:
    params = _params(0, torch.float32)
    optimizer = torch.optim.AdamW(params)
    called = []
    handle = optimizer.register_step_post_hook(lambda *args: called.append(1))
    assert not plain_adamw(optimizer)
    for p in params:
        p.grad = torch.ones_like(p)
    adamw_step(optimizer)
    assert called == [1]  # the hook ran: step() took it
    handle.remove()
    assert plain_adamw(optimizer)
    with torch.autograd.profiler.profile():
        assert not plain_adamw(optimizer)
    assert not plain_adamw(torch.optim.Adam(params))  # Adam is not AdamW: its own step()
    assert not plain_adamw(torch.optim.AdamW(params, differentiable=True))
    handle = register_optimizer_step_pre_hook(lambda *args: None)
    try:
        assert not plain_adamw(optimizer)
    finally:
        handle.remove()
