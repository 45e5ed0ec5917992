"""Typed inputs and outputs of the algorithm functions.

Glossary (used everywhere in rlvrlab): B = responses in the batch, T = padded response length,
``mask`` = response mask (1 on response tokens, right padding 0), ``logp`` = current-policy per-token
log-probs, ``old_logp`` = behaviour-policy log-probs, ``adv`` = per-token advantages.
Stats stay typed here; only rlvrlab's tracking edge turns them into metric names.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from .masked import GroupLayout, mean_token_logp


@dataclass(frozen=True)
class AdvantageInputs:
    token_rewards: torch.Tensor  # [B, T] outcome reward on the last response token, 0 elsewhere
    mask: torch.Tensor  # [B, T]
    group_ids: Sequence[Hashable]  # [B] prompt id per row; rows of a group need not be contiguous
    old_logp: torch.Tensor | None = None  # [B, T] behaviour log-probs (UCPO's q needs them)
    # [B] what makes two responses the same response (e.g. their token ids); None: every row is its own response
    response_keys: Sequence[Hashable] | None = None

    # Built on first read and kept (the inputs are never changed in place; dataclasses.replace makes new ones), so
    # UCPO's estimator and the same step's correct-set statistics lay the batch out once.
    @cached_property
    def groups(self) -> GroupLayout:
        """The batch by prompt group: scores, group index, padded [G, n] layout and its correct entries."""
        return GroupLayout.of(self.token_rewards, self.group_ids)

    @cached_property
    def mean_token_logp(self) -> torch.Tensor:
        """[B] float64 mean token log-prob of each response under pi_old (masked.mean_token_logp)."""
        if self.old_logp is None:
            raise ValueError("the mean token log-prob needs old_logp (behaviour log-probs)")
        return mean_token_logp(self.old_logp, self.mask)


@dataclass(frozen=True)
class AdvantageOutput:
    advantages: torch.Tensor  # [B, T], zero outside the mask
    returns: torch.Tensor  # [B, T]; equal to advantages except for REINFORCE++


@dataclass(frozen=True)
class CorrectSetStats:
    """UCPO's q-diagnostics per group (q = softmax of mean token log-prob over a group's correct set).

    Groups are listed in sorted group-id order. ``*_correct`` cover groups with >= 2 correct responses,
    ``incorrect_entropy`` groups with >= 2 incorrect ones (correct means reward > 0).
    """

    correct_entropy: torch.Tensor  # [Gc] H(q) over the correct set
    correct_max_q: torch.Tensor  # [Gc] max q
    num_correct: torch.Tensor  # [Gc]
    incorrect_entropy: torch.Tensor  # [Gi] H(p) over the incorrect set
    num_incorrect: torch.Tensor  # [Gi]


@dataclass(frozen=True)
class LossInputs:
    logp: torch.Tensor  # [B, T] requires grad
    old_logp: torch.Tensor  # [B, T]
    adv: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T]
    is_weights: torch.Tensor | None = None  # [B, T] detached rollout-correction weights, multiplied into every token


@dataclass(frozen=True)
class LossStats:
    """Diagnostics of one policy-loss evaluation (masked means over response tokens).

    clip_frac_upper: A>0 tokens whose ratio exceeded 1+eps_high (their gradient is cut); for CISPO, tokens of
    either sign whose weight was truncated there (verl's count).
    clip_frac_lower: A<0 tokens whose ratio fell below 1-eps_low; for CISPO, tokens of either sign.
    dual_clip_frac: A<0 tokens capped by the dual clip c (or ratio truncation at c).
    masked_frac: tokens whose loss was zeroed (Clip-Cov selection, DPPO trust region).
    approx_kl: mean(old_logp - logp) (k1; may be negative).
    ratio_mean / ratio_max: importance ratio pi/pi_old over response tokens.
    cap_pos_mean: UP paper eq. 11 probability capacity, mean over A>0 tokens (None if undefined).
    *_pos / *_neg: the same over A > 0 and over A <= 0 tokens only (None when there are none): the token ratio
    pi/pi_old, k1 approximate KL, and the share of those tokens the loss clipped (upper clip for A > 0; lower or
    dual clip for A <= 0; either bound for CISPO). Under UP the ratio of A > 0 tokens no longer enters the gradient,
    so only the _neg ones speak to the clipped branch (`sign_split`).
    """

    clip_frac_upper: float = 0.0
    clip_frac_lower: float = 0.0
    dual_clip_frac: float = 0.0
    masked_frac: float = 0.0
    approx_kl: float = 0.0
    ratio_mean: float = 1.0
    ratio_max: float = 1.0
    cap_pos_mean: float | None = None
    ratio_mean_pos: float | None = None
    ratio_max_pos: float | None = None
    approx_kl_pos: float | None = None
    clip_frac_pos: float | None = None
    ratio_mean_neg: float | None = None
    ratio_max_neg: float | None = None
    approx_kl_neg: float | None = None
    clip_frac_neg: float | None = None

    @property
    def clip_frac(self) -> float:
        """Tokens clipped on either side (verl's ``pg_clipfrac``, TRL's ``clip_ratio/region_mean``)."""
        return self.clip_frac_upper + self.clip_frac_lower


class LossOutput:
    """What a policy loss returns.

    loss: scalar, to minimise. per_token: [B, T] loss before aggregation (zero-filled where undefined).
    stats: its LossStats. A loss may give them as a function of no arguments instead: they are then computed on
    first read, once, so a step that logs nothing never pays for its diagnostics (rlvrlab.train.loop reads them only
    on the steps that log). The function reads the loss's inputs and the tensors of its forward pass, which backward
    does not change: read after backward, they are the same numbers (an input changed in place before the read would
    change them; the loop reads them before the optimizer step).
    clip_masks: [B, T] bool per clip field of `stats` ("clip_frac_upper", "clip_frac_lower", "dual_clip_frac"): the
    tokens it counts, from a loss whose clip counts are not split by the sign of A (CISPO truncates every token's
    weight at both bounds). None: clip_frac_upper counts A > 0 tokens only and lower and dual A < 0 ones only, so
    the by-sign shares follow from the fractions (losses.sign_split) and UP keeps lower and dual as they are."""

    __slots__ = ("loss", "per_token", "_stats", "clip_masks")

    def __init__(self, loss: torch.Tensor, per_token: torch.Tensor, stats: LossStats | Callable[[], LossStats],
                 clip_masks: dict[str, torch.Tensor] | None = None):
        self.loss = loss
        self.per_token = per_token
        self._stats = stats
        self.clip_masks = clip_masks

    @property
    def stats(self) -> LossStats:
        if not isinstance(self._stats, LossStats):
            self._stats = self._stats()
        return self._stats

    def replace(self, **changes) -> LossOutput:
        """A copy with some of loss, per_token, stats (LossStats or a function giving them), clip_masks changed;
        stats not yet computed stay so."""
        fields = {"loss": self.loss, "per_token": self.per_token, "stats": self._stats, "clip_masks": self.clip_masks}
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"LossOutput has no field {', '.join(sorted(unknown))}")
        return LossOutput(**(fields | changes))
