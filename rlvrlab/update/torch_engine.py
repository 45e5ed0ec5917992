"""Plain torch AdamW: the toy tier's update engine, and the baseline DeepSpeed is benchmarked against."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import torch


class TorchEngine:
    def __init__(self, module: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                 grad_clip: float):
        self.module = module
        # foreach=True: torch's multi-tensor update, the same floats as its single-tensor one (torch's default on
        # CPU) on every tier, so results reproduce to the bit across the change that made this the only path
        # (tests/update/test_torch_engine.py); fused=True is faster still but rounds differently, and a run is a
        # chain of samples that one last bit can send elsewhere. Timings: bench/README.md, "Update engines".
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, betas=betas,
                                           foreach=True)
        self.grad_clip = grad_clip

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:  # noqa: ARG002 (step() ends the accumulation)
        loss.backward()

    def step(self) -> float:
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf  # inf: measure the norm, clip nothing
        # torch's default foreach=None takes the foreach kernels for CPU and CUDA tensors and loops per tensor on
        # other devices, where foreach=True would raise
        norm = float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm))
        if math.isfinite(norm):  # a non-finite norm stops the run before these weights are touched
            self.optimizer.step()
        self.module.zero_grad(set_to_none=True)
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
