"""rlvrlab.update.base.clip_grad_norm_ / total_norm against torch.nn.utils' own functions, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from rlvrlab.update.base import clip_grad_norm_, total_norm


def _params(shapes, dtypes, seed: int, scale: float, missing: tuple[int, ...] = ()) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = []
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        p = torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype))
        if i not in missing:
            p.grad = (torch.randn(shape, generator=g) * scale).to(dtype)
        params.append(p)
    return params


CASES = {
    "one table": ([(64, 16)], [torch.float32], ()),
    "several": ([(7, 3), (11,), (2, 5, 4), (1,)], [torch.float32] * 4, ()),
    "some without a gradient": ([(7, 3), (11,), (4,)], [torch.float32] * 3, (1,)),
    "float64": ([(9, 9), (3,)], [torch.float64] * 2, ()),
    "mixed dtypes (torch's own path)": ([(5, 5), (6,)], [torch.float32, torch.bfloat16], ()),
}


@pytest.mark.parametrize("max_norm", [1.0, 0.01, 1e6, math.inf])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
@pytest.mark.parametrize("case", list(CASES))
def test_clip_and_total_norm_give_torchs_floats(case: str, scale: float, max_norm: float) -> None:
    shapes, dtypes, missing = CASES[case]
    for seed in range(5):
        ours, theirs = (_params(shapes, dtypes, seed, scale, missing) for _ in range(2))
        norm = clip_grad_norm_(ours, max_norm)
        expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        assert norm.dtype == expected.dtype and torch.equal(norm, expected)
        for a, b in zip(ours, theirs):
            assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
        weights = [p.detach() for p in ours]
        assert torch.equal(total_norm(weights), torch.nn.utils.get_total_norm(weights))


def test_non_finite_gradients_give_torchs_non_finite_norm() -> None:
    for bad in (math.nan, math.inf):
        ours, theirs = (_params([(4, 4), (3,)], [torch.float32] * 2, 0, 1.0) for _ in range(2))
        for params in (ours, theirs):
            params[1].grad[0] = bad
        norm, expected = clip_grad_norm_(ours, 1.0), torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        assert not math.isfinite(float(norm)) and torch.equal(norm.isnan(), expected.isnan())
        assert torch.equal(ours[0].grad.isnan(), theirs[0].grad.isnan())


def test_no_gradients_at_all() -> None:
    params = _params([(3,)], [torch.float32], 0, 1.0, missing=(0,))
    assert float(clip_grad_norm_(params, 1.0)) == 0.0 == float(torch.nn.utils.clip_grad_norm_(params, 1.0))
