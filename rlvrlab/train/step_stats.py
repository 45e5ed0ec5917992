"""A step's statistics: of the consumed batch and the update, over all ranks (the same on every rank).

Each rank's share (rlvrlab.train.stats.RankShare: sums, counts, maxima) goes to every rank in one all_gather of
small Python objects, one sync point per logged step, and every rank merges them alike (merge_ranks); one process
gathers nothing (all_gather_objects is the identity there). Not gathered, because they are the same on every rank
already: the gradient norms (DeepSpeed's norm of the all-reduced gradient), the rollout-correction metrics
(computed over every rank's rows, rlvrlab.train.optimize.correct_rollouts), rollout/generated_batches (every rank
samples as many batches, rlvrlab.train.rollouts.generate), the lag, and the toy diagnostics (of the weights, the
same on every rank)."""

from __future__ import annotations

import numpy as np
import torch

from rlvrlab.algorithms import AdvantageInputs, correct_set_stats, mismatch_kl
from rlvrlab.train.batch import RolloutBatch, TrainerLogp
from rlvrlab.train.optimize import UpdateResult
from rlvrlab.train.setup import Run
from rlvrlab.train.stats import RankShare, StepStats, Timings, group_counts, merge_ranks
from rlvrlab.update.base import clipped_norm
from rlvrlab.update.dist import all_gather_objects


def step_stats(run: Run, step: int, batch: RolloutBatch, trainer: TrainerLogp, adv_inputs: AdvantageInputs,
               update: UpdateResult, correction: dict[str, float] | None, timings: Timings) -> StepStats:
    """trainer: the behaviour policy's log-probs of the batch, wherever they came from (rlvrlab.train.rollouts.
    Behaviour); adv_inputs: the advantage estimator's inputs with those log-probs."""
    mine = rank_share(batch, trainer, adv_inputs, update, timings)
    parts = all_gather_objects(mine, "the step's statistics")  # [mine] for one process, no collective
    clip = run.cfg.trainer.grad_clip
    return StepStats(
        **merge_ranks(parts),
        grad_norm=float(np.mean(update.norms)),
        grad_norm_clipped=float(np.mean([clipped_norm(n, clip) for n in update.norms])),
        lag=step - batch.version, rollout_corr=correction, generated_batches=float(batch.generated_batches),
        toy=run.policy.diagnostics() if run.policy.diagnostics is not None else None,
    )


def rank_share(batch: RolloutBatch, trainer: TrainerLogp, adv_inputs: AdvantageInputs, update: UpdateResult,
               timings: Timings) -> RankShare:
    """This rank's share of the step's statistics (one copy of the batch's sums to the host)."""
    groups, solved, signal = group_counts(batch.rewards, batch.group_ids)
    sets = correct_set_stats(adv_inputs)
    gap = (batch.engine_logp - trainer.raw).abs() * batch.mask
    rewards = batch.rewards.double()
    tokens, reward, correct, truncated, gap_sum, gap_max = torch.stack([
        batch.mask.double().sum(), rewards.sum(), (rewards > 0).double().sum(), batch.truncated.double().sum(),
        gap.double().sum(), gap.max().double()]).tolist()
    kl_k3, kl_k1 = mismatch_kl(trainer.raw, batch.engine_logp, batch.mask)  # means over the tokens
    return RankShare(
        rows=len(batch), groups=groups, tokens=tokens, reward=reward, correct=correct, solved=solved, signal=signal,
        truncated=truncated, gap=gap_sum, gap_max=gap_max, mismatch_kl=kl_k3 * tokens, mismatch_kl_k1=kl_k1 * tokens,
        correct_sets=int(sets.correct_entropy.numel()), correct_entropy=float(sets.correct_entropy.sum()),
        correct_max_q=float(sets.correct_max_q.sum()),
        losses=list(update.losses), entropies=list(zip(update.entropies, update.entropy_tokens, strict=True)),
        kls=list(zip(update.kls, update.kl_tokens, strict=True)), loss_items=list(update.loss_stats.items),
        generate_seconds=batch.generate_seconds, filled_groups=batch.filled_groups, timings=timings,
    )


def heldout_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """trainer.eval_every's metrics over ranks: every rank evaluates the same problems with the same weights (and
    seed), so the eval/ values agree up to the engines' arithmetic and are averaged; time/eval is the slowest
    rank's. One process: the metrics as they are, with no collective."""
    parts = all_gather_objects(metrics, "the held-out evaluation's metrics")
    if len(parts) == 1:
        return metrics
    return {name: max(p[name] for p in parts) if name.startswith("time/") else float(np.mean([p[name] for p in parts]))
            for name in metrics}
