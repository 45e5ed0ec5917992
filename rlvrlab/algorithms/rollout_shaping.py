"""DAPO's rollout-side components (Yu et al. 2025, arXiv 2503.14476, §3.2 and §3.4) and the correction for the
mismatch between the rollout engine's and the trainer's probabilities (importance weights, truncated as in TIS or
masked as in IcePop, and rejection sampling), each as verl computes it (docs/references.md;
tests/vectors/verl_dapo_*.json, verl_rollout_correction.json and verl_rollout_corr_rejection.json hold the outputs
of verl's own functions).
"""

from __future__ import annotations

import math
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


# Rollout correction, as verl 0.9.1 computes it (verl/trainer/ppo/rollout_corr_helper.py,
# compute_rollout_correction_and_rejection_mask and the functions it calls), for the mismatch between the rollout
# engine's probabilities pi_rollout and the trainer's pi_trainer of the same sampled tokens. r = pi_trainer /
# pi_rollout, from log r = log pi_trainer - log pi_rollout clamped to [-SAFETY_BOUND, SAFETY_BOUND] before exp.
# Metric names are verl's (without its "rollout_corr/" prefix); every name these functions can return is in
# correction_metric_names().

# verl's rollout_rs options (SUPPORTED_ROLLOUT_RS_OPTIONS) -> (what is compared with the bounds, the estimate):
# per-token estimates of KL(pi_rollout || pi_trainer) from r (Schulman 2020): k1 = -log r, k2 = (log r)^2 / 2,
# k3 = r - 1 - log r; token: each token's own; seq_sum, seq_mean, seq_max: their sum, mean or max over a response,
# which keeps or rejects the whole response.
REJECTION_OPTIONS: dict[str, tuple[str, str]] = {
    "token_k1": ("token", "k1"),
    "token_k2": ("token", "k2"),
    "token_k3": ("token", "k3"),
    "seq_sum_k1": ("seq_sum", "k1"),
    "seq_sum_k2": ("seq_sum", "k2"),
    "seq_sum_k3": ("seq_sum", "k3"),
    "seq_mean_k1": ("seq_mean", "k1"),
    "seq_mean_k2": ("seq_mean", "k2"),
    "seq_mean_k3": ("seq_mean", "k3"),
    "seq_max_k2": ("seq_max", "k2"),
    "seq_max_k3": ("seq_max", "k3"),
}


@dataclass(frozen=True)
class Rejection:
    """One rejection criterion (a verl rollout_rs option with its threshold). k1 options keep what has
    log(lower) <= k1 <= log(upper), i.e. pi_rollout / pi_trainer within [lower, upper] (for seq_sum_k1 the response's
    product of token ratios, for seq_mean_k1 their geometric mean); k2 and k3 options keep what has k <= upper."""

    option: str  # a key of REJECTION_OPTIONS
    upper: float
    lower: float | None = None  # k1 options only


@dataclass(frozen=True)
class RolloutCorrection:
    """compute_rollout_correction_and_rejection_mask's three results."""

    weights: torch.Tensor | None  # [B, T] detached importance weights (0 on padding); None without IS
    mask: torch.Tensor  # [B, T] the response mask with rejected tokens set to 0, in the mask's dtype
    metrics: dict[str, float]  # verl's names without the "rollout_corr/" prefix


