"""The rollout-engine seam: what the training loop needs from a sampler, nothing more."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Generation:
    """One sampled response.

    response_ids ends with the eos token when the model stopped by itself (that token is trained on);
    it is cut at max_new_tokens otherwise. logp[i] is the engine's log-probability of response_ids[i]
    under the raw (temperature-1, unfiltered) distribution of the weights that sampled it.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    text: str  # the decoded response, special tokens removed
    logp: tuple[float, ...]  # len == len(response_ids)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], *, n: int, seed: int) -> list[list[Generation]]:
        """n responses for each tokenised prompt: result[p][j]. Same seed and weights -> same samples."""
        ...

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the trainer's (names as in the HF model's state_dict)."""
        ...

    def sleep(self, *, keep_weights: bool = True) -> None:
        """Give the accelerator memory back while the trainer updates (vLLM on GPU); a no-op where it is not
        needed. The next sync_weights or generate wakes the engine. keep_weights=False: the caller rewrites every
        weight with sync_weights before the next generate, so the engine may drop its weights instead of keeping
        a copy."""
        ...

    def close(self) -> None:
        """Free the engine's memory (and its worker processes, if any)."""
        ...
