"""UCPO and UP in verl's registries: importing this module registers the advantage estimator ``ucpo`` and the policy
loss ``up`` into verl (tested with verl 0.9.1), with verl's call signatures, computed by rlvrlab's own functions
(rlvrlab.algorithms.advantages.ucpo; rlvrlab.algorithms.losses.with_unbounded_positive over clip_loss). How verl
loads it (the ``verl.plugins`` entry point, or ``VERL_USE_EXTERNAL_MODULES``), the knobs, and which of verl's
settings UP reads: docs/scaling.md, "verl". UCPO's weights need the behaviour log-probs, which verl 0.9.1 hands
only to its own optimal-token-baseline estimators, so the registration also wraps verl's ``compute_advantage`` to
pass ``old_log_probs`` for ``ucpo``; every other estimator goes through verl unchanged.

Floor: imports rlvrlab.algorithms, rlvrlab.errors and verl_metrics (verl's metric names, importable without verl)
only; verl is imported inside `register`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlvrlab.algorithms import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    Aggregation,
    LossInputs,
    with_unbounded_positive,
)
from rlvrlab.algorithms.losses import with_rollout_correction
from rlvrlab.errors import ConfigError
from rlvrlab.integrations.verl_metrics import VERL_METRICS, mlflow_key, val_metric

__all__ = ["ESTIMATOR", "POLICY_LOSS", "VERL_METRICS", "compute_ucpo_advantage", "compute_up_policy_loss",
           "mlflow_key", "passing_old_log_probs", "register", "val_metric"]

ESTIMATOR = "ucpo"  # algorithm.adv_estimator=ucpo
POLICY_LOSS = "up"  # actor_rollout_ref.actor.policy_loss.loss_mode=up

# verl's config keys of UCPO's knobs (under `algorithm`, added with hydra's `+`) and their defaults
UCPO_KNOBS = {"ucpo_tau": 0.2, "ucpo_alpha": 0.0}
UCPO_EPSILON = "ucpo_epsilon"

def _knob(config: Any, name: str, default: float) -> float:
    value = config.get(name, default) if config is not None else default
    return default if value is None else float(value)


def compute_ucpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    old_log_probs: torch.Tensor | None = None,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's advantage-estimator signature over rlvrlab's UCPO (rlvrlab.algorithms.advantages.ucpo, Lochab et al.
    2026): ([bs, T] rewards, [bs, T] mask, [bs] uid per row, ..., [bs, T] old_log_probs) -> (advantages, returns),
    each [bs, T]. Knobs from ``config`` (verl's ``algorithm`` section): ucpo_tau, ucpo_alpha, ucpo_epsilon."""
    if old_log_probs is None:
        raise ConfigError("verl's ucpo estimator was called without old_log_probs (UCPO weights correct responses "
                          "by their behaviour log-probs): call it through verl's compute_advantage, which "
                          "rlvrlab.integrations.verl wraps to pass them, or pass old_log_probs= yourself")
    if not norm_adv_by_std_in_grpo:
        raise ConfigError("UCPO scales the std-normalised GRPO advantage: set algorithm.norm_adv_by_std_in_grpo=true")
    group_ids = index.tolist() if hasattr(index, "tolist") else list(index)
    inputs = AdvantageInputs(token_rewards=token_level_rewards, mask=response_mask, group_ids=group_ids,
                             old_logp=old_log_probs)
    out = ADVANTAGES[ESTIMATOR].fn(inputs, tau=_knob(config, "ucpo_tau", UCPO_KNOBS["ucpo_tau"]),
                                   alpha=_knob(config, "ucpo_alpha", UCPO_KNOBS["ucpo_alpha"]),
                                   adv_eps=_knob(config, UCPO_EPSILON, epsilon))
    return out.advantages, out.returns


_UP = with_rollout_correction(with_unbounded_positive(POLICY_LOSSES["clip"].fn))


def aggregation(loss_agg_mode: str, global_batch_info: Mapping[str, Any] | None) -> Aggregation:
    """rlvrlab's Aggregation for verl's ``loss_agg_mode`` and the counts verl's actor puts in
    ``config.global_batch_info`` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor; None: local)."""
    info = dict(global_batch_info or {})

    def number(key: str) -> float | None:
        value = info.get(key)
        return None if value is None else float(value.item() if isinstance(value, torch.Tensor) else value)

    return Aggregation(mode=loss_agg_mode, num_tokens=number("batch_num_tokens"), num_seqs=number("global_batch_size"),
                       dp_size=int(info.get("dp_size") or 1), loss_scale_factor=number("loss_scale_factor"))


