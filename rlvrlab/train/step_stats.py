"""A step's statistics: of the consumed batch and the update, reduced over ranks (the same on every rank)."""

from __future__ import annotations

import numpy as np
import torch

from rlvrlab.algorithms import AdvantageInputs, correct_set_stats, mismatch_kl
from rlvrlab.train.batch import RolloutBatch, TrainerLogp
from rlvrlab.train.optimize import UpdateResult
from rlvrlab.train.setup import Run
from rlvrlab.train.stats import StepStats, Timings, correct_set_means, group_outcomes
from rlvrlab.update.base import clipped_norm
from rlvrlab.update.dist import all_sum


def step_stats(run: Run, step: int, batch: RolloutBatch, trainer: TrainerLogp, adv_inputs: AdvantageInputs,
               update: UpdateResult, correction: dict[str, float] | None, timings: Timings) -> StepStats:
    """trainer: the behaviour policy's log-probs of the batch, wherever they came from (rlvrlab.train.rollouts.
    Behaviour); adv_inputs: the advantage estimator's inputs with those log-probs."""
    solved, signal_share = group_outcomes(batch.rewards, batch.group_ids)
    h_q, max_q = correct_set_means(correct_set_stats(adv_inputs))
    gap = (batch.engine_logp - trainer.raw).abs() * batch.mask
    kl_k3, kl_k1 = mismatch_kl(trainer.raw, batch.engine_logp, batch.mask)
    outcome = all_sum(torch.tensor([batch.rewards.mean(), (batch.rewards > 0).float().mean(), solved, signal_share,
                                    batch.mask.sum(-1).mean()], dtype=torch.float64)) / run.world_size
    clip = run.cfg.trainer.grad_clip
    return StepStats(
        reward=float(outcome[0]), accuracy=float(outcome[1]), solved_groups=float(outcome[2]),
        signal_groups=float(outcome[3]), response_length=float(outcome[4]),
        policy_loss=float(np.mean(update.losses)), kl_ref=float(np.mean(update.kls)) if update.kls else None,
        entropy=float(np.mean(update.entropies)), grad_norm=float(np.mean(update.norms)),
        grad_norm_clipped=float(np.mean([clipped_norm(n, clip) for n in update.norms])),
        loss=update.loss_stats.result(),
        correct_entropy=h_q, correct_max_q=max_q, lag=step - batch.version,
        logp_gap_max=float(gap.max()), logp_gap_mean=float(gap.sum() / batch.mask.sum()),
        mismatch_kl=kl_k3, mismatch_kl_k1=kl_k1,
        rollout_corr=correction,
        generated_batches=float(batch.generated_batches), filled_groups=float(batch.filled_groups),
        overlong_frac=float(batch.truncated.float().mean()), tokens_per_s=float(batch.mask.sum())
        / max(batch.generate_seconds, 1e-9), timings=timings,
        toy=run.policy.diagnostics() if run.policy.diagnostics is not None else None,
    )
