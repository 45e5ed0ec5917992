"""Typed statistics of one training step. Names for the tracker are made in rlvrlab.train.metrics only.

With several ranks every value is of all ranks together: each rank's share of a step (RankShare: sums, counts,
maxima, per optimizer step) is gathered in one collective and merged (merge_ranks), so that a mean is the mean over
every rank's rows or tokens, not rank 0's."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from rlvrlab.algorithms import LossStats
from rlvrlab.policy.toy import ToyDiagnostics


@dataclass
class Timings:
    """Wall-clock seconds spent in each stage of one step; with several ranks the slowest rank's, stage by stage
    (the step waits for it)."""

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
    tokens_per_s: float  # generated response tokens (all ranks') per second of the slowest rank's generation
    mismatch_kl: float  # k3 estimate of KL(pi_rollout || pi_trainer) per response token, on the engine's samples
    mismatch_kl_k1: float  # the same, k1 (may be negative)
    # verl's rollout-correction metrics by verl's names (rlvrlab.algorithms.rollout_shaping), over the global batch;
    # None without algorithm.tis_level or algorithm.rollout_rs
    rollout_corr: dict[str, float] | None
    generated_batches: float  # rollout batches sampled for this step's batch (> 1 with dynamic sampling)
    filled_groups: float  # groups without signal that filled the batch (all ranks') after algorithm.max_gen_batches
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


def group_counts(rewards: torch.Tensor, group_ids: list[str]) -> tuple[int, int, int]:
    """(groups, groups with a correct response, groups whose rewards differ)."""
    groups: dict[str, list[float]] = {}
    for gid, r in zip(group_ids, rewards.tolist()):
        groups.setdefault(gid, []).append(r)
    solved = sum(max(v) > 0 for v in groups.values())
    signal = sum(max(v) != min(v) for v in groups.values())
    return len(groups), solved, signal


@dataclass
class RankShare:
    """One rank's part of a step's statistics, as sums, counts and maxima instead of means, so that merge_ranks
    combines the ranks' parts exactly (plain floats: it travels between ranks pickled)."""

    rows: int  # responses
    groups: int  # prompts (a group's responses are all on one rank)
    tokens: float  # response tokens
    reward: float  # sum of rewards
    correct: float  # responses with reward > 0
    solved: float  # groups with a correct response
    signal: float  # groups whose rewards differ
    truncated: float  # responses cut at max_new_tokens
    gap: float  # sum over response tokens of |engine log-prob - trainer log-prob|
    gap_max: float
    mismatch_kl: float  # sums over response tokens of the k3 and k1 terms of KL(pi_rollout || pi_trainer)
    mismatch_kl_k1: float
    correct_sets: int  # groups with >= 2 correct responses (UCPO's q-diagnostics)
    correct_entropy: float  # sums over those groups of H(q) and max q
    correct_max_q: float
    # per optimizer step: this rank's part of the mini-batch's loss, which the loss scales by the number of ranks
    # (rlvrlab.algorithms.aggregation's dp_size), so that the ranks' mean is the loss whose gradient was applied
    losses: list[float]
    entropies: list[tuple[float, float]]  # per optimizer step: (mean, tokens) of the token entropy on this rank
    kls: list[tuple[float, float]]  # the same for the KL to the reference (empty without one)
    loss_items: list[tuple[LossStats, dict[str, float]]]  # LossStatsMean.items: every loss evaluation of the rank
    generate_seconds: float  # the rank's generation of its batch
    filled_groups: int
    timings: Timings


def merge_ranks(parts: list[RankShare]) -> dict[str, Any]:
    """StepStats' fields that differ between ranks, from every rank's share: means over all rows (reward, accuracy,
    response_length, overlong_frac), groups (solved, signal, correct_*) and response tokens (logp_gap_mean,
    mismatch_kl*); per optimizer step the entropy and KL over all ranks' tokens, then their mean over steps; the
    loss diagnostics over every rank's loss evaluations (LossStatsMean); the mean of the ranks' policy losses;
    the max of logp_gap_max and of each stage's seconds; the sum of filled groups; the total tokens per second of
    the slowest rank's generation. One part gives that rank's own values."""
    rows, groups, tokens = (sum(getattr(p, name) for p in parts) for name in ("rows", "groups", "tokens"))

    def total(name: str) -> float:
        return sum(getattr(p, name) for p in parts)

    sets = sum(p.correct_sets for p in parts)
    loss = LossStatsMean()
    loss.items = [item for p in parts for item in p.loss_items]
    return {
        "reward": total("reward") / rows, "accuracy": total("correct") / rows,
        "solved_groups": total("solved") / groups, "signal_groups": total("signal") / groups,
        "response_length": tokens / rows, "overlong_frac": total("truncated") / rows,
        "logp_gap_max": max(p.gap_max for p in parts), "logp_gap_mean": total("gap") / max(tokens, 1.0),
        "mismatch_kl": total("mismatch_kl") / max(tokens, 1.0),
        "mismatch_kl_k1": total("mismatch_kl_k1") / max(tokens, 1.0),
        "correct_entropy": total("correct_entropy") / sets if sets else None,
        "correct_max_q": total("correct_max_q") / sets if sets else None,
        "policy_loss": sum(_mean(p.losses) for p in parts) / len(parts),
        "entropy": per_step_token_mean([p.entropies for p in parts]),
        "kl_ref": per_step_token_mean([p.kls for p in parts]) if parts[0].kls else None,
        "loss": loss.result(),
        "tokens_per_s": tokens / max(max(p.generate_seconds for p in parts), 1e-9),
        "filled_groups": float(total("filled_groups")),
        "timings": Timings(**{f.name: max(getattr(p.timings, f.name) for p in parts) for f in fields(Timings)}),
    }


def per_step_token_mean(ranks: list[list[tuple[float, float]]]) -> float:
    """Per optimizer step, the mean over every rank's tokens of the ranks' (mean, tokens); then the mean over
    steps (every rank takes the same optimizer steps). A step without tokens counts 0, as a token mean over none."""
    steps = [sum(m * n for m, n in step) / max(sum(n for _, n in step), 1.0) if len(step) > 1 else step[0][0]
             for step in zip(*ranks, strict=True)]
    return _mean(steps)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