def compute_up_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's policy-loss signature over rlvrlab's UP (arXiv 2607.06987 eq. 12-14): returns (scalar loss, metrics)
    with verl's vanilla loss's metric names (pg_clipfrac: upper + lower clips, 0 upper under UP; ppo_kl: k1;
    pg_clipfrac_lower: the dual clip's share). ``config``: verl's actor config (clip_ratio, clip_ratio_low,
    clip_ratio_high, clip_ratio_c, global_batch_info)."""
    if config is None:
        raise ConfigError("verl's up loss needs the actor config (clip_ratio_low/high, clip_ratio_c)")
    eps = config.clip_ratio
    eps_low = config.clip_ratio_low if config.clip_ratio_low is not None else eps
    eps_high = config.clip_ratio_high if config.clip_ratio_high is not None else eps
    mask = response_mask.to(log_prob.dtype)
    inputs = LossInputs(logp=log_prob, old_logp=old_log_prob, adv=advantages, mask=mask, is_weights=rollout_is_weights)
    out = _UP(inputs, aggregation(loss_agg_mode, config.get("global_batch_info")), eps_low=float(eps_low),
              eps_high=float(eps_high), dual_clip_c=float(config.get("clip_ratio_c", 3.0)))
    stats = out.stats
    return out.loss, {"actor/pg_clipfrac": stats.clip_frac, "actor/ppo_kl": stats.approx_kl,
                      "actor/pg_clipfrac_lower": stats.dual_clip_frac}


def passing_old_log_probs(compute_advantage: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``compute_advantage(data, adv_estimator, gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config)``
    computing ``ucpo`` from the batch's ``old_log_probs`` as well (verl passes registered estimators only rewards,
    mask, uid and config); any other estimator is verl's own call."""

    signature = inspect.signature(compute_advantage)

    @functools.wraps(compute_advantage)
    def with_old_log_probs(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        estimator = given["adv_estimator"]
        if getattr(estimator, "value", estimator) != ESTIMATOR:
            return compute_advantage(*args, **kwargs)
        data = given["data"]
        batch = data.batch
        if "old_log_probs" not in batch.keys():
            raise ConfigError("verl's ucpo estimator needs old_log_probs in the batch: keep the actor's old-log-prob "
                              "pass (verl computes it unless actor_rollout_ref.rollout bypass mode skips it)")
        advantages, returns = compute_ucpo_advantage(
            token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
            index=data.non_tensor_batch["uid"], norm_adv_by_std_in_grpo=given.get("norm_adv_by_std_in_grpo", True),
            config=given.get("config"), old_log_probs=batch["old_log_probs"])
        batch["advantages"] = advantages
        batch["returns"] = returns
        return data

    with_old_log_probs.rlvrlab_wraps = True  # type: ignore[attr-defined]
    return with_old_log_probs


def register() -> None:
    """Register ``ucpo`` and ``up`` in verl's registries and let verl's compute_advantage pass UCPO its
    old_log_probs (once per process; importing this module calls it)."""
    import sys

    from verl.trainer.ppo import core_algos

    core_algos.register_adv_est(ESTIMATOR)(compute_ucpo_advantage)
    core_algos.register_policy_loss(POLICY_LOSS)(compute_up_policy_loss)
    # after the registrations: should verl's trainer module fail to import, both names are still registered and
    # ucpo says what it misses when called without old_log_probs
    from verl.trainer.ppo import ray_trainer

    if not getattr(ray_trainer.compute_advantage, "rlvrlab_wraps", False):
        original = ray_trainer.compute_advantage
        ray_trainer.compute_advantage = passing_old_log_probs(original)
        # modules that imported the name before this ran (verl's v1 trainer, its experimental trainers)
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("verl.") and \
                    getattr(module, "compute_advantage", None) is original:
                module.compute_advantage = ray_trainer.compute_advantage  # type: ignore[attr-defined]


register()
