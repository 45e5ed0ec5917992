"""A step's update: verl's rollout correction, advantages, and ppo_epochs x mini-batches of policy-loss updates
through the update engine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlvrlab.algorithms import AdvantageInputs, Aggregation, LossInputs, masked_sum
from rlvrlab.errors import RlvrlabError
from rlvrlab.tracking import tags as T
from rlvrlab.train import checkpoint
from rlvrlab.train.batch import Behaviour, RolloutBatch, Rows, TrainerLogp, UpdateRows, shuffled_rows
from rlvrlab.train.logprobs import logp_and_entropy
from rlvrlab.train.packing import micro_batches, packing_budget, row_order, split_to
from rlvrlab.train.setup import Run
from rlvrlab.train.stats import LossStatsMean, sign_counts
from rlvrlab.update.dist import all_max, all_sum


def correct_rollouts(run: Run, batch: RolloutBatch, behaviour: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """verl's rollout correction of this step's batch before its advantages, as verl's trainer applies it
    (algorithm.tis_level, algorithm.rollout_rs; run.algorithm.rollout_correction): (the response mask after
    rejection, the importance weights or None, the metrics). `behaviour` is the trainer's log-prob at temperature 1.
    Over every rank's rows together, so that batch normalisation and the metrics are the global batch's, the same on
    every rank."""
    assert run.algorithm.rollout_correction is not None
    (trainer, engine, mask), mine = _global_rows(run, behaviour, batch.engine_logp, batch.mask)
    out = run.algorithm.rollout_correction(trainer, engine, mask)
    width = batch.mask.shape[1]
    return out.mask[mine, :width], None if out.weights is None else out.weights[mine, :width], out.metrics


def _global_rows(run: Run, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], slice]:
    """[B, T] tensors of this rank -> the same over every rank's rows in rank order (zero-padded to the widest T),
    and this rank's rows among them. One all_sum of buffers holding each rank's rows in its place and 0 elsewhere:
    exact, since every entry has one non-zero term."""
    rows, width = tensors[0].shape
    if run.world_size == 1:
        return list(tensors), slice(0, rows)
    counts = all_sum(torch.tensor([rows if r == run.rank else 0 for r in range(run.world_size)], dtype=torch.long))
    start, widest = int(counts[:run.rank].sum()), all_max(width)
    gathered = []
    for values in tensors:
        full = torch.zeros(int(counts.sum()), widest, dtype=values.dtype, device=values.device)
        full[start:start + rows, :width] = values
        gathered.append(all_sum(full))
    return gathered, slice(start, start + rows)


def update_rows(run: Run, batch: RolloutBatch, trainer: TrainerLogp | None, reference: torch.Tensor | None, *,
                kept_mask: torch.Tensor | None = None,
                is_weights: torch.Tensor | None = None) -> tuple[UpdateRows, AdvantageInputs]:
    """The batch's advantages [B, T] (from outcome rewards on each response's last token and, where the estimator
    reads them, the behaviour log-probs) with everything else the update reads; and the estimator's inputs (the
    correct-set statistics reuse them). kept_mask: the response mask after rejection sampling, which the
    estimator sees, as verl's does."""
    algo = run.algorithm
    lengths = batch.mask.sum(-1).long()  # [B]
    token_rewards = torch.zeros_like(batch.mask)  # [B, T]
    token_rewards[torch.arange(len(batch)), lengths - 1] = batch.rewards
    mask = batch.mask if kept_mask is None else kept_mask
    source = Behaviour.UPDATE_FORWARD if trainer is None else Behaviour.SAMPLER_PASS
    behaviour = trainer.behaviour if trainer is not None else None
    inputs = AdvantageInputs(token_rewards, mask, batch.group_ids, old_logp=behaviour,
                             response_keys=batch.response_keys())
    adv = algo.advantage(inputs).advantages
    if algo.ent_adv is not None:
        assert trainer is not None and trainer.entropy is not None  # Ent-Adv implies Behaviour.SAMPLER_PASS
        adv = algo.ent_adv(adv, trainer.entropy) * batch.mask
    rows = UpdateRows(batch, adv, source, behaviour, reference, is_weights=is_weights, kept_mask=kept_mask)
    return rows, inputs


