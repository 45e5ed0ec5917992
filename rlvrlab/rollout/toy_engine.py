"""Rollout engine of the toy tier: samples one response index per row from its own copy of the table."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlvrlab.data.toy import response_text
from rlvrlab.rollout.base import Generation


class ToyEngine:
    def __init__(self, logits: torch.Tensor, *, temperature: float, top_p: float):
        self.logits = logits.detach().clone()  # [P, M]; updated only through sync_weights, like a real engine
        self.temperature = temperature
        self.top_p = top_p

    def generate(self, prompts: list[list[int]], *, n: int, seed: int) -> list[list[Generation]]:
        generator = torch.Generator().manual_seed(seed)
        rows = self.logits[[prompt[0] for prompt in prompts]].double()  # [K, M]: the prompts' rows, one op each
        raw = torch.log_softmax(rows, dim=-1).tolist()
        probs = torch.softmax(rows if self.temperature == 1.0 else rows / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = torch.stack([_nucleus(row_probs, self.top_p) for row_probs in probs])
        # [K, n]: one call draws row after row from the generator, the same draws as one call per prompt in prompt
        # order (tests/rollout/test_toy_engine.py)
        picks = torch.multinomial(probs, n, replacement=True, generator=generator).tolist()
        return [[Generation(tuple(prompt), (j,), response_text(j), (raw_list[j],)) for j in row]
                for prompt, row, raw_list in zip(prompts, picks, raw)]

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.logits = dict(named_tensors)["logits"].detach().clone()

    def sleep(self, *, keep_weights: bool = True) -> None:
        pass  # shares memory with nothing worth freeing

    def close(self) -> None:
        pass


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely responses whose mass reaches top_p, renormalised."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    keep = sorted_probs.cumsum(0) - sorted_probs < top_p  # the first response is always kept
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_probs[keep]
    return filtered / filtered.sum()