def parse_rejection(rollout_rs: str, rollout_rs_threshold: str | float | None) -> tuple[Rejection, ...]:
    """verl's rollout_rs ("token_k1,seq_max_k2": every option must pass) and rollout_rs_threshold ("0.5_2.0,2.5":
    one entry per option, or one for all; "lower_upper" or "upper" for k1 options, whose lower is then 1 / upper;
    "upper" for the others) -> the criteria, as verl's compute_rollout_rejection_mask and
    _parse_rollout_rs_thresholds read them (options de-duplicated in order). Raises ValueError naming the problem."""
    options: list[str] = []
    for option in (part.strip() for part in rollout_rs.split(",")):
        if option and option not in REJECTION_OPTIONS:
            raise ValueError(f"unknown rejection option {option!r}; choose from {', '.join(REJECTION_OPTIONS)}")
        if option and option not in options:
            options.append(option)
    if not options:
        raise ValueError("no rejection option given")
    if rollout_rs_threshold is None:
        raise ValueError(f"rejection options {','.join(options)} need thresholds")
    if isinstance(rollout_rs_threshold, str):
        specs = [part.strip() for part in rollout_rs_threshold.split(",") if part.strip()]
    else:
        specs = [str(rollout_rs_threshold)]
    if not specs:
        raise ValueError("the rejection threshold is empty")
    if len(specs) not in (1, len(options)):
        raise ValueError(f"{len(specs)} rejection thresholds for {len(options)} options; give one shared by all "
                         "or one per option")
    criteria = []
    for option, spec in zip(options, specs * len(options) if len(specs) == 1 else specs):
        if REJECTION_OPTIONS[option][1] == "k1":
            lower_text, sep, upper_text = spec.partition("_")
            if not sep:
                upper_text, lower_text = spec, ""
            try:
                upper = float(upper_text)
                lower = float(lower_text) if sep else 1.0 / upper
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"rejection threshold {spec!r} of {option} is not a number or lower_upper pair "
                                 "of numbers") from None
            if lower <= 0 or upper <= 0:
                raise ValueError(f"rejection threshold {spec!r} of {option}: both bounds must be > 0")
            if lower > upper:
                raise ValueError(f"rejection threshold {spec!r} of {option}: lower bound above the upper")
            criteria.append(Rejection(option, upper, lower))
        else:
            if "_" in spec:
                raise ValueError(f"rejection threshold {spec!r} of {option}: give one upper bound (a lower_upper "
                                 "pair is for k1 options)")
            try:
                upper = float(spec)
            except ValueError:
                raise ValueError(f"rejection threshold {spec!r} of {option} is not a number") from None
            if upper <= 0:
                raise ValueError(f"rejection threshold {spec!r} of {option} must be > 0")
            criteria.append(Rejection(option, upper))
    return tuple(criteria)


def rollout_correction(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                       level: str | None, cap: float = 2.0, lower: float | None = None, normalize: bool = False,
                       rejection: Sequence[Rejection] = ()) -> RolloutCorrection:
    """verl's compute_rollout_correction_and_rejection_mask: importance weights at `level` (token | sequence; None:
    none) from rollout_correction_weights, the response mask after the rejection criteria (all must pass;
    rollout_rejection_mask), and the metrics of both with offpolicy_metrics. [B, T] log-probs and mask."""
    if not bool(mask.bool().any()):
        raise ValueError("the response mask has no token")
    if trainer_logp.shape != rollout_logp.shape or trainer_logp.shape != mask.shape:
        raise ValueError(f"shapes differ: trainer {tuple(trainer_logp.shape)}, rollout {tuple(rollout_logp.shape)}, "
                         f"mask {tuple(mask.shape)}")
    log_ratio = trainer_logp - rollout_logp
    metrics: dict[str, float] = {}
    weights = None
    if level is not None:
        weights, is_metrics = rollout_correction_weights(log_ratio, mask, level=level, cap=cap, lower=lower,
                                                         normalize=normalize)
        metrics.update(is_metrics)
    kept = mask.clone()
    if rejection:
        kept, rs_metrics = rollout_rejection_mask(log_ratio, mask, rejection)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(trainer_logp, rollout_logp, mask))
    return RolloutCorrection(weights, kept, metrics)


