"""The only place training metric names exist, next to the trainer whose typed step statistics they name:
StepStats -> {"train/reward": 0.4, ...}.

Groups: train/ (outcomes), loss/ (the policy loss and its diagnostics), policy/ (entropy, KL, collapse
diagnostics), rollout/ (engine agreement, lag, throughput), rollout_corr/ (verl's rollout-correction metrics, verl's
names), time/ (seconds per stage).

Every value is of all ranks together (rlvrlab.train.stats.merge_ranks): means over every rank's rows, groups or
tokens, maxima of the *_max values and of each stage's seconds (the slowest rank's), sums of counts.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from rlvrlab.train.stats import StepStats, Timings


def step_metrics(s: StepStats) -> dict[str, float]:
    metrics = {
        "train/reward": s.reward,
        "train/accuracy": s.accuracy,
        "train/solved_groups": s.solved_groups,
        "train/signal_groups": s.signal_groups,
        "train/response_length": s.response_length,
        "loss/policy": s.policy_loss,
        "loss/grad_norm": s.grad_norm,
        "loss/grad_norm_clipped": s.grad_norm_clipped,  # after clipping to trainer.grad_clip
        "loss/clip_frac": s.loss.clip_frac,
        "loss/clip_frac_upper": s.loss.clip_frac_upper,
        "loss/clip_frac_lower": s.loss.clip_frac_lower,
        "loss/dual_clip_frac": s.loss.dual_clip_frac,
        "loss/masked_frac": s.loss.masked_frac,
        "loss/approx_kl": s.loss.approx_kl,
        "loss/ratio_mean": s.loss.ratio_mean,
        "loss/ratio_max": s.loss.ratio_max,
        "policy/entropy": s.entropy,
        "rollout/lag": float(s.lag),
        "rollout/logp_gap_max": s.logp_gap_max,
        "rollout/logp_gap_mean": s.logp_gap_mean,
        "rollout/tokens_per_s": s.tokens_per_s,
        "rollout/mismatch_kl": s.mismatch_kl,  # KL(engine || trainer), k3, per token
        "rollout/mismatch_kl_k1": s.mismatch_kl_k1,
        "rollout/generated_batches": s.generated_batches,  # DAPO's dynamic sampling: batches sampled per step
        "rollout/filled_groups": s.filled_groups,  # ... and no-signal groups that filled the batch
        "rollout/overlong_frac": s.overlong_frac,
    }
    optional = {
        "loss/cap_pos_mean": s.loss.cap_pos_mean,  # UP paper eq. 11, over A > 0 tokens
        "policy/kl_ref": s.kl_ref,
        # by the sign of the advantage: under UP only the A <= 0 side's ratio enters the gradient
        **{f"loss/{side}/{name}": getattr(s.loss, f"{name}_{side}") for side in ("pos", "neg")
           for name in ("ratio_mean", "ratio_max", "approx_kl", "clip_frac")},
        # verl's rollout correction (algorithm.tis_level, algorithm.rollout_rs), as verl names them
        **{f"rollout_corr/{name}": value for name, value in (s.rollout_corr or {}).items()},
        "policy/correct_entropy": s.correct_entropy,  # UCPO's H(q)
        "policy/correct_max_q": s.correct_max_q,
    }
    if s.toy is not None:  # exact, from the whole toy table (not the batch)
        optional.update({
            "policy/toy_correct_mass": s.toy.correct_mass,  # = exact pass@1
            "policy/toy_correct_uniformity": s.toy.uniformity,
            "policy/toy_correct_entropy": s.toy.correct_entropy,
            "policy/toy_correct_max_q": s.toy.max_q,
            "policy/toy_coverage_at_64": s.toy.coverage,
            **{f"policy/toy_pass_at_{k}": v for k, v in s.toy.pass_at.items() if k > 1},
        })
    metrics.update({k: v for k, v in optional.items() if v is not None})
    metrics.update(s.heldout or {})  # eval/... and time/eval, on the steps that evaluate
    metrics.update({f"time/{f.name}": getattr(s.timings, f.name) for f in fields(s.timings)})
    return metrics


def metric_names() -> list[str]:
    """Every name step_metrics can produce (the optional ones only on some tiers or algorithms)."""
    from rlvrlab.algorithms.types import LossStats

    zero_loss = LossStats(**{f.name: 0.0 for f in fields(LossStats)})
    from rlvrlab.policy.toy import TOY_KS, ToyDiagnostics

    toy = ToyDiagnostics(0.0, 0.0, 0.0, 0.0, 0.0, {k: 0.0 for k in TOY_KS})
    from rlvrlab.algorithms.rollout_shaping import correction_metric_names

    zeros: dict[str, Any] = {f.name: 0.0 for f in fields(StepStats)
                             if f.name not in ("loss", "timings", "lag", "toy", "rollout_corr")}
    full = StepStats(**zeros,
                     loss=zero_loss, lag=0, timings=Timings(), toy=toy,
                     rollout_corr=dict.fromkeys(correction_metric_names(), 0.0))
    from rlvrlab.train.heldout import metric_names as eval_names

    return sorted(set(step_metrics(full)) | set(eval_names()))
