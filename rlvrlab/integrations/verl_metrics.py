"""verl's metric names as verl's own MLflow logger stores them, for `rlvrlab report --metric` over runs verl wrote
(docs/scaling.md, "verl's metric names"). Importable without verl: the environment that reports has no verl.

verl/utils/tracking.py (0.9.1) sanitises every key before `mlflow.log_metrics`: '@' -> '_at_', runs of '/' -> one
'/', then any character other than letters, digits, '_', '.', '-', ':', ' ' and '/' -> '_'. `mlflow_key` is that
rule; tests/integrations/test_verl.py logs through verl's `Tracking` and reads the names back.
"""

from __future__ import annotations

import re

from rlvrlab.errors import ConfigError

# what a lab compares -> verl's MLflow key (verl 0.9.1: ray_trainer / v1 trainer, metric_utils, workers/utils/losses)
VERL_METRICS: dict[str, str] = {
    "reward": "critic/score/mean",  # mean sequence score (the reward function's, before any in-reward KL)
    "reward_max": "critic/score/max",
    "reward_min": "critic/score/min",
    "reward_with_kl": "critic/rewards/mean",  # the score minus the in-reward KL penalty (algorithm.use_kl_in_reward)
    "advantage": "critic/advantages/mean",
    "entropy": "actor/entropy",  # mean token entropy of the policy on the batch (old-log-prob pass)
    "pg_loss": "actor/pg_loss",
    "clip_frac": "actor/pg_clipfrac",  # tokens whose ratio was clipped (upper for A > 0, lower for A < 0)
    "dual_clip_frac": "actor/pg_clipfrac_lower",  # A < 0 tokens capped by the dual clip
    "approx_kl": "actor/ppo_kl",  # k1: mean(old_logp - logp)
    "kl_loss": "actor/kl_loss",  # actor.use_kl_loss
    "grad_norm": "actor/grad_norm",
    "lr": "actor/lr",
    "response_length": "response_length/mean",
    "response_clip_ratio": "response_length/clip_ratio",  # responses cut at max_response_length
    "step": "training/global_step",
}

_INVALID = re.compile(r"[^/\w.\- :]")
_SLASHES = re.compile(r"/+")


def mlflow_key(name: str) -> str:
    """A verl metric name as verl's MLflow logger stores it ('@' -> '_at_', '//' -> '/', other characters MLflow
    refuses -> '_'): ``val-core/openai/gsm8k/reward/mean@4`` -> ``val-core/openai/gsm8k/reward/mean_at_4``."""
    return _INVALID.sub("_", _SLASHES.sub("/", name.replace("@", "_at_")))


def val_metric(data_source: str, n: int, *, var: str = "acc", stat: str = "mean") -> str:
    """The MLflow key of a verl validation metric, sanitised as verl's MLflow logger does: stat ``mean`` is
    ``val-core/<data_source>/<var>/mean@<n>`` (the mean score over the n samples of each problem), ``best`` and
    ``maj`` are ``.../best@<n>/mean`` and ``.../maj@<n>/mean`` (bootstrapped best-of-n and majority vote). verl's
    core variable is ``acc`` when the reward function returns one, else ``reward``; val-core holds the largest n
    only (n = actor_rollout_ref.rollout.val_kwargs.n), smaller ones are under val-aux."""
    if stat not in ("mean", "best", "maj"):
        raise ConfigError(f"verl logs no validation statistic {stat!r}: give stat='mean', 'best' or 'maj'")
    suffix = f"mean@{n}" if stat == "mean" else f"{stat}@{n}/mean"
    return mlflow_key(f"val-core/{data_source}/{var}/{suffix}")


