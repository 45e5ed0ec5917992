"""Registry entries: each registered function together with the traits the rest of rlvrlab reads off it.

An estimator or loss is registered once, in the table at the bottom of the module that defines it
(``advantages.ADVANTAGES``, ``losses.POLICY_LOSSES``), as an `Estimator` or a `PolicyLoss` whose traits are
required keyword arguments: a new entry must state them, and no other list of names has to be kept in step.
The config rules (group size, ratio bounds, UP), the trainer (whether behaviour log-probs are needed before
the update) and the registry-wide tests all read these traits.

Knobs are the keyword-only scalar parameters of a function; their names are fields of the ``algorithm``
config group. `bind` reads them from a config-like object once and returns the function with them fixed,
so no algorithm function ever sees the config and nothing looks knobs up per step.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from .types import AdvantageOutput, LossOutput

EstimatorFn = Callable[..., AdvantageOutput]  # (AdvantageInputs, *, knobs) -> AdvantageOutput
LossFn = Callable[..., LossOutput]  # (LossInputs, Aggregation, *, knobs) -> LossOutput


def knobs(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Names of the keyword-only scalar knobs ``fn`` reads: those of the function under its wrappers (UP's, the
    by-sign diagnostics'), which ``functools.update_wrapper`` links for ``inspect.unwrap``."""
    params = inspect.signature(inspect.unwrap(fn)).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def bind(fn: Callable[..., Any], source: Any) -> Callable[..., Any]:
    """``fn`` with each of its knobs fixed to ``source.<knob>`` (``source`` is e.g. ``cfg.algorithm``)."""
    return functools.partial(fn, **{name: getattr(source, name) for name in knobs(fn)})


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator and its traits."""

    fn: EstimatorFn
    _: KW_ONLY
    per_group: bool  # its baseline is the prompt group: needs rollout.group_size >= 2 (config rule)
    reads_old_logp: bool  # reads AdvantageInputs.old_logp: behaviour log-probs must exist before the update
    # a group whose rewards are all equal still gets non-zero advantages (it reads more than the rewards: e.g.
    # ucpo_objective pushes an all-correct group toward uniform); false for reward-only group baselines (D1)
    constant_group_signal: bool = False

    @property
    def knobs(self) -> tuple[str, ...]:
        return knobs(self.fn)


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss and its traits."""

    fn: LossFn
    _: KW_ONLY
    clips_ratio: bool  # clips rho itself to [1 - eps_low, 1 + eps_high], so eps_low <= 1 (config rule)
    up_compatible: bool  # has a clipped positive branch that UP (with_unbounded_positive) can replace
    micro_batch_exact: bool  # summing micro-batches with global counts gives the full batch's loss and gradient
    #                          (false: it selects tokens by statistics of the micro-batch it is given)
    aggregates_itself: bool = False  # its loss is not agg(per_token): token weights (rollout correction) cannot
    #                                  be applied before its aggregation (gmpo averages sequence terms itself)

    @property
    def knobs(self) -> tuple[str, ...]:
        return knobs(self.fn)
