"""Loss aggregation: [B, T] per-token losses -> scalar (verl's ``agg_loss``, current semantics).

With micro-batching or data parallelism, pass the *global* counts (valid tokens, non-empty sequences,
rows) of the whole optimiser batch: each micro-batch then contributes its exact share and the summed
gradient equals that of one big batch (1 x 8 accumulation == 8 x 1). ``dp_size`` undoes the gradient
averaging of data-parallel engines (DeepSpeed/DDP average gradients over ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .masked import masked_sum


@dataclass(frozen=True)
class Aggregation:
    mode: str = "token-mean"
    num_tokens: float | None = None  # valid tokens in the global batch (default: this micro-batch's)
    num_seqs: float | None = None  # non-empty sequences in the global batch (default: local)
    num_rows: float | None = None  # all rows, empty ones included (GMPO's denominator; default: local)
    dp_size: int = 1
    loss_scale_factor: float | None = None  # Dr. GRPO's constant L (default: padded width T)

    def __call__(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return AGGREGATIONS[self.mode](per_token, mask, self)


def _num_seqs(mask: torch.Tensor, agg: Aggregation) -> torch.Tensor | float:
    return agg.num_seqs if agg.num_seqs is not None else (mask.sum(-1) > 0).sum().clamp(min=1)


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, agg: Aggregation) -> torch.Tensor:
    """DAPO token-level: sum over all valid tokens / number of valid tokens."""
    num_tokens = agg.num_tokens if agg.num_tokens is not None else mask.sum().clamp(min=1)
    return masked_sum(per_token, mask) / num_tokens * agg.dp_size


def token_sum(per_token: torch.Tensor, mask: torch.Tensor, agg: Aggregation) -> torch.Tensor:
    """Sum over all valid tokens (verl's token-sum; grows with batch and length)."""
    return masked_sum(per_token, mask) * agg.dp_size


def seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, agg: Aggregation) -> torch.Tensor:
    """Mean over non-empty sequences of each sequence's token sum."""
    return masked_sum(per_token, mask) / _num_seqs(mask, agg) * agg.dp_size


def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, agg: Aggregation) -> torch.Tensor:
    """Original GRPO: mean over non-empty sequences of each sequence's token mean."""
    lengths = mask.sum(-1)  # [B]
    seq_means = masked_sum(per_token, mask, dim=-1) / (lengths + 1e-8)  # [B]; empty rows give 0
    return seq_means.sum() / _num_seqs(mask, agg) * agg.dp_size


def seq_mean_token_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, agg: Aggregation) -> torch.Tensor:
    """Dr. GRPO: seq-mean of token sums divided by a constant L (set loss_scale_factor to fix it)."""
    scale = agg.loss_scale_factor if agg.loss_scale_factor is not None else mask.shape[-1]
    return seq_mean_token_sum(per_token, mask, agg) / scale


AGGREGATIONS = {
    "token-mean": token_mean,
    "token-sum": token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
