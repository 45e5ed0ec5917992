"""Typed statistics of one training step. Names for the tracker are made in rlvrlab.train.metrics only."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from rlvrlab.algorithms import CorrectSetStats, LossStats
from rlvrlab.policy.toy import ToyDiagnostics


@dataclass
class Timings:
    """Wall-clock seconds spent in each stage of one step (rank 0's view)."""

    generate: float = 0.0
    verify: float = 0.0
    logp: float = 0.0  # behaviour / reference log-probs at generation time
    update: float = 0.0
    sync: float = 0.0
    step: float = 0.0


@dataclass
class StepStats:
    reward: float  # mean reward of the consumed batch
    accuracy: float  # share of responses with reward > 0
    solved_groups: float  # share of prompts with at least one correct response
    signal_groups: float  # share of prompts whose rewards are not all equal (they carry a gradient)
    response_length: float  # mean response tokens
    policy_loss: float  # mean over micro-batch losses (policy term only)
    kl_ref: float | None  # mean k3 KL to the reference policy, when a reference is used
    entropy: float  # mean token entropy of the current policy on the batch
    grad_norm: float  # mean over the step's optimizer steps, before clipping
    grad_norm_clipped: float  # the same after clipping to trainer.grad_clip (what the optimizer applied)
    loss: LossStats  # averaged over micro-batches (ratio_max: max)
    correct_entropy: float | None  # UCPO's H(q) over correct sets with >= 2 members, group mean
    correct_max_q: float | None
    lag: int  # optimizer-step versions between the policy being trained and the one that sampled the batch
    logp_gap_max: float  # max |engine log-prob - trainer log-prob| over response tokens
    logp_gap_mean: float
    tokens_per_s: float  # generated response tokens per second of generation
    mismatch_kl: float  # k3 estimate of KL(pi_rollout || pi_trainer) per response token, on the engine's samples
    mismatch_kl_k1: float  # the same, k1 (may be negative)
    is_weight_mean: float | None  # mean truncated importance weight (algorithm.tis_level), None when off
    is_truncated_frac: float | None  # share of tokens (or sequences) whose weight was cut at algorithm.tis_cap
    generated_batches: float  # rollout batches sampled for this step's batch (> 1 with dynamic sampling)
    filled_groups: float  # groups without signal that filled the batch after algorithm.max_gen_batches
    overlong_frac: float  # share of responses cut at max_new_tokens without an end-of-sequence token
    timings: Timings
    toy: ToyDiagnostics | None = None  # exact collapse measures of the toy policy (toy tier only)
    heldout: dict[str, float] | None = None  # eval/ metrics (trainer.eval_every), on the steps that evaluate


class LossStatsMean:
    """Averages LossStats over the micro-batches of a step (ratio_max is a max, cap_pos over defined ones)."""

    def __init__(self) -> None:
        self.items: list[LossStats] = []

    def add(self, stats: LossStats) -> None:
        self.items.append(stats)

    def result(self) -> LossStats:
        """Means over micro-batches (over those where a field is defined, for the optional ones); the *_max fields
        take the max."""
        out: dict[str, float | None] = {}
        for f in fields(LossStats):
            values = [getattr(s, f.name) for s in self.items if getattr(s, f.name) is not None]
            if not values:
                out[f.name] = None
            elif f.name.startswith("ratio_max"):
                out[f.name] = max(values)
            else:
                out[f.name] = sum(values) / len(values)
        return LossStats(**out)


def group_outcomes(rewards: torch.Tensor, group_ids: list[str]) -> tuple[float, float]:
    """(share of groups with a correct response, share of groups whose rewards differ)."""
    groups: dict[str, list[float]] = {}
    for gid, r in zip(group_ids, rewards.tolist()):
        groups.setdefault(gid, []).append(r)
    solved = sum(max(v) > 0 for v in groups.values()) / len(groups)
    signal = sum(max(v) != min(v) for v in groups.values()) / len(groups)
    return solved, signal


def correct_set_means(stats: CorrectSetStats) -> tuple[float | None, float | None]:
    if stats.correct_entropy.numel() == 0:
        return None, None
    return float(stats.correct_entropy.mean()), float(stats.correct_max_q.mean())