@dataclass
class UpdateResult:
    loss_stats: LossStatsMean = field(default_factory=LossStatsMean)
    # per optimizer step, over its mini-batch (not per micro-batch: the grouping into micro-batches does not matter)
    losses: list[float] = field(default_factory=list)  # policy term: the mini-batch's loss
    entropies: list[float] = field(default_factory=list)  # mean token entropy
    kls: list[float] = field(default_factory=list)  # mean k3 KL to the reference, when used
    # the tokens each of those means is over on this rank (response tokens; loss tokens for the KL), by which the
    # ranks' means combine (rlvrlab.train.stats.merge_ranks)
    entropy_tokens: list[float] = field(default_factory=list)
    kl_tokens: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)  # gradient norm of each optimizer step
    # the behaviour log-probs the update's own forward gave (Behaviour.UPDATE_FORWARD), in batch order
    behaviour: torch.Tensor | None = None


def in_batch_order(values: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """Micro-batches' rows concatenated -> batch order (row_order), when packing reordered them."""
    return values if order is None else values[order]


def run_micro_batches(run: Run, batch: Rows, *, same_count_on_all_ranks: bool) -> list[torch.Tensor]:
    """This batch's micro-batches, as row indices (rlvrlab.train.packing.micro_batches). Packed by a token budget,
    their number can differ between ranks; for a backward pass every rank takes the largest (DeepSpeed reduces
    gradients in it)."""
    sampled = batch.batch if isinstance(batch, UpdateRows) else batch
    assert isinstance(sampled, RolloutBatch)
    t = run.cfg.trainer
    tokens = t.micro_batch_tokens
    if tokens is None and t.pack_by_length:
        tokens = packing_budget(sampled, t.micro_batch_size, run.cfg.rollout.max_new_tokens)
    parts = micro_batches(sampled, rows=t.micro_batch_size, tokens=tokens, prompt_cache=run.shared_cache)
    if tokens is not None and same_count_on_all_ranks and run.world_size > 1:
        parts = split_to(parts, all_max(len(parts)))
    return parts


def update_policy(run: Run, rows: UpdateRows, step: int, *, with_stats: bool = True) -> UpdateResult:
    """ppo_epochs passes over this process's rows, each split into mini-batches (one optimizer step each),
    each accumulated over micro-batches. Losses are normalised by the mini-batch's counts over all processes,
    so the update does not depend on how rows are split into micro-batches or processes. with_stats=False: the
    same update; the result holds the gradient norms only (no loss, entropy or KL means, no loss diagnostics), and
    the token entropy is not computed unless the loss has an entropy term.
    The behaviour log-probs are rows.behaviour (Behaviour.SAMPLER_PASS), or (Behaviour.UPDATE_FORWARD, one epoch of
    one mini-batch) the update's own forward, detached, as TRL's GRPOTrainer takes them; those are returned."""
    cfg, algo, result = run.cfg, run.algorithm, UpdateResult()
    from_forward: list[torch.Tensor] = []
    drop_truncated = cfg.algorithm.overlong_filter
    for epoch in range(cfg.trainer.ppo_epochs):
        minis: Sequence[torch.Tensor | slice]
        if cfg.trainer.mini_batches > 1:
            minis = list(shuffled_rows(len(rows), seed=(cfg.seed, step, epoch)).chunk(cfg.trainer.mini_batches))
        else:
            minis = [slice(0, len(rows))]  # the whole batch, no copy
        for mini_rows in minis:
            mini = rows.rows(mini_rows)
            mini_mask = mini.loss_mask(drop_truncated=drop_truncated)
            counts = all_sum(torch.tensor([mini_mask.sum(), (mini_mask.sum(-1) > 0).sum(), len(mini)],
                                          dtype=torch.float64))  # tokens, non-empty rows, rows
            agg = Aggregation(cfg.algorithm.agg, num_tokens=float(counts[0]), num_seqs=float(counts[1]),
                              num_rows=float(counts[2]), dp_size=run.world_size,
                              loss_scale_factor=cfg.algorithm.loss_scale_factor)
            parts = run_micro_batches(run, mini, same_count_on_all_ranks=True)
            # per micro-batch: the policy term (its part of the mini-batch's loss); (sum, count) over its tokens of
            # the entropy and the KL to the reference, so that the logged means are the mini-batch's own, however its
            # rows were grouped into micro-batches
            mini_loss: list[float] = []
            mini_entropy: list[tuple[torch.Tensor, torch.Tensor]] = []
            mini_kl: list[tuple[torch.Tensor, torch.Tensor]] = []
            for i, micro_rows in enumerate(parts):
                x = mini.rows(micro_rows)
                logp, entropy = logp_and_entropy(run.update.module, x.batch, temperature=cfg.rollout.temperature,
                                                 with_entropy=with_stats or algo.entropy_bonus is not None,
                                                 entropy_grad=algo.entropy_bonus is not None,
                                                 prompt_cache=run.shared_cache)
                if x.source is Behaviour.UPDATE_FORWARD:
                    old_logp = logp.detach()
                    from_forward.append(old_logp)
                else:
                    assert x.behaviour is not None  # UpdateRows: SAMPLER_PASS rows hold them
                    old_logp = x.behaviour
                mask = x.loss_mask(drop_truncated=drop_truncated)
                out = algo.loss(LossInputs(logp, old_logp, x.adv, mask, is_weights=x.is_weights), agg)
                loss = out.loss
                if x.reference is not None:
                    loss = loss + algo.kl(logp, x.reference, mask, agg)
                    if with_stats:
                        delta = (x.reference - logp).detach()
                        mini_kl.append((masked_sum(torch.expm1(delta) - delta, mask), mask.sum()))
                if algo.entropy_bonus is not None:
                    assert entropy is not None  # with_entropy
                    loss = loss + algo.entropy_bonus(entropy, mask, agg)
                require_finite(loss.item(), "loss", step, run)
                run.update.backward(loss, last=i == len(parts) - 1)
                if with_stats:  # the loss's diagnostics are computed here, on first read (LossOutput.stats)
                    assert entropy is not None  # with_entropy
                    result.loss_stats.add(out.stats, **sign_counts(x.adv, mask))
                    mini_loss.append(out.loss.item())
                    mini_entropy.append((masked_sum(entropy.detach(), x.batch.mask), x.batch.mask.sum()))
            if with_stats:
                result.losses.append(sum(mini_loss))
                result.entropies.append(token_mean(mini_entropy))
                result.entropy_tokens.append(token_count(mini_entropy))
            if mini_kl:
                result.kls.append(token_mean(mini_kl))
                result.kl_tokens.append(token_count(mini_kl))
            if from_forward:  # one epoch of one mini-batch (behaviour_source): back to the batch's row order
                result.behaviour = in_batch_order(torch.cat(from_forward), row_order(parts, len(mini)))
            result.norms.append(run.update.step())
            require_finite(result.norms[-1], "gradient norm", step, run)
            # a finite gradient times a huge learning rate can still overflow the weights; found here, not as a
            # torch error inside the next step's sampling (the engine's norm: under ZeRO-3 module.parameters() are
            # empty placeholders, the weights are the ranks' partitions)
            require_finite(run.update.weight_norm(), "weight norm after the update", step, run)
    return result


def token_mean(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The mean over all tokens of micro-batches given as (sum, count) (for one, exactly its masked_mean)."""
    total = parts[0][0] if len(parts) == 1 else torch.stack([s for s, _ in parts]).sum()
    count = parts[0][1] if len(parts) == 1 else torch.stack([c for _, c in parts]).sum()
    return float(total / count.clamp(min=1))


def token_count(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The number of tokens token_mean's mean of the same parts is over."""
    return float(torch.stack([c for _, c in parts]).sum())


def require_finite(value: float, what: str, step: int, run: Run) -> None:
    if not math.isfinite(value):
        run.tracker.set_tags({T.NONFINITE_STEP: str(step)})
        last = checkpoint.latest(run.run_dir)
        kept = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
        raise RlvrlabError(f"step {step}: the {what} is {value}; run {run.tracker.run_id} is marked FAILED and "
                           f"{kept}; lower trainer.lr or check the rewards")
