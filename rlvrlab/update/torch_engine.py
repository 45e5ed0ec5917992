"""Plain torch AdamW: the toy tier's update engine, and the baseline DeepSpeed is benchmarked against."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import torch
from torch.optim import adam as _adam, optimizer as _optimizer  # modules (torch.optim's namespace drops them)

from rlvrlab.update.base import clip_grad_norm_


class TorchEngine:
    def __init__(self, module: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                 grad_clip: float):
        self.module = module
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
        self.grad_clip = grad_clip

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:  # noqa: ARG002 (step() ends the accumulation)
        loss.backward()

    def step(self) -> float:
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf  # inf: measure the norm, clip nothing
        norm = float(clip_grad_norm_(self.module.parameters(), max_norm))
        if math.isfinite(norm):  # a non-finite norm stops the run before these weights are touched
            adamw_step(self.optimizer)
        self.module.zero_grad(set_to_none=True)  # the optimizer's own params: the same, without its profiler scope
        return norm

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self.module.state_dict().items()

    def save(self, folder: Path) -> None:
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        torch.save(state, folder / "torch_engine.pt")

    def close(self) -> None:
        """Nothing to put back."""

    def load(self, folder: Path) -> None:
        state = torch.load(folder / "torch_engine.pt", weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


# AdamW.step() is torch's `adam` function called on the optimizer's state, inside three layers: a profiler scope with
# the step hooks, a grad-mode switch with two dynamo graph breaks, and dynamo's disable wrapper (whose first call
# imports torch._dynamo: ~0.85 s of CPU in each sweep worker here). On the toy tier, where the update is one table of
# 128 numbers, those layers are half of the optimizer step (~80 against ~30 us here, bench/README.md). Where none of
# them does anything (a plain AdamW: no hooks, no profiler, no compilation, not differentiable, capturable or fused),
# adamw_step makes the same call on the same state, so the floats and the state are torch's
# (tests/update/test_adamw_step.py compares them bit for bit with optimizer.step()); anything else goes to step().
_ADAM = getattr(_adam.adam, "__wrapped__", None)  # torch's functional adam, without dynamo's wrapper


def plain_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """True when adamw_step takes the direct path for this optimizer (False: it calls optimizer.step())."""
    return (_ADAM is not None and type(optimizer) is torch.optim.AdamW and hasattr(optimizer, "_init_group")
            and not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
            and not _optimizer._global_optimizer_pre_hooks and not _optimizer._global_optimizer_post_hooks
            and getattr(optimizer, "grad_scale", None) is None and getattr(optimizer, "found_inf", None) is None
            and not torch.autograd._profiler_enabled() and not torch.compiler.is_compiling()
            and all(not g["differentiable"] and not g["capturable"] and not g["fused"]
                    for g in optimizer.param_groups))


def adamw_step(optimizer: torch.optim.Optimizer) -> None:
    """optimizer.step() (no closure): for a plain torch AdamW, torch's own update without the layers around it."""
    if not plain_adamw(optimizer):
        optimizer.step()
        return
    with torch.no_grad():  # what step() runs it under (grad mode = the group's `differentiable`, False here)
        for group in optimizer.param_groups:  # AdamW.step's loop (torch/optim/adam.py), argument for argument
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
            has_complex = optimizer._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps)
            beta1, beta2 = group["betas"]
            _ADAM(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad=group["amsgrad"],
                  has_complex=has_complex, beta1=beta1, beta2=beta2, lr=group["lr"],
                  weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
                  foreach=group["foreach"], capturable=group["capturable"], differentiable=group["differentiable"],
                  fused=group["fused"], grad_scale=None, found_inf=None,
                  decoupled_weight_decay=group["decoupled_weight_decay"])
