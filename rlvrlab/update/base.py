"""The update-engine seam: backward, step, weights out, state in and out."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch


class UpdateEngine(Protocol):
    module: torch.nn.Module  # the policy being trained (forward for log-probs)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Accumulate gradients of `loss` (already normalised by global counts: no further scaling); last: this
        micro-batch ends the accumulation that the next step() applies (the number of micro-batches per step may
        vary: trainer.micro_batch_tokens)."""
        ...

    def step(self) -> float:
        """Clip and apply the accumulated gradients; returns the global gradient norm before clipping."""
        ...

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The full, unsharded weights under the HF state_dict names (what the rollout engine loads)."""
        ...

    def weight_norm(self) -> float:
        """The 2-norm of the trained weights, all of them together, as the optimizer left them (under ZeRO-3 every
        rank's partition: every rank must call it); the run stops on a non-finite one (rlvrlab.train.optimize)."""
        ...

    def save(self, folder: Path) -> None:
        """Weights and optimizer state, in the engine's own format (the checkpoint also writes safetensors)."""
        ...

    def load(self, folder: Path) -> None:
        ...

    def close(self) -> None:
        """Put back what the engine changed outside itself; the run calls it once, at its end (passed or failed)."""
        ...


def clipped_norm(norm: float, max_norm: float) -> float:
    """The gradient norm after clipping to max_norm (<= 0: no clipping), as torch's clip_grad_norm_ and DeepSpeed's
    gradient_clipping scale it: by max_norm / (norm + 1e-6) when that is below 1."""
    if max_norm <= 0 or not math.isfinite(norm):
        return norm
    return norm * min(1.0, max_norm / (norm + 1e-6))


def full_weights(weights: Iterable[tuple[str, torch.Tensor]], *, keep: bool) -> dict[str, torch.Tensor] | None:
    """`weights` (an engine's weights()) drawn to the end, as CPU tensors where `keep` (the rank that writes them),
    else None. Every rank must call it: under ZeRO-3 each entry is a gather all ranks take part in. A rank that does
    not keep them drops each gathered tensor before the next is gathered, so it holds one parameter's full copy at a
    time, not the whole model's (host memory: 16.4 GB per rank for an 8B model in bf16)."""
    kept: dict[str, torch.Tensor] | None = {} if keep else None
    for name, tensor in weights:
        if kept is not None:
            kept[name] = tensor.cpu()
        del tensor  # released before the generator gathers the next one
    return kept


def total_norm(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all entries of `tensors` together (torch.nn.utils.get_total_norm: the foreach kernels on CPU and
    CUDA)."""
    return torch.nn.utils.get_total_norm(tensors)
