"""Typed statistics of one training step. Names for the tracker are made in rlvrlab.train.metrics only."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

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
    # verl's rollout-correction metrics by verl's names (rlvrlab.algorithms.rollout_shaping), over the global batch;
    # None without algorithm.tis_level or algorithm.rollout_rs
    rollout_corr: dict[str, float] | None
    generated_batches: float  # rollout batches sampled for this step's batch (> 1 with dynamic sampling)
    filled_groups: float  # groups without signal that filled the batch after algorithm.max_gen_batches
    overlong_frac: float  # share of responses cut at max_new_tokens without an end-of-sequence token
    timings: Timings
    toy: ToyDiagnostics | None = None  # exact collapse measures of the toy policy (toy tier only)
    heldout: dict[str, float] | None = None  # eval/ metrics (trainer.eval_every), on the steps that evaluate


class LossStatsMean:
    """LossStats over the loss evaluations of a step (its micro-batches, mini-batches and epochs), each field a mean
    over the tokens it is a mean of in each evaluation: all of its loss tokens; its A > 0 tokens for the *_pos
    fields and cap_pos_mean; its A <= 0 tokens for the *_neg ones. So the step's value is the mean over every token
    evaluated, however rows were grouped into micro-batches (packing by length regroups them); the *_max fields
    take the max. A field no evaluation has tokens for is the plain mean of its defaults (None where undefined)."""

    def __init__(self) -> None:
        self.items: list[tuple[LossStats, dict[str, float]]] = []

    def add(self, stats: LossStats, *, tokens: float, positive: float, negative: float) -> None:
        """stats of one evaluation with its counts of loss tokens, of those with A > 0 and with A <= 0."""
        self.items.append((stats, {"tokens": tokens, "pos": positive, "neg": negative}))

    @staticmethod
    def _weight(name: str) -> str:
        if name.endswith("_pos") or name == "cap_pos_mean":
            return "pos"
        return "neg" if name.endswith("_neg") else "tokens"

    def result(self) -> LossStats:
        out: dict[str, Any] = {}  # a float per field, None where the field is undefined
        for f in fields(LossStats):
            pairs = [(getattr(s, f.name), w[self._weight(f.name)]) for s, w in self.items
                     if getattr(s, f.name) is not None]
            total = sum(weight for _, weight in pairs)
            if not pairs:
                out[f.name] = None
            elif f.name.startswith("ratio_max"):
                out[f.name] = max(value for value, _ in pairs)
            elif total > 0:
                out[f.name] = sum(value * weight for value, weight in pairs) / total
            else:
                out[f.name] = sum(value for value, _ in pairs) / len(pairs)
        return LossStats(**out)


def sign_counts(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """LossStatsMean.add's weights for one loss evaluation: its loss tokens (mask > 0), and those with A > 0 and
    with A <= 0."""
    on = mask.bool()
    tokens, positive = torch.stack([on.sum(), (on & (adv > 0)).sum()]).tolist()
    return {"tokens": tokens, "positive": positive, "negative": tokens - positive}


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
