"""The update-engine seam: backward, step, weights out, state in and out."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch


class UpdateEngine(Protocol):
    module: torch.nn.Module  # the policy being trained (forward for log-probs)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of `loss` (already normalised by global counts: no further scaling)."""
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
