"""The update-engine seam: backward, step, weights out, state in and out."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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


# Clipping as torch.nn.utils does it, without its Python layers. For one table (the toy tier) torch's clip_grad_norm_
# and get_total_norm spend about 2/3 of their time grouping, checking and entering no_grad (30 against 12 us a call
# alone, ~110 against ~50 us inside a training step, bench/README.md); the toy step calls them four times. Where the
# tensors share one device and dtype and are plain tensors on a device with foreach kernels (CPU, CUDA), these run
# torch's own ops in torch's order, so the floats are torch's (tests/update/test_clip.py compares them bit for bit);
# anything else goes to torch's functions.
_FOREACH_DEVICES = ("cpu", "cuda")


def _one_foreach_group(tensors: Sequence[torch.Tensor]) -> bool:
    first = tensors[0]
    return (first.device.type in _FOREACH_DEVICES and type(first) is torch.Tensor
            and all(type(t) is torch.Tensor and t.device == first.device and t.dtype == first.dtype for t in tensors))


def total_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.nn.utils.get_total_norm(tensors): the 2-norm of all their entries, the same float."""
    if not tensors or not _one_foreach_group(tensors):
        return torch.nn.utils.get_total_norm(tensors)
    with torch.no_grad():
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(tensors), 2.0)), 2.0)


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_(parameters, max_norm): the gradients' total 2-norm before clipping, and the
    gradients scaled in place by min(1, max_norm / (norm + 1e-6)); the same floats."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads or not _one_foreach_group(grads):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    norm = total_norm(grads)
    with torch.no_grad():
        torch._foreach_mul_(grads, torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0))
    return norm
