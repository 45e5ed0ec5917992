"""Policy losses: (LossInputs, Aggregation, scalar knobs) -> LossOutput. Per-token losses are minimised.

delta = logp - old_logp, rho = exp(delta). Where verl clamps delta to [-20, 20] before exp, so do we
(noted per loss); the vectors in tests/vectors pin every choice against verl's own functions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch

from .aggregation import Aggregation
from .masked import masked_mean, masked_sum
from .registry import LossFn, PolicyLoss
from .types import LossInputs, LossOutput, LossStats


def _item(t: torch.Tensor) -> float:
    return float(t.detach().item())


def _frac(condition: torch.Tensor, mask: torch.Tensor) -> float:
    return _item(masked_mean(condition.to(mask.dtype), mask))


def _ratio_stats(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """ratio_mean / ratio_max over response tokens."""
    if not bool(mask.bool().any()):
        return {"ratio_mean": 1.0, "ratio_max": 1.0}
    return {
        "ratio_mean": _item(masked_mean(ratio.detach(), mask)),
        "ratio_max": _item(ratio.detach()[mask.bool()].max()),
    }


def _k1_and_ratio_stats(delta: torch.Tensor, mask: torch.Tensor) -> LossStats:
    """approx_kl (k1) and the ratio's mean and max of delta = logp - old_logp (its exp is the ratio), the diagnostics
    of losses without a clip."""
    return LossStats(approx_kl=_item(masked_mean(-delta, mask)), **_ratio_stats(torch.exp(delta), mask))


def _token_means(mask: torch.Tensor, **values: torch.Tensor) -> dict[str, float]:
    """The masked means over response tokens of several [B, T] tensors (booleans count as 0/1), as one stacked
    reduction and one copy out: the same numbers as `_frac` / masked_mean of each, up to the order of summation."""
    stacked = torch.stack([v.detach().to(mask.dtype) for v in values.values()])  # [K, B, T]
    sums = torch.where(mask.bool(), stacked, torch.zeros((), dtype=mask.dtype)).flatten(1).sum(-1)
    return dict(zip(values, (sums / mask.sum().clamp(min=1)).tolist()))


def _clip_diagnostics(x: LossInputs, delta: torch.Tensor, ratio: torch.Tensor, eps_high: float,
                      **flags: torch.Tensor) -> dict[str, Any]:
    """A ratio-clipping loss's diagnostics in one stacked reduction and one copy out: the share of response tokens
    of each of `flags` ([B, T] bool), approx_kl (k1: the mean of -delta), ratio_mean and ratio_max, and cap_pos_mean
    (UP paper eq. 11 over A > 0 tokens, None without any). The numbers of `_token_means`, `_ratio_stats` and `_cap_pos`
    up to the order of summation (delta's dtype throughout): ~25 tensor operations instead of ~45, which on a toy
    step's [64, 1] tensors are most of the statistics' time."""
    mask = x.mask.bool()
    positive = mask & (x.adv > 0)
    zero = torch.zeros((), dtype=delta.dtype)
    pi = torch.exp(x.logp.detach())
    bound = (1.0 + eps_high) * torch.exp(x.old_logp)
    cap = torch.where(positive & (pi < bound), torch.clamp(bound, max=1.0) - pi, zero)  # _cap_pos, on A > 0 tokens
    rows = torch.stack([*(f.to(delta.dtype) for f in flags.values()), -delta, ratio, cap, positive.to(delta.dtype),
                        mask.to(delta.dtype)]).detach()  # [K, B, T]
    sums = torch.where(mask, rows, zero).flatten(1).sum(-1)
    ratio_max = torch.where(mask, ratio.detach(), torch.full((), -math.inf, dtype=delta.dtype)).amax()
    *shares, kl, ratio_sum, cap_sum, num_positive, count, ratio_max = torch.cat([sums, ratio_max.reshape(1)]).tolist()
    tokens = max(count, 1.0)
    out: dict[str, Any] = {name: share / tokens for name, share in zip(flags, shares)}
    out["approx_kl"] = kl / tokens
    out["ratio_mean"], out["ratio_max"] = (ratio_sum / count, ratio_max) if count else (1.0, 1.0)
    out["cap_pos_mean"] = cap_sum / num_positive if num_positive else None
    return out


def _cap_pos(x: LossInputs, eps_high: float) -> float | None:
    """UP paper eq. 11: probability still gainable before the upper clip, mean over A>0 tokens.

    Cap = min(1, (1+eps_high) pi_old) - pi if pi < (1+eps_high) pi_old, else 0. eps_high = inf gives 1 - pi.
    """
    pos = x.mask.bool() & (x.adv > 0)
    if not bool(pos.any()):
        return None
    pi = torch.exp(x.logp.detach())
    bound = (1.0 + eps_high) * torch.exp(x.old_logp)
    cap = torch.where(pi < bound, torch.clamp(bound, max=1.0) - pi, torch.zeros_like(pi))
    return _item(cap[pos].mean())


def clip_loss(
    x: LossInputs, agg: Aggregation, *, eps_low: float, eps_high: float, dual_clip_c: float | None
) -> LossOutput:
    """PPO clipped surrogate with decoupled bounds (DAPO, Yu et al. 2025, eq. 10) and optional dual clip.

    l = max(-A rho, -A clip(rho, 1-eps_low, 1+eps_high)); for A<0 with dual_clip_c = c:
    l = min(l, -A c) (Ye et al. 2020). delta clamped to [-20, 20]. eps_high may be inf (no upper clip).
    With dual_clip_c = 3 this is verl's ``vanilla`` loss exactly.
    """
    if dual_clip_c is not None and dual_clip_c <= 1:
        raise ValueError(f"dual_clip_c must be > 1 (it bounds -A * rho from above for A < 0), got {dual_clip_c}")
    delta = torch.clamp(x.logp - x.old_logp, min=-20.0, max=20.0)  # [B, T]
    ratio = torch.exp(delta)
    surr = -x.adv * ratio
    surr_clipped = -x.adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = unbounded = torch.maximum(surr, surr_clipped)
    negative = x.adv < 0
    if dual_clip_c is not None:
        dual_bound = -x.adv * dual_clip_c
        per_token = torch.where(negative, torch.minimum(per_token, dual_bound), per_token)

    def stats() -> LossStats:
        with torch.no_grad():
            flags = {"clip_frac_upper": (x.adv > 0) & (ratio > 1.0 + eps_high),
                     "clip_frac_lower": negative & (ratio < 1.0 - eps_low)}
            if dual_clip_c is not None:
                flags["dual_clip_frac"] = (unbounded > dual_bound) & negative
            return LossStats(**_clip_diagnostics(x, delta, ratio, eps_high, **flags))

    return LossOutput(agg(per_token, x.mask), per_token, stats)


def reinforce_offpolicy_loss(x: LossInputs, agg: Aggregation) -> LossOutput:
    """Off-policy REINFORCE: l = -A rho on both signs, no clip (UP paper, Fig. 5 ablation). delta clamped +-20."""
    return clip_loss(x, agg, eps_low=math.inf, eps_high=math.inf, dual_clip_c=None)


def gspo_loss(x: LossInputs, agg: Aggregation, *, eps_low: float, eps_high: float,
              dual_clip_c: float | None = None) -> LossOutput:
    """GSPO (Zheng et al. 2025, eq. 5-7): sequence ratio s_i = exp(mean_t delta), clipped at sequence level.

    Token form with stop-gradient as in verl: log s_it = logp - sg(logp) + sg(log s_i), clamped above at 10;
    its value is s_i and its gradient w.r.t. logp_t is s_i. Use agg=seq-mean-token-mean for the paper's
    objective (verl forces it; rlvrlab leaves it to the algorithm YAML). dual_clip_c = c (not in GSPO or verl's
    gspo; the UP study's arms use it): for A < 0, l = min(l, -A c), as in clip_loss.
    """
    if dual_clip_c is not None and dual_clip_c <= 1:
        raise ValueError(f"dual_clip_c must be > 1 (it bounds -A * s from above for A < 0), got {dual_clip_c}")
    delta = x.logp - x.old_logp
    lengths = x.mask.sum(-1).clamp(min=1)  # [B]
    log_seq_ratio = masked_sum(delta, x.mask, dim=-1) / lengths  # [B]
    log_token_ratio = x.logp - x.logp.detach() + log_seq_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_token_ratio, max=10.0))  # [B, T]
    surr = -x.adv * ratio
    surr_clipped = -x.adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = unbounded = torch.maximum(surr, surr_clipped)
    if dual_clip_c is not None:
        dual_bound = -x.adv * dual_clip_c
        per_token = torch.where(x.adv < 0, torch.minimum(per_token, dual_bound), per_token)

    def stats() -> LossStats:
        return LossStats(
            clip_frac_upper=_frac((x.adv > 0) & (ratio > 1.0 + eps_high), x.mask),
            clip_frac_lower=_frac((x.adv < 0) & (ratio < 1.0 - eps_low), x.mask),
            dual_clip_frac=0.0 if dual_clip_c is None else _frac((unbounded > dual_bound) & (x.adv < 0), x.mask),
            approx_kl=_item(masked_mean(-delta, x.mask)),
            **_ratio_stats(ratio, x.mask),
        )

    return LossOutput(agg(per_token, x.mask), per_token, stats)


def cispo_loss(x: LossInputs, agg: Aggregation, *, eps_low: float, eps_high: float) -> LossOutput:
    """CISPO (MiniMax 2025, eq. 4): l = -sg(clip(rho, 1-eps_low, 1+eps_high)) A logp; every token keeps a gradient."""
    delta = torch.clamp(x.logp - x.old_logp, min=-20.0, max=20.0)
    ratio = torch.exp(delta)
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    per_token = -weight * x.adv * x.logp
    truncated = {"clip_frac_upper": ratio > 1.0 + eps_high, "clip_frac_lower": ratio < 1.0 - eps_low}  # either sign

    def stats() -> LossStats:
        with torch.no_grad():
            means = _token_means(x.mask, **truncated, approx_kl=-delta)
            return LossStats(**means, cap_pos_mean=_cap_pos(x, math.inf), **_ratio_stats(ratio, x.mask))

    return LossOutput(agg(per_token, x.mask), per_token, stats, clip_masks=truncated)


def sapo_loss(x: LossInputs, agg: Aggregation, *, sapo_tau_pos: float, sapo_tau_neg: float) -> LossOutput:
    """SAPO (Gao et al. 2025): soft gate f(rho) = sigmoid(tau (rho - 1)) 4 / tau, l = -f(rho) A.

    tau = tau_pos for A > 0 else tau_neg; the gradient at rho = 1 equals the plain policy gradient.
    """
    delta = torch.clamp(x.logp - x.old_logp, min=-20.0, max=20.0)
    ratio = torch.exp(delta)
    tau = torch.where(x.adv > 0, torch.full_like(ratio, sapo_tau_pos), torch.full_like(ratio, sapo_tau_neg))
    per_token = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * x.adv
    return LossOutput(agg(per_token, x.mask), per_token, lambda: _k1_and_ratio_stats(delta, x.mask))


def gmpo_loss(x: LossInputs, agg: Aggregation, *, eps_low: float, eps_high: float) -> LossOutput:
    """GMPO (Zhao et al. 2025): geometric mean of token ratios, token-level log-ratio clip toward sgn(A).

    Sequence ratio exp(mean_t dtilde) with dtilde = sgn(A) min(sgn(A) delta, sgn(A) clamp(delta, -eps_low,
    eps_high)); sequence advantage = mean_t A; loss = mean over *all* rows (empty rows count, as in verl)
    of -A_seq * ratio. The aggregation mode is not used; agg.num_rows/dp_size give the global denominator.
    """
    delta = x.logp - x.old_logp
    sign = torch.sign(x.adv)
    delta_clamped = torch.clamp(delta, -eps_low, eps_high)
    delta_min = sign * torch.minimum(sign * delta, sign * delta_clamped)
    lengths = x.mask.sum(-1)  # [B]
    seq_ratio = torch.exp(masked_sum(delta_min, x.mask, dim=-1) / (lengths + 1e-8))  # [B]
    seq_adv = masked_sum(x.adv, x.mask, dim=-1) / (lengths + 1e-8)  # [B]
    seq_loss = -seq_adv * seq_ratio  # [B]
    num_rows = agg.num_rows if agg.num_rows is not None else seq_loss.shape[0]
    loss = seq_loss.sum() / num_rows * agg.dp_size

    def stats() -> LossStats:
        clipped = delta != delta_clamped
        return LossStats(
            clip_frac_upper=_frac(clipped & (x.adv > 0), x.mask),
            clip_frac_lower=_frac(clipped & (x.adv < 0), x.mask),
            approx_kl=_item(masked_mean(-delta, x.mask)),
            **_ratio_stats(torch.exp(delta), x.mask),
        )

    per_token = (seq_loss / lengths.clamp(min=1)).unsqueeze(-1) * x.mask
    return LossOutput(loss, per_token, stats)


def pg_loss(x: LossInputs, agg: Aggregation) -> LossOutput:
    """Vanilla policy gradient l = -A logp (GPG, Chu et al. 2025): no ratio, no clip."""
    per_token = -x.logp * x.adv
    return LossOutput(agg(per_token, x.mask), per_token, lambda: _k1_and_ratio_stats(x.logp - x.old_logp, x.mask))


def w_reinforce_loss(x: LossInputs, agg: Aggregation, *, w_reinforce_lambda: float) -> LossOutput:
    """W-REINFORCE (Zhu et al. 2025, "negative sample reinforcement"): l = -w A logp, w = lambda if A > 0 else 1."""
    weight = torch.where(x.adv > 0, torch.full_like(x.adv, w_reinforce_lambda), torch.ones_like(x.adv))
    per_token = -weight * x.adv * x.logp
    return LossOutput(agg(per_token, x.mask), per_token, lambda: _k1_and_ratio_stats(x.logp - x.old_logp, x.mask))


def _dppo(x: LossInputs, agg: Aggregation, valid: torch.Tensor, delta: torch.Tensor, dppo_c: float) -> LossOutput:
    ratio = torch.exp(delta)
    truncated = torch.clamp(ratio, max=dppo_c).detach()
    per_token = -x.adv * truncated * x.logp * valid.detach().to(x.logp.dtype)

    def stats() -> LossStats:
        return LossStats(
            masked_frac=_frac(~valid, x.mask),
            dual_clip_frac=_frac((ratio > dppo_c) & valid, x.mask),
            approx_kl=_item(masked_mean(-delta, x.mask)),
            **_ratio_stats(ratio, x.mask),
        )

    return LossOutput(agg(per_token, x.mask), per_token, stats)


def dppo_tv_loss(x: LossInputs, agg: Aggregation, *, eps_low: float, eps_high: float, dppo_c: float) -> LossOutput:
    """DPPO-Binary-TV (arXiv 2602.04879): truncated-IS policy gradient kept only inside a probability trust region.

    Valid if p - p_old <= eps_high (A > 0) or p - p_old >= -eps_low (A <= 0); l = -A sg(min(rho, c)) logp.
    """
    delta = torch.clamp(x.logp - x.old_logp, min=-20.0, max=20.0)
    diff = torch.exp(x.logp) - torch.exp(x.old_logp)
    valid = torch.where(x.adv > 0, diff <= eps_high, diff >= -eps_low)
    return _dppo(x, agg, valid, delta, dppo_c)


def dppo_kl_loss(x: LossInputs, agg: Aggregation, *, eps_low: float, eps_high: float, dppo_c: float) -> LossOutput:
    """DPPO-Binary-KL: as DPPO-TV with the binary KL(p_old || p) <= eps, or a move in the safe direction."""
    delta = torch.clamp(x.logp - x.old_logp, min=-20.0, max=20.0)
    p, p_old = torch.exp(x.logp), torch.exp(x.old_logp)
    binary_kl = p_old * (x.old_logp - x.logp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(x.adv > 0, (binary_kl <= eps_high) | (p <= p_old), (binary_kl <= eps_low) | (p >= p_old))
    return _dppo(x, agg, valid, delta, dppo_c)


def dro_loss(x: LossInputs, agg: Aggregation, *, dro_beta: float) -> LossOutput:
    """DRO (current verl): l = -(A logp - beta/2 (logp - old_logp)^2)."""
    delta = x.logp - x.old_logp
    per_token = -(x.logp * x.adv - 0.5 * dro_beta * delta.square())
    return LossOutput(agg(per_token, x.mask), per_token, lambda: _k1_and_ratio_stats(delta, x.mask))


def _token_cov(x: LossInputs) -> torch.Tensor:
    """(A - mean A)(logp - mean logp) over valid tokens, detached. [B, T]"""
    logp = x.logp.detach()
    return (x.adv - masked_mean(x.adv, x.mask)) * (logp - masked_mean(logp, x.mask))


def clip_cov_loss(
    x: LossInputs,
    agg: Aggregation,
    *,
    eps_low: float,
    eps_high: float,
    cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
) -> LossOutput:
    """Clip-Cov (Cui et al. 2025, Entropy Mechanism of RL): the clipped loss (no dual clip, no delta clamp),
    with max(1, floor(cov_ratio N)) random not-yet-clipped tokens whose covariance lies in (lb, ub) detached.
    Draws from torch's global RNG (seeded by the run's seed)."""
    delta = x.logp - x.old_logp
    ratio = torch.exp(delta)
    surr = -x.adv * ratio
    surr_clipped = -x.adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    valid = x.mask.bool()
    clipped = (surr_clipped > surr) & valid
    cov = _token_cov(x)
    candidates = torch.nonzero(valid & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub))  # [K, 2]
    num_clip = max(int(cov_ratio * int(valid.sum().item())), 1)
    chosen = candidates[torch.randperm(len(candidates))[:num_clip]]
    keep = torch.ones_like(x.adv)
    keep[chosen[:, 0], chosen[:, 1]] = 0.0
    per_token = torch.maximum(surr, surr_clipped) * keep

    def stats() -> LossStats:
        return LossStats(
            clip_frac_upper=_frac((x.adv > 0) & (ratio > 1.0 + eps_high), x.mask),
            clip_frac_lower=_frac((x.adv < 0) & (ratio < 1.0 - eps_low), x.mask),
            masked_frac=_frac(keep == 0, x.mask),
            approx_kl=_item(masked_mean(-delta, x.mask)),
            cap_pos_mean=_cap_pos(x, eps_high),
            **_ratio_stats(ratio, x.mask),
        )

    return LossOutput(agg(per_token, x.mask), per_token, stats)


def kl_cov_loss(x: LossInputs, agg: Aggregation, *, cov_ratio: float, kl_cov_coef: float) -> LossOutput:
    """KL-Cov (Cui et al. 2025): unclipped -A rho; the top max(1, floor(cov_ratio N)) covariance tokens
    also pay kl_cov_coef * |logp - old_logp|."""
    delta = x.logp - x.old_logp
    ratio = torch.exp(delta)
    valid = x.mask.bool()
    cov = torch.where(valid, _token_cov(x), torch.full_like(x.adv, -math.inf))
    num_top = max(1, int(int(valid.sum().item()) * cov_ratio))
    top = torch.topk(cov.flatten(), min(num_top, int(valid.sum().item()))).indices
    penalised = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    penalised[top] = True
    penalised = penalised.view_as(cov)
    per_token = -x.adv * ratio + torch.where(penalised, kl_cov_coef * delta.abs(), torch.zeros_like(delta))

    def stats() -> LossStats:
        return LossStats(
            masked_frac=_frac(penalised, x.mask),
            approx_kl=_item(masked_mean(-delta, x.mask)),
            cap_pos_mean=_cap_pos(x, math.inf),
            **_ratio_stats(ratio, x.mask),
        )

    return LossOutput(agg(per_token, x.mask), per_token, stats)


def sign_split(stats: LossStats, x: LossInputs, clip_masks: dict[str, torch.Tensor] | None = None) -> LossStats:
    """`stats` with the diagnostics of A > 0 and A <= 0 tokens separately (LossStats *_pos / *_neg): token ratio
    mean and max, k1 approximate KL, and the share of each side's tokens that the loss clipped. The clipped tokens
    are those of `clip_masks` (LossOutput.clip_masks) when the loss gives them; else the shares follow from the
    loss's clip fractions (shares of all tokens: clip_frac_upper of A > 0 tokens, lower and dual of A < 0 ones).
    Either way clip_frac_pos * n_pos + clip_frac_neg * n_neg = (upper + lower + dual) * n. Both sides in one pass:
    [2, B, T] reductions, one copy out."""
    mask = x.mask.bool()
    with torch.no_grad():
        delta = torch.clamp(x.logp.detach() - x.old_logp, min=-20.0, max=20.0)
        ratio = torch.exp(delta)
        sides = torch.stack([mask & (x.adv > 0), mask & (x.adv <= 0)])  # [2, B, T]
        zero = torch.zeros((), dtype=delta.dtype)
        rows = [
            sides.flatten(1).sum(-1).to(delta.dtype),
            torch.where(sides, ratio, zero).flatten(1).sum(-1),
            torch.where(sides, -delta, zero).flatten(1).sum(-1),
            torch.where(sides, ratio, torch.full((), -math.inf, dtype=delta.dtype)).flatten(1).amax(-1),
        ]
        if clip_masks:  # a token counts once: the fields' masks are disjoint (a ratio is clipped at one bound)
            clipped = torch.stack(list(clip_masks.values())).any(0)
            rows.append((sides & clipped).flatten(1).sum(-1).to(delta.dtype))
        counts, ratio_sum, kl_sum, ratio_max, *clipped_counts = torch.stack(rows).tolist()
    total = float(mask.sum())
    out: dict[str, Any] = {}
    for i, (side, clipped_share) in enumerate((("pos", stats.clip_frac_upper),
                                               ("neg", stats.clip_frac_lower + stats.dual_clip_frac))):
        count = counts[i]
        if count == 0:
            out.update({f"ratio_mean_{side}": None, f"ratio_max_{side}": None, f"approx_kl_{side}": None,
                        f"clip_frac_{side}": None})
            continue
        clipped_tokens = clipped_counts[0][i] if clipped_counts else clipped_share * total
        out.update({f"ratio_mean_{side}": ratio_sum[i] / count, f"ratio_max_{side}": ratio_max[i],
                    f"approx_kl_{side}": kl_sum[i] / count, f"clip_frac_{side}": min(1.0, clipped_tokens / count)})
    return dataclasses.replace(stats, **out)


def with_sign_split(loss: LossFn) -> LossFn:
    """`loss` whose stats carry the by-sign diagnostics of `sign_split` (every bound loss gets them)."""

    def split_loss(x: LossInputs, agg: Aggregation, **knobs) -> LossOutput:
        out = loss(x, agg, **knobs)
        return out.replace(stats=lambda: sign_split(out.stats, x, out.clip_masks))

    split_loss.__name__ = getattr(loss, "__name__", "loss")
    functools.update_wrapper(split_loss, loss, assigned=(), updated=())  # its knobs: inspect.unwrap finds `loss`
    return split_loss


def with_rollout_correction(loss: LossFn) -> LossFn:
    """`loss` with each token's loss multiplied by LossInputs.is_weights (truncated importance weights for the
    rollout-trainer mismatch, `rollout_shaping.rollout_correction_weights`) before the aggregation, as verl's losses
    apply rollout_is_weights; unchanged when there are none. Not for losses that aggregate themselves (config rule)."""

    def corrected(x: LossInputs, agg: Aggregation, **knobs) -> LossOutput:
        out = loss(x, agg, **knobs)
        if x.is_weights is None:
            return out
        per_token = out.per_token * x.is_weights
        return out.replace(loss=agg(per_token, x.mask), per_token=per_token)

    corrected.__name__ = getattr(loss, "__name__", "loss")
    functools.update_wrapper(corrected, loss, assigned=(), updated=())
    return corrected


def with_unbounded_positive(base: LossFn) -> LossFn:
    """UP (Unbounded Positive, arXiv 2607.06987, eq. 12-16) on top of a base loss.

    A > 0 tokens: l = -A exp(logp - sg(logp)): value -A, gradient -A d logp, no ratio to pi_old, never
    clipped (eq. 12-13). A <= 0 tokens keep the base loss unchanged (its clip and dual clip). With base =
    clip_loss this is UP-DAPO (eq. 14) / UP-GRPO (eq. 15, symmetric eps + seq-mean-token-mean); with
    gspo_loss and seq-mean-token-mean it is UP-GSPO (eq. 16): per token A/|o_i| d logp.
    """

    def up_loss(x: LossInputs, agg: Aggregation, **knobs) -> LossOutput:
        out = base(x, agg, **knobs)
        positive = x.adv > 0
        self_anchored = -x.adv * torch.exp(x.logp - x.logp.detach())
        per_token = torch.where(positive, self_anchored, out.per_token)
        # positive tokens are never clipped: a base that clips A <= 0 tokens at the upper bound too (CISPO) keeps
        # those in clip_frac_upper, and its A > 0 tokens leave every clip count
        clip_masks = None
        if out.clip_masks is not None:
            clip_masks = {name: clipped & ~positive for name, clipped in out.clip_masks.items()}

        def stats() -> LossStats:
            pos_mask = x.mask.bool() & positive
            cap = _item((1.0 - torch.exp(x.logp.detach()))[pos_mask].mean()) if bool(pos_mask.any()) else None
            base = out.stats
            clips = {"clip_frac_upper": 0.0, "clip_frac_lower": base.clip_frac_lower,
                     "dual_clip_frac": base.dual_clip_frac}
            if clip_masks is not None:
                with torch.no_grad():
                    clips |= _token_means(x.mask, **clip_masks)
            return LossStats(
                **clips,
                masked_frac=base.masked_frac,
                approx_kl=base.approx_kl,
                ratio_mean=base.ratio_mean,
                ratio_max=base.ratio_max,
                cap_pos_mean=cap,  # eq. 12: only the probability itself bounds the gain
            )

        return LossOutput(agg(per_token, x.mask), per_token, stats, clip_masks=clip_masks)

    up_loss.__name__ = f"unbounded_positive_{base.__name__}"
    functools.update_wrapper(up_loss, base, assigned=(), updated=())  # the base's knobs (inspect.unwrap)
    return up_loss


# The registry: name -> loss and its traits (rlvrlab.algorithms.registry). clips_ratio: clips rho itself to
# [1 - eps_low, 1 + eps_high] (gmpo clips in log space and dppo bounds a divergence: they do not); up_compatible:
# a clipped positive branch that UP can replace; micro_batch_exact: false for clip_cov and kl_cov, which pick
# tokens by the covariance within the micro-batch they see (as verl does).
POLICY_LOSSES: dict[str, PolicyLoss] = {
    "clip": PolicyLoss(clip_loss, clips_ratio=True, up_compatible=True, micro_batch_exact=True),
    "reinforce": PolicyLoss(reinforce_offpolicy_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True),
    "gspo": PolicyLoss(gspo_loss, clips_ratio=True, up_compatible=True, micro_batch_exact=True),
    "cispo": PolicyLoss(cispo_loss, clips_ratio=True, up_compatible=True, micro_batch_exact=True),
    "sapo": PolicyLoss(sapo_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True),
    "gmpo": PolicyLoss(gmpo_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True,
                       aggregates_itself=True),
    "gpg": PolicyLoss(pg_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True),
    "w_reinforce": PolicyLoss(w_reinforce_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True),
    "dppo_tv": PolicyLoss(dppo_tv_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True),
    "dppo_kl": PolicyLoss(dppo_kl_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True),
    "dro": PolicyLoss(dro_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=True),
    "clip_cov": PolicyLoss(clip_cov_loss, clips_ratio=True, up_compatible=False, micro_batch_exact=False),
    "kl_cov": PolicyLoss(kl_cov_loss, clips_ratio=False, up_compatible=False, micro_batch_exact=False),
}