def rollout_correction_weights(log_ratio: torch.Tensor, mask: torch.Tensor, *, level: str, cap: float,
                               lower: float | None = None, normalize: bool = False
                               ) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights r = pi_trainer / pi_rollout for the rollout-trainer mismatch (verl's
    compute_rollout_correction_weights): per token (level "token"), or one per response from the sum of its token
    log-ratios (level "sequence"). lower None: truncated, min(r, cap) (TIS: Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training"); lower set: masked, r where lower <= r <= cap and 0
    elsewhere (IcePop: Zhao et al. 2025, "Small Leak Can Sink a Great Ship—Boost RL Training on MoE with IcePop!",
    and the Ring-1T report, arXiv 2510.18855; verl's "lower_upper" threshold). normalize: divided by their mean
    (token level: over tokens; sequence level: over non-empty responses), verl's rollout_is_batch_normalize, unless
    that mean is <= 1e-8. log_ratio [B, T] = log pi_trainer - log pi_rollout; returns detached [B, T] weights (0 on
    padding) and verl's IS metrics (compute_is_metrics; of the weights before normalisation)."""
    if level == "token":
        for_metrics = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    elif level == "sequence":
        for_metrics = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)  # [B, 1]
        raw = torch.exp(torch.clamp(for_metrics, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    else:
        raise ValueError(f"level must be token or sequence, got {level!r}")
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=cap)
    else:
        weights = torch.where((raw >= lower) & (raw <= cap), raw, torch.zeros_like(raw))
    metrics = _is_metrics(weights, raw, for_metrics, mask, level=level, upper=cap, lower=lower)
    if lower is not None:
        outside = (raw < lower) | (raw > cap)
        metrics["rollout_is_oob_ratio"] = masked_mean(outside.float(), mask).item()
    weights = weights.detach()
    if normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            rows = (mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (masked_mean(weights, mask, dim=-1) * rows).sum() / rows.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _is_metrics(weights: torch.Tensor, raw: torch.Tensor, for_metrics: torch.Tensor, mask: torch.Tensor, *,
                level: str, upper: float, lower: float | None) -> dict[str, float]:
    """verl's compute_is_metrics. for_metrics: the unclamped log-ratios, [B, T] (token) or [B, 1] sums (sequence);
    the lower bound of the fractions is 1 / upper when there is none."""
    metrics: dict[str, float] = {}
    lower = 1.0 / upper if lower is None else lower
    log_upper = torch.log(torch.tensor(upper, device=weights.device))
    log_lower = torch.log(torch.tensor(lower, device=weights.device))
    valid = mask.bool()
    if level == "sequence":  # over every row, empty ones included (their log-ratio sum is 0), as verl
        metrics["rollout_is_max"] = torch.exp(torch.clamp(for_metrics.max(), max=SAFETY_BOUND)).item()
        metrics["rollout_is_min"] = torch.exp(for_metrics.min()).item()
        metrics["rollout_is_mean"] = masked_mean(weights, mask).item()
        metrics["rollout_is_ratio_fraction_high"] = (for_metrics > log_upper).float().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (for_metrics < log_lower).float().mean().item()
    else:
        metrics["rollout_is_mean"] = masked_mean(weights, mask).item()
        metrics["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).float(), mask).item()
        metrics["rollout_is_ratio_fraction_low"] = masked_mean((raw < lower).float(), mask).item()
        metrics["rollout_is_max"] = weights.masked_fill(~valid, float("-inf")).max().item()
        metrics["rollout_is_min"] = weights.masked_fill(~valid, float("inf")).min().item()
    clamped = weights.clamp(min=0.0, max=upper)
    mean = masked_mean(clamped, mask)
    if mask.sum() > 1:
        var = masked_mean(clamped.square(), mask) - mean.square()
        metrics["rollout_is_std"] = torch.sqrt(torch.clamp(var, min=0.0)).item()
    else:
        metrics["rollout_is_std"] = 0.0
    second = masked_mean((clamped / (mean + 1e-8)).square(), mask).item()
    # effective sample size of the weights; verl divides by zero when every weight is 0 (all masked): 0 here
    metrics["rollout_is_eff_sample_size"] = 1.0 / second if second > 0 else 0.0
    per_row = masked_mean(weights, mask, dim=-1)  # over every row, empty ones included (0), as verl
    metrics["rollout_is_seq_mean"] = per_row.mean().item()
    metrics["rollout_is_seq_std"] = per_row.std().item() if per_row.numel() > 1 else 0.0
    metrics["rollout_is_seq_max"] = per_row.max().item()
    metrics["rollout_is_seq_min"] = per_row.min().item()
    metrics["rollout_is_seq_max_deviation"] = (per_row - 1.0).abs().max().item()
    raw_per_row = masked_mean(raw, mask, dim=-1)  # before truncation: a truncated mean never exceeds the cap
    metrics["rollout_is_seq_fraction_high"] = (raw_per_row > upper).float().mean().item()
    metrics["rollout_is_seq_fraction_low"] = (raw_per_row < lower).float().mean().item()
    return metrics


def rollout_rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, rejection: Sequence[Rejection]
                           ) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's compute_rollout_rejection_mask: the response mask with every token (token options) or every token of
    a response (seq_* options) that fails a criterion set to 0 — a hard trust region on the divergence estimates
    k1, k2, k3 of KL(pi_rollout || pi_trainer) (the masking of Liu, Li et al. 2025, "When Speed Kills Stability:
    Demystifying RL Collapse from the Training-Inference Mismatch"). log_ratio [B, T] = log pi_trainer - log
    pi_rollout; returns the mask in its own dtype and verl's metrics (compute_rs_metrics per option, then the
    masked fractions per option and of all options together)."""
    if log_ratio.shape[0] == 0:
        return mask, {}
    safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    estimates = {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}
    valid = mask.bool()
    rows_valid = mask.sum(dim=-1) > 0
    combined = torch.ones_like(mask, dtype=log_ratio.dtype)
    metrics: dict[str, float] = {}
    for criterion in rejection:
        aggregation, estimator = REJECTION_OPTIONS[criterion.option]
        token_stat = estimates[estimator]
        is_k1 = estimator == "k1"
        if is_k1:
            if criterion.lower is None:
                raise ValueError(f"{criterion.option} needs a lower bound")
            low, high = math.log(criterion.lower), math.log(criterion.upper)
        else:
            low, high = 0.0, criterion.upper
        per_row: torch.Tensor | None = None
        if aggregation == "token":
            stat = token_stat
            keep = (stat >= low) & (stat <= high) if is_k1 else stat <= high
        else:
            if aggregation == "seq_sum":
                per_row = masked_sum(token_stat, mask, dim=-1)
            elif aggregation == "seq_mean":
                per_row = masked_mean(token_stat, mask, dim=-1)
            else:  # seq_max; an empty row's maximum is 0
                top = token_stat.masked_fill(~valid, float("-inf")).max(dim=-1).values
                per_row = torch.where(top == float("-inf"), torch.zeros_like(top), top)
            row_keep = (per_row >= low) & (per_row <= high) if is_k1 else per_row <= high
            keep = row_keep.unsqueeze(-1).expand_as(valid)
            stat = per_row.unsqueeze(-1).expand_as(mask)
        keep_float = keep.to(log_ratio.dtype)
        combined = combined * keep_float
        metrics.update(_rs_metrics(criterion.option, stat, mask, rows_valid, per_row, low=low, high=high,
                                   lower_applies=is_k1))
        rows_kept = (~((~keep) & valid)).all(dim=-1)
        metrics[f"rollout_rs_{criterion.option}_masked_fraction"] = masked_mean(1 - keep_float, mask).item()
        if rows_valid.float().sum() > 0:
            rejected = (1.0 - rows_kept.to(log_ratio.dtype)) * rows_valid.float()
            metrics[f"rollout_rs_{criterion.option}_seq_masked_fraction"] = (
                rejected.sum() / rows_valid.float().sum()).item()
        else:
            metrics[f"rollout_rs_{criterion.option}_seq_masked_fraction"] = 0.0
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - combined, mask).item()
    kept = (combined > 0.5) & valid
    # over every row, empty ones included, as verl
    metrics["rollout_rs_seq_masked_fraction"] = (~kept & valid).any(dim=-1).float().mean().item()
    return (mask * combined).to(mask.dtype), metrics


def _rs_metrics(option: str, stat: torch.Tensor, mask: torch.Tensor, rows_valid: torch.Tensor,
                per_row: torch.Tensor | None, *, low: float, high: float, lower_applies: bool) -> dict[str, float]:
    """verl's compute_rs_metrics of one option. stat [B, T]: the compared statistic per token (a response's own for
    seq_* options); per_row [B] for seq_* options; low, high: its bounds (log-space for k1; low 0 otherwise)."""
    if not bool(mask.any()):
        raise ValueError("the response mask has no token")
    prefix = f"rollout_rs_{option}"
    valid = mask.bool()
    rows = (per_row if per_row is not None else masked_mean(stat, mask, dim=-1))[rows_valid]
    metrics = {f"{prefix}_mean": masked_mean(stat, mask).item()}
    sequence = per_row is not None and rows.numel() > 0
    if sequence:
        metrics[f"{prefix}_max"] = rows.max().item()
        metrics[f"{prefix}_min"] = rows.min().item()
        metrics[f"{prefix}_fraction_high"] = (rows > high).float().mean().item()
        metrics[f"{prefix}_fraction_low"] = (rows < low).float().mean().item() if lower_applies else 0.0
    else:
        metrics[f"{prefix}_max"] = stat.masked_fill(~valid, float("-inf")).max().item()
        metrics[f"{prefix}_min"] = stat.masked_fill(~valid, float("inf")).min().item()
        metrics[f"{prefix}_fraction_high"] = masked_mean((stat > high).float(), mask).item()
        metrics[f"{prefix}_fraction_low"] = (masked_mean((stat < low).float(), mask).item() if lower_applies
                                             else 0.0)
    if mask.sum() > 1:
        clamped = stat.clamp(min=low if lower_applies else 0.0, max=high)
        mean = masked_mean(clamped, mask)
        var = masked_mean(clamped.square(), mask) - mean.square()
        metrics[f"{prefix}_std"] = torch.sqrt(torch.clamp(var, min=0.0)).item()
    else:
        metrics[f"{prefix}_std"] = 0.0
    metrics[f"{prefix}_seq_mean"] = rows.mean().item()
    metrics[f"{prefix}_seq_std"] = rows.std().item() if rows.numel() > 1 else 0.0
    metrics[f"{prefix}_seq_max"] = rows.max().item()
    metrics[f"{prefix}_seq_min"] = rows.min().item()
    metrics[f"{prefix}_seq_max_deviation"] = rows.abs().max().item()
    metrics[f"{prefix}_seq_fraction_high"] = (rows > high).float().mean().item()
    if lower_applies:
        metrics[f"{prefix}_seq_fraction_low"] = (rows < low).float().mean().item()
    return metrics


def offpolicy_metrics(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
                      ) -> dict[str, float]:
    """verl's compute_offpolicy_metrics of the rollout-trainer mismatch: perplexities (per response, then averaged
    over every row), KL(pi_rollout || pi_trainer) per token by k1 ("kl") and k3 ("k3_kl", unclamped), and the chi^2
    divergences E[r^2] - 1 per token and per response (from clamped log-ratios)."""
    metrics: dict[str, float] = {}
    trainer_mean = masked_mean(trainer_logp, mask, dim=-1)
    metrics["training_ppl"] = torch.exp(-trainer_mean).mean().item()
    metrics["training_log_ppl"] = (-trainer_mean).mean().item()
    metrics["kl"] = masked_mean(rollout_logp - trainer_logp, mask).item()
    log_ratio = trainer_logp - rollout_logp
    metrics["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask).item()
    rollout_mean = masked_mean(rollout_logp, mask, dim=-1)
    metrics["rollout_ppl"] = torch.exp(-rollout_mean).mean().item()
    metrics["rollout_log_ppl"] = (-rollout_mean).mean().item()
    diff = rollout_mean - trainer_mean
    metrics["log_ppl_diff"] = diff.mean().item()
    metrics["log_ppl_abs_diff"] = diff.abs().mean().item()
    metrics["log_ppl_diff_max"] = diff.max().item()
    metrics["log_ppl_diff_min"] = diff.min().item()
    metrics["ppl_ratio"] = torch.exp(diff).mean().item()
    safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    metrics["chi2_token"] = (masked_mean(torch.exp(safe).square(), mask) - 1.0).item()
    row_sum = torch.clamp(masked_sum(log_ratio, mask, dim=-1), min=-SAFETY_BOUND, max=SAFETY_BOUND)
    metrics["chi2_seq"] = (torch.exp(2.0 * row_sum).mean() - 1.0).item()
    return metrics


IS_METRICS = ("rollout_is_max", "rollout_is_min", "rollout_is_mean", "rollout_is_ratio_fraction_high",
              "rollout_is_ratio_fraction_low", "rollout_is_std", "rollout_is_eff_sample_size", "rollout_is_seq_mean",
              "rollout_is_seq_std", "rollout_is_seq_max", "rollout_is_seq_min", "rollout_is_seq_max_deviation",
              "rollout_is_seq_fraction_high", "rollout_is_seq_fraction_low", "rollout_is_oob_ratio",
              "rollout_is_batch_norm_factor")
OFFPOLICY_METRICS = ("training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl",
                     "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio",
                     "chi2_token", "chi2_seq")
_RS_OPTION_METRICS = ("mean", "max", "min", "fraction_high", "fraction_low", "std", "seq_mean", "seq_std", "seq_max",
                      "seq_min", "seq_max_deviation", "seq_fraction_high", "masked_fraction", "seq_masked_fraction")


def correction_metric_names() -> list[str]:
    """Every metric name rollout_correction can return (some only for some settings)."""
    per_option = [f"rollout_rs_{option}_{name}" for option, (_, estimate) in REJECTION_OPTIONS.items()
                  for name in (*_RS_OPTION_METRICS, *(("seq_fraction_low",) if estimate == "k1" else ()))]
    return [*IS_METRICS, *per_option, "rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction",
            *OFFPOLICY_METRICS]


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
