"""An algorithm config bound once, where the run is built: the functions it selects with their knobs fixed.

``bind_algorithm(cfg.algorithm)`` is the only place knobs are read from the config; the trainer then calls
``algo.advantage(inputs)`` and ``algo.loss(x, agg)`` each step with tensors only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .advantages import ADVANTAGES, entropy_advantage_bonus
from .aggregation import Aggregation
from .kl import entropy_bonus, kl_loss
from .losses import POLICY_LOSSES, with_rollout_correction, with_sign_split, with_unbounded_positive
from .registry import Estimator, PolicyLoss, bind
from .rollout_shaping import RolloutCorrection, parse_rejection, rollout_correction
from .types import AdvantageInputs, AdvantageOutput, LossInputs, LossOutput


class BoundEstimator(Protocol):
    def __call__(self, inp: AdvantageInputs, /) -> AdvantageOutput: ...


class BoundLoss(Protocol):
    def __call__(self, x: LossInputs, agg: Aggregation, /) -> LossOutput: ...


@dataclass(frozen=True)
class BoundAlgorithm:
    estimator: Estimator  # the registry entries, for their traits
    policy_loss: PolicyLoss
    advantage: BoundEstimator
    loss: BoundLoss  # wrapped by UP when algorithm.unbounded_positive; stats split by the sign of A
    kl: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Aggregation], torch.Tensor]  # (logp, ref, mask, agg)
    entropy_bonus: Callable[[torch.Tensor, torch.Tensor, Aggregation], torch.Tensor] | None  # None: entropy_coef 0
    ent_adv: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None  # (adv, entropy); None: ent_adv_alpha 0
    # verl's rollout correction, (trainer_logp, rollout_logp, mask) -> RolloutCorrection; None: algorithm.tis_level
    # none and no algorithm.rollout_rs
    rollout_correction: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], RolloutCorrection] | None = None


def bind_algorithm(algorithm: Any) -> BoundAlgorithm:
    """The estimator, loss and loss terms that ``algorithm`` (the config's algorithm group) selects, each with
    its knobs read from it once (`rlvrlab.algorithms.registry.bind`)."""
    estimator, policy_loss = ADVANTAGES[algorithm.estimator], POLICY_LOSSES[algorithm.loss]
    loss = with_unbounded_positive(policy_loss.fn) if algorithm.unbounded_positive else policy_loss.fn
    return BoundAlgorithm(
        estimator=estimator,
        policy_loss=policy_loss,
        advantage=bind(estimator.fn, algorithm),
        loss=with_sign_split(with_rollout_correction(bind(loss, algorithm))),
        kl=bind(kl_loss, algorithm),
        entropy_bonus=bind(entropy_bonus, algorithm) if algorithm.entropy_coef > 0 else None,
        ent_adv=bind(entropy_advantage_bonus, algorithm) if algorithm.ent_adv_alpha > 0 else None,
        rollout_correction=_bind_rollout_correction(algorithm),
    )


def _bind_rollout_correction(algorithm: Any) -> Callable[..., RolloutCorrection] | None:
    """rollout_shaping.rollout_correction with the config's importance-weight and rejection settings (verl's
    rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold)."""
    if algorithm.tis_level == "none" and algorithm.rollout_rs is None:
        return None
    level = None if algorithm.tis_level == "none" else algorithm.tis_level
    rejection = parse_rejection(algorithm.rollout_rs, algorithm.rollout_rs_threshold) if algorithm.rollout_rs else ()
    return functools.partial(rollout_correction, level=level, cap=algorithm.tis_cap, lower=algorithm.tis_lower,
                             normalize=algorithm.tis_batch_normalize, rejection=rejection)
