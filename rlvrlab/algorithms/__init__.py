"""rlvrlab's algorithm library: pure tensor functions, registered by name with their traits.

Every function takes its inputs as one typed object plus keyword-only scalar knobs whose names are the
fields of ``algorithm`` in the config (``tau``, ``eps_high``, ...). Estimators and losses are registered once,
as `Estimator` / `PolicyLoss` entries carrying their traits, in the table at the bottom of the module that
defines them (ADVANTAGES in advantages.py, POLICY_LOSSES in losses.py). ``knobs(fn)`` lists a function's
knobs; ``bind_algorithm(cfg.algorithm)`` fixes them once where a run is built, so no function sees the config.
"""

from __future__ import annotations

from . import advantages as _adv
from .advantages import ADVANTAGES
from .aggregation import AGGREGATIONS, Aggregation
from .bound import BoundAlgorithm, bind_algorithm
from .kl import KL_ESTIMATORS, entropy_bonus, entropy_from_logits, kl_loss
from .losses import POLICY_LOSSES, with_unbounded_positive
from .masked import masked_mean, masked_sum, masked_whiten
from .registry import Estimator, PolicyLoss, bind, knobs
from .rollout_shaping import (
    REJECTION_OPTIONS,
    Rejection,
    RolloutCorrection,
    groups_with_signal,
    mismatch_kl,
    overlong_penalty,
    parse_rejection,
    rollout_correction,
    rollout_correction_weights,
)
from .types import AdvantageInputs, AdvantageOutput, CorrectSetStats, LossInputs, LossOutput, LossStats

correct_set_stats = _adv.correct_set_stats
entropy_advantage_bonus = _adv.entropy_advantage_bonus


__all__ = [
    "REJECTION_OPTIONS",
    "Rejection",
    "RolloutCorrection",
    "groups_with_signal",
    "mismatch_kl",
    "overlong_penalty",
    "parse_rejection",
    "rollout_correction",
    "rollout_correction_weights",
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "AdvantageOutput",
    "Aggregation",
    "BoundAlgorithm",
    "CorrectSetStats",
    "Estimator",
    "LossInputs",
    "LossOutput",
    "LossStats",
    "PolicyLoss",
    "bind",
    "bind_algorithm",
    "correct_set_stats",
    "entropy_advantage_bonus",
    "entropy_bonus",
    "entropy_from_logits",
    "kl_loss",
    "knobs",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "with_unbounded_positive",
]
