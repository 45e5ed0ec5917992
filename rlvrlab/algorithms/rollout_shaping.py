"""DAPO's rollout-side components (Yu et al. 2025, arXiv 2503.14476, §3.2 and §3.4) and the correction for the
mismatch between the rollout engine's and the trainer's probabilities (truncated importance sampling), each as
verl computes it (docs/references.md; tests/vectors/verl_dapo_*.json and verl_rollout_correction.json hold the
outputs of verl's own functions).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .masked import masked_mean, masked_sum

SAFETY_BOUND = 20.0  # verl clamps log-ratios to [-20, 20] before exp


def overlong_penalty(lengths: torch.Tensor, *, max_len: int, buffer_len: int, factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13), as verl's DAPO reward manager adds it to the score:
    min(-(len - (max_len - buffer_len)) / buffer_len * factor, 0). [B] lengths -> [B] penalties (<= 0).

    Responses are cut at max_len, so the penalty reaches -factor at most; verl applies no lower cap itself."""
    exceed = lengths.to(torch.float32) - (max_len - buffer_len)
    return torch.clamp(-exceed / buffer_len * factor, max=0.0)


def groups_with_signal(group_ids: Sequence[Hashable], values: np.ndarray) -> list[Hashable]:
    """DAPO's dynamic-sampling filter (verl's recipe, `RayDAPOTrainer.fit`): the groups whose metric values are not
    all equal (np.std with ddof 0 > 0, in the values' own dtype), plus groups of one response; in order of first
    appearance."""
    by_group: dict[Hashable, list] = {}
    for gid, value in zip(group_ids, values):
        by_group.setdefault(gid, []).append(value)
    return [gid for gid, vals in by_group.items()
            if np.std(np.asarray(vals, dtype=np.asarray(values).dtype)) > 0 or len(vals) == 1]


@dataclass(frozen=True)
class CorrectionStats:
    """Of one batch's truncated importance weights (before truncation where named raw)."""

    weight_mean: float  # mean of the truncated weights over response tokens
    truncated_frac: float  # share of response tokens (token level) or sequences (sequence level) whose raw weight > cap


def rollout_correction_weights(log_ratio: torch.Tensor, mask: torch.Tensor, *, level: str, cap: float,
                               normalize: bool = False) -> tuple[torch.Tensor, CorrectionStats]:
    """Truncated importance weights min(pi_trainer / pi_rollout, cap) (verl's `compute_rollout_correction_weights`
    with a single threshold): per token (level "token"), or one weight per sequence from the sum of its token
    log-ratios (level "sequence"); normalize: divided by their mean (token level: over tokens; sequence level: over
    non-empty sequences), as verl's rollout_is_batch_normalize. log_ratio = log pi_trainer - log pi_rollout
    [B, T]; returns detached [B, T] weights (0 on padding) and their statistics (before normalisation)."""
    mask = mask.to(log_ratio.dtype)
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    elif level == "sequence":
        seq = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(seq, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    else:
        raise ValueError(f"level must be token or sequence, got {level!r}")
    raw = raw * mask
    weights = raw.clamp(max=cap).detach()
    over = (raw > cap).to(mask.dtype)
    if level == "sequence":
        rows = mask.sum(-1) > 0
        truncated = float(over[:, 0][rows].mean()) if bool(rows.any()) else 0.0
    else:
        truncated = float(masked_mean(over, mask)) if bool(mask.any()) else 0.0
    mean = float(masked_mean(weights, mask)) if bool(mask.any()) else 1.0
    if normalize:
        if level == "token":
            norm = (weights * mask).sum() / (mask.sum() + 1e-8)
        else:
            per_row = (weights * mask).sum(-1) / (mask.sum(-1) + 1e-8)
            rows = (mask.sum(-1) > 0).to(weights.dtype)
            norm = (per_row * rows).sum() / rows.sum().clamp(min=1e-8)
        if norm > 1e-8:
            weights = weights / norm
    return weights, CorrectionStats(weight_mean=mean, truncated_frac=truncated)


def mismatch_kl(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(k3, k1) estimates of KL(pi_rollout || pi_trainer) per response token from the rollout's own samples
    (Schulman 2020): k1 = log pi_rollout - log pi_trainer, k3 = (r - 1) - log r with r = pi_trainer / pi_rollout."""
    if not bool(mask.bool().any()):
        return 0.0, 0.0
    log_r = torch.clamp(trainer_logp - rollout_logp, -SAFETY_BOUND, SAFETY_BOUND).to(torch.float64)
    m = mask.to(torch.float64)
    k3 = masked_mean(torch.expm1(log_r) - log_r, m)
    k1 = masked_mean(-log_r, m)
    return float(k3), float(k1)
