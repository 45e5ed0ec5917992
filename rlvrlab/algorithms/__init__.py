"""rlvrlab's algorithm library: pure tensor functions, looked up by name in plain dicts.

Every function takes its inputs as one typed object plus keyword-only scalar knobs whose names are the
fields of ``algorithm`` in the config (``tau``, ``eps_high``, ...). ``knobs(fn)`` lists them, and
``call_with_knobs`` passes exactly those from a config object, so no function ever sees the config.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import advantages as _adv
from .aggregation import AGGREGATIONS, Aggregation
from .kl import KL_ESTIMATORS, entropy_bonus, entropy_from_logits, kl_loss
from .losses import POLICY_LOSSES, UP_COMPATIBLE_LOSSES, with_unbounded_positive
from .masked import masked_mean, masked_sum, masked_whiten
from .types import AdvantageInputs, AdvantageOutput, CorrectSetStats, LossInputs, LossOutput, LossStats

ADVANTAGES: dict[str, Callable[..., AdvantageOutput]] = {
    "grpo": _adv.grpo,
    "dr_grpo": _adv.dr_grpo,
    "rloo": _adv.rloo,
    "opo": _adv.opo,
    "gpg": _adv.gpg,
    "reinforce_pp": _adv.reinforce_pp,
    "reinforce_pp_baseline": _adv.reinforce_pp_baseline,
    "gdpo": _adv.gdpo,
    "grpo_passk": _adv.grpo_passk,
    "dr_grpo_passk": _adv.dr_grpo_passk,
    "passk": _adv.passk,
    "fgrpo": _adv.fgrpo,
    "ucpo": _adv.ucpo,
    "binary_sign": _adv.binary_sign,
}

# Estimators whose baseline is the prompt group: a group of one response carries no signal.
GROUP_ESTIMATORS = frozenset(set(ADVANTAGES) - {"reinforce_pp", "binary_sign"})
# Estimators that read AdvantageInputs.old_logp (UCPO's q over the correct set): the trainer must have the
# behaviour log-probs before the update for them.
READS_OLD_LOGP = frozenset({"ucpo"})

correct_set_stats = _adv.correct_set_stats
entropy_advantage_bonus = _adv.entropy_advantage_bonus


def knobs(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Names of the keyword-only scalar knobs a registered function reads (follows UP's wrapper)."""
    fn = inspect.unwrap(fn)
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def call_with_knobs(fn: Callable[..., Any], *args: Any, source: Any) -> Any:
    """Call ``fn(*args, **{k: source.k for k in knobs(fn)})``; ``source`` is e.g. the algorithm config."""
    return fn(*args, **{name: getattr(source, name) for name in knobs(fn)})


__all__ = [
    "ADVANTAGES",
    "READS_OLD_LOGP",
    "AGGREGATIONS",
    "GROUP_ESTIMATORS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "UP_COMPATIBLE_LOSSES",
    "AdvantageInputs",
    "AdvantageOutput",
    "Aggregation",
    "CorrectSetStats",
    "LossInputs",
    "LossOutput",
    "LossStats",
    "call_with_knobs",
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
