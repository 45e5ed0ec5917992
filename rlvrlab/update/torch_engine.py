"""Plain torch AdamW: the toy tier's update engine, and the baseline DeepSpeed is benchmarked against."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import torch

from rlvrlab.update.base import total_norm


class TorchEngine:
    def __init__(self, module: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                 grad_clip: float):
        self.module = module
        self.parameters = list(module.parameters())
        # torch's default implementation: the single-tensor update on CPU (half the CPU time of the multi-tensor one
        # for the toy tier's one table), the multi-tensor one on CUDA; both give the same floats
        # (tests/update/test_torch_engine.py). fused=True is ~2.7x faster on the tiny tier but rounds differently,
        # and one last bit can send a run's samples elsewhere (bench/README.md, "Update engines and MLflow logging").
        self.optimizer = torch.optim.AdamW(self.parameters, lr=lr, weight_decay=weight_decay, betas=betas)
        self.grad_clip = grad_clip

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:  # noqa: ARG002 (step() ends the accumulation)
        loss.backward()

    def step(self) -> float:
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf  # inf: measure the norm, clip nothing
        # torch's default foreach=None takes the foreach kernels for CPU and CUDA tensors and loops per tensor on
        # other devices, where foreach=True would raise
        norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, max_norm))
        if math.isfinite(norm):  # a non-finite norm stops the run before these weights are touched
            self.optimizer.step()
        self.module.zero_grad(set_to_none=True)
        return norm

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self.module.state_dict().items()

    def weight_norm(self) -> float:
        return float(total_norm([p.detach() for p in self.parameters]))

    def save(self, folder: Path) -> None:
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        torch.save(state, folder / "torch_engine.pt")

    def close(self) -> None:
        """Nothing to put back."""

    def load(self, folder: Path) -> None:
        state = torch.load(folder / "torch_engine.pt", weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
