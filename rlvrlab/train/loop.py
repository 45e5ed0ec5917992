"""The training loop, top to bottom. One step:

    generate (policy of step t - staleness) -> verify -> advantages -> ppo_epochs x mini-batches of policy-loss
    updates through the update engine -> push weights to the rollout engine -> metrics -> checkpoint

Run it with `rlvrlab train`; `train(cfg)` is the library entry point (sweeps call it in-process).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlvrlab import outputs, rundir
from rlvrlab.algorithms import (
    ADVANTAGES,
    AdvantageInputs,
    Aggregation,
    BoundAlgorithm,
    LossInputs,
    correct_set_stats,
    groups_with_signal,
    masked_sum,
    mismatch_kl,
    overlong_penalty,
)
from rlvrlab.config.rules import overlong_buffer_tokens
from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import RlvrlabError, StorageError
from rlvrlab.procs import raise_if_stop_requested, stop_at_safe_points
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.store import check_reachable, store
from rlvrlab.train import checkpoint
from rlvrlab.train.batch import (
    RolloutBatch,
    collate,
    logp_and_entropy,
    micro_batches,
    packing_budget,
    row_order,
    shuffled_rows,
    split_to,
    stream_problems,
)
from rlvrlab.train.checkpoint import TrainState
from rlvrlab.train.metrics import step_metrics
from rlvrlab.train.setup import Run, build
from rlvrlab.train.stats import LossStatsMean, StepStats, Timings, correct_set_means, group_outcomes, sign_counts
from rlvrlab.update.base import clipped_norm, total_norm
from rlvrlab.update.dist import all_max, all_sum, world

# on_step(step, batch, run, stats): after every step; stats is None on the steps that log nothing (logs_step)
OnStep = Callable[[int, RolloutBatch, Run, "StepStats | None"], None]


class RunStopped(Exception):
    """Raised by an on_step callback to end a run early on purpose (a sweep's pruner); the MLflow run ends KILLED."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (rlvrlab.procs.install_stop_handlers) stopped a run: its MLflow run ended KILLED and its
    checkpoints stay; `rlvrlab train --resume run_id` continues it from `checkpoint_step` (None: none saved yet)."""

    def __init__(self, run_id: str, step: int, checkpoint_step: int | None):
        super().__init__(run_id)
        self.run_id, self.step, self.checkpoint_step = run_id, step, checkpoint_step


class NothingLeft(Exception):
    """`--resume` of a FINISHED run (or, tracking.backend=none, any run) that has trained all its steps: nothing was
    done and its records are unchanged."""

    def __init__(self, run_id: str, steps: int):
        super().__init__(run_id)
        self.run_id, self.steps = run_id, steps


def train(cfg: RunConfig, *, resume: str | None = None, on_step: OnStep | None = None, progress=None,
          tags: dict[str, str] | None = None, warn: Callable[[str], None] | None = None) -> str:
    """Run cfg.steps steps (or continue run `resume` from its newest intact checkpoint); returns the MLflow run id.
    tags: extra MLflow tags for a new run (sweeps nest seed runs under their trial with mlflow.parentRunId).
    warn: where a one-line warning goes (a damaged checkpoint skipped); default stderr.
    One process trains a run at a time (rlvrlab.outputs.RunLock); a resumed run's records change only once its
    lock is held and its checkpoint is known to be intact."""
    warn = warn or _stderr_warning
    output_dir = outputs.check_dir(cfg.output_dir, f"output_dir={cfg.output_dir}")
    rank, _ = world()
    if rank == 0 and cfg.tracking.backend == "mlflow":  # in seconds, not after the model is built (or never)
        check_reachable(store(output_dir, cfg.tracking.uri).uri)
    lock = None
    folder = None
    extended_from, notes = None, []
    if resume:
        run_folder = rundir.run_dir(output_dir, resume)
        lock = outputs.RunLock(run_folder, resume).acquire() if rank == 0 else None
        try:
            folder = _resume_point(run_folder, resume, warn)  # before build() marks the MLflow run RUNNING
            extended_from = _nothing_left_or_extension(cfg, resume, folder, run_folder)
            notes = [line for line in rundir.config_file(run_folder).read_text().splitlines()
                     if line.startswith(EXTENSION_NOTE)]
        except BaseException:
            if lock is not None:
                lock.release()
            raise
    try:
        with stop_at_safe_points(), _toy_threads(cfg):  # the first Ctrl-C or SIGTERM: between steps (rlvrlab.procs)
            run = build(cfg, run_id=resume, tags=tags)
            if rank == 0 and lock is None:
                lock = outputs.RunLock(run.run_dir, run.tracker.run_id).acquire()
            if resume:
                _record_extension(run, notes, extended_from)
            try:
                return _run_steps(run, cfg, folder, on_step, progress)
            except Exception as error:
                trouble = outputs.full_or_held(error)
                if trouble is None:
                    raise
                raise _stopped_by_storage(run, error, trouble) from None
    finally:
        if lock is not None:
            lock.release()


def _run_steps(run: Run, cfg: RunConfig, folder: Path | None, on_step, progress) -> str:
    status = "FAILED"
    state = TrainState()
    try:
        if folder is not None:
            try:
                state = checkpoint.restore(run, folder)
            except Exception as error:  # a checkpoint written before checksums existed, damaged
                status = run.tracker.prior_status if hasattr(run.tracker, "prior_status") else "FAILED"
                raise RlvrlabError(f"run {run.tracker.run_id}: checkpoint {folder} cannot be read "
                                   f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                                   f"its records are unchanged (MLflow status {status})") from None
        kill_after = _kill_after_step()
        for step in range(state.step, cfg.steps):
            raise_if_stop_requested()  # Ctrl-C or SIGTERM: a run stops between steps, never inside one
            evaluated = _evaluate(run, step) if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 else None
            stats, batch = train_step(run, state, step, with_stats=logs_step(cfg, step))
            state.step = step + 1
            if stats is not None:
                stats.heldout = evaluated
                run.tracker.log_metrics(step, step_metrics(stats))
            elif evaluated is not None:
                run.tracker.log_metrics(step, evaluated)
            if on_step is not None:
                on_step(step, batch, run, stats)
            if progress is not None:
                progress(step, stats)
            every = cfg.trainer.checkpoint_every
            if every and (state.step % every == 0 or state.step == cfg.steps):
                # the metrics so far are written while the checkpoint is; the checkpoint is marked COMPLETE only
                # once they are stored, so that a kill or a full disk never leaves a checkpoint ahead of them (a
                # resume from it would leave a hole in every metric)
                run.tracker.flush(wait=False)
                checkpoint.save(run, state, before_complete=run.tracker.flush)
            _fault_injection(step, kill_after)
        if state.step == cfg.steps and run.heldout is not None:  # the final policy, logged at step `steps`
            run.tracker.log_metrics(cfg.steps, _evaluate(run, cfg.steps))
        status = "FINISHED"
    except RunStopped:
        status = "KILLED"
        raise
    except KeyboardInterrupt:  # the first signal at a safe point, or a second one at once (rlvrlab.procs)
        status = "KILLED"
        last = checkpoint.latest(run.run_dir)
        raise RunInterrupted(run.tracker.run_id, state.step,
                             checkpoint.step_of(last) if last else None) from None
    finally:
        try:
            run.tracker.finish(status)  # flushes every step logged so far
            run.rollout.close()
        finally:
            try:
                run.verifier.close()
            finally:
                run.update.close()
    return run.tracker.run_id


def logs_step(cfg: RunConfig, step: int) -> bool:
    """Whether step metrics are logged at `step` (0-based): steps 0, n, 2n, ... of tracking.log_every = n, each of
    the last tracking.log_last = m steps, and the last step. Only these steps compute their statistics
    (train_step's with_stats)."""
    return step % cfg.tracking.log_every == 0 or step >= cfg.steps - max(cfg.tracking.log_last, 1)


def _evaluate(run: Run, step: int) -> dict[str, float] | None:
    """trainer.eval_every's evaluation of the policy after `step` updates (None when off); the first time the
    held-out group signal falls below its floor, the run is tagged with that step."""
    if run.heldout is None:
        return None
    from rlvrlab.train.heldout import regime_check

    metrics = run.heldout.evaluate(run, step)
    in_regime = regime_check(metrics)
    if in_regime is not None:
        metrics["eval/heldout/in_regime"] = float(in_regime)
        if not in_regime and not run.left_regime:
            run.left_regime = True
            run.tracker.set_tags({T.LEFT_REGIME_STEP: str(step)})
    return metrics


@contextmanager
def _toy_threads(cfg: RunConfig) -> Iterator[None]:
    """The toy tier's tensors are a few hundred numbers: one torch thread. More threads only wake and spin for every
    op, 2-100x slower per op, worst on a loaded machine (bench/README.md, toy-tier sweeps)."""
    if cfg.model.tier != "toy" or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _stopped_by_storage(run: Run, error: Exception, trouble: str) -> StorageError:
    """A full disk or a held store stopped the run: one line saying what, from where it continues and how. What is
    stored stays: a checkpoint is COMPLETE only once the metrics of its steps are stored, and its files are checked
    before a resume reads them."""
    what = error.what if isinstance(error, StorageError) else (
        ("no space left on the device" if trouble == "full" else "the MLflow store is locked by another process")
        + f" ({type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''})")
    last = checkpoint.latest(run.run_dir)
    command = shlex.join(["rlvrlab", "train", "--resume", run.tracker.run_id, f"output_dir={run.cfg.output_dir}"])
    then = (f"`{command}` continues it from step {checkpoint.step_of(last)}, its newest complete checkpoint"
            if last else "train it again (no checkpoint was complete)")
    fix = "free space there" if trouble == "full" else "wait for the process holding it to end"
    return StorageError(f"run {run.tracker.run_id} stopped: {what}; {fix}, then {then}", what=what)


def _stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _resume_point(run_folder: Path, run_id: str, warn: Callable[[str], None]) -> Path:
    """The newest checkpoint whose files match their checksums; damaged newer ones are skipped with a warning."""
    good, bad = rundir.intact(run_folder)
    where = run_folder / rundir.CHECKPOINTS
    if not good:
        if bad:
            raise RlvrlabError(f"run {run_id} cannot be resumed: {rundir.damage_note(bad)} and no intact one is left "
                               f"in {where}; its records are unchanged")
        raise RlvrlabError(f"run {run_id} has no complete checkpoint in {where}; it cannot be resumed (set "
                           "trainer.checkpoint_every > 0 for future runs)")
    newer = [(f, problem) for f, problem in bad if rundir.step_of(f) > rundir.step_of(good[-1])]
    if newer:
        warn(f"run {run_id}: {rundir.damage_note(newer)}; resuming from the newest intact one, {good[-1].name}")
    return good[-1]


def _nothing_left_or_extension(cfg: RunConfig, run_id: str, folder: Path, run_folder: Path) -> int | None:
    """Raise NothingLeft for a FINISHED run whose checkpoint holds all its steps; else the steps the run had before
    this resume when steps= extends it (None when it keeps its steps)."""
    from rlvrlab.config.compose import compose

    saved = compose(rundir.config_file(run_folder)).steps
    if rundir.step_of(folder) >= cfg.steps:
        if cfg.tracking.backend == "none":  # no records a resume could finish: the checkpoint holds every step
            raise NothingLeft(run_id, cfg.steps)
        from rlvrlab.tracking.mlflow_tracker import quiet_client

        try:
            status = quiet_client(store(cfg.output_dir, cfg.tracking.uri).uri).get_run(run_id).info.status
        except Exception:  # no such run: build() says so in one line
            status = None
        if status == "FINISHED":
            raise NothingLeft(run_id, cfg.steps)
    return saved if cfg.steps > saved else None


def _record_extension(run: Run, notes: list[str], extended_from: int | None) -> None:
    """A run extended by --resume steps=N: the MLflow run says from how many steps (its steps param stays the
    one it started with), and config.yaml keeps one comment line per extension above the config (build() has just
    rewritten it with the new steps)."""
    if extended_from is not None:
        notes = [*notes, f"{EXTENSION_NOTE} {extended_from} to {run.cfg.steps} at "
                         f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}"]
    if not notes or run.rank != 0:
        return
    config = rundir.config_file(run.run_dir)
    outputs.write_replacing(config, "\n".join(notes) + "\n" + config.read_text())  # whole or as it was
    if extended_from is not None:
        froms = [line.removeprefix(EXTENSION_NOTE).split()[0] for line in notes]
        run.tracker.set_tags({T.STEPS_EXTENDED_FROM: ",".join(froms), T.STEPS: str(run.cfg.steps)})


EXTENSION_NOTE = "# resume: steps extended from"


def train_step(run: Run, state: TrainState, step: int, *,
               with_stats: bool = True) -> tuple[StepStats | None, RolloutBatch]:
    """One step; returns its statistics and the batch it consumed. with_stats=False: the same update, without the
    diagnostics that only the statistics read (the loss's, the batch's, the toy table's); the statistics are None.
    The same on every rank (the statistics are reduced over ranks)."""
    cfg, t = run.cfg, Timings()
    start = time.perf_counter()

    # 1. Rollouts. The queue holds staleness + 1 batches: the one consumed now was generated at step t - s
    #    (the first s steps consume batches of the initial policy, so their lag is t).
    while len(state.queue) <= cfg.trainer.staleness:
        state.queue.append(generate(run, state, version=step, timings=t))
    batch = state.queue.popleft()
    # vLLM on GPU frees its KV cache for the update; the sync below wakes it
    run.rollout.sleep(keep_weights=not weights_rewritten_before_next_generate(cfg))

    # 2. verl's rollout correction (importance weights, rejection), then advantages from outcome rewards (on each
    #    response's last token) and the behaviour log-probs.
    correction = correct_rollouts(run, batch) if run.algorithm.rollout_correction is not None else None
    adv_inputs = set_advantages(run.algorithm, batch)

    # 3. Policy updates through the update engine.
    update_start = time.perf_counter()
    update = update_policy(run, batch, step, with_stats=with_stats)
    t.update = time.perf_counter() - update_start
    if batch.old_logp is None:  # reuse_update_logp: the update's own forward gave the behaviour log-probs
        batch.old_logp = batch.raw_logp = _in_batch_order(torch.cat(update.logps), update.order)
        adv_inputs = dataclasses.replace(adv_inputs, old_logp=batch.old_logp)

    # 4. The rollout engine samples the next batch from the updated weights.
    sync_start = time.perf_counter()
    run.rollout.sync_weights(run.update.weights())
    t.sync = time.perf_counter() - sync_start
    t.step = time.perf_counter() - start
    if not with_stats:
        return None, batch

    # 5. Statistics of the consumed batch (means over ranks) and of the update.
    solved, signal_share = group_outcomes(batch.rewards, batch.group_ids)
    h_q, max_q = correct_set_means(correct_set_stats(adv_inputs))
    gap = (batch.engine_logp - batch.raw_logp).abs() * batch.mask
    kl_k3, kl_k1 = mismatch_kl(batch.raw_logp, batch.engine_logp, batch.mask)
    outcome = all_sum(torch.tensor([batch.rewards.mean(), (batch.rewards > 0).float().mean(), solved, signal_share,
                                    batch.mask.sum(-1).mean()], dtype=torch.float64)) / run.world_size
    stats = StepStats(
        reward=float(outcome[0]), accuracy=float(outcome[1]), solved_groups=float(outcome[2]),
        signal_groups=float(outcome[3]), response_length=float(outcome[4]),
        policy_loss=float(np.mean(update.losses)), kl_ref=float(np.mean(update.kls)) if update.kls else None,
        entropy=float(np.mean(update.entropies)), grad_norm=float(np.mean(update.norms)),
        grad_norm_clipped=float(np.mean([clipped_norm(n, cfg.trainer.grad_clip) for n in update.norms])),
        loss=update.loss_stats.result(),
        correct_entropy=h_q, correct_max_q=max_q, lag=step - batch.version,
        logp_gap_max=float(gap.max()), logp_gap_mean=float(gap.sum() / batch.mask.sum()),
        mismatch_kl=kl_k3, mismatch_kl_k1=kl_k1,
        rollout_corr=correction,
        generated_batches=float(batch.generated_batches), filled_groups=float(batch.filled_groups),
        overlong_frac=float(batch.truncated.float().mean()) if batch.truncated is not None else 0.0,
        tokens_per_s=float(batch.mask.sum()) / max(batch.generate_seconds, 1e-9), timings=t,
        toy=run.toy_diagnostics() if run.toy_diagnostics is not None else None,
    )
    return stats, batch


def _token_mean(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The mean over all tokens of micro-batches given as (sum, count) (for one, exactly its masked_mean)."""
    total = parts[0][0] if len(parts) == 1 else torch.stack([s for s, _ in parts]).sum()
    count = parts[0][1] if len(parts) == 1 else torch.stack([c for _, c in parts]).sum()
    return float(total / count.clamp(min=1))


def correct_rollouts(run: Run, batch: RolloutBatch) -> dict[str, float]:
    """verl's rollout correction of this step's batch before its advantages, as verl's trainer applies it
    (algorithm.tis_level, algorithm.rollout_rs; run.algorithm.rollout_correction): sets batch.is_weights and
    batch.kept_mask (the response mask after rejection) and returns the metrics. pi_trainer is the behaviour
    log-prob at temperature 1. Over every rank's rows together, so that batch normalisation and the metrics are the
    global batch's, the same on every rank."""
    behaviour = batch.raw_logp if batch.raw_logp is not None else batch.old_logp
    assert behaviour is not None and run.algorithm.rollout_correction is not None  # reuse_update_logp is off
    (trainer, engine, mask), mine = _global_rows(run, behaviour, batch.engine_logp, batch.mask)
    out = run.algorithm.rollout_correction(trainer, engine, mask)
    width = batch.mask.shape[1]
    batch.kept_mask = out.mask[mine, :width]
    batch.is_weights = None if out.weights is None else out.weights[mine, :width]
    return out.metrics


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


def set_advantages(algo: BoundAlgorithm, batch: RolloutBatch) -> AdvantageInputs:
    """Fill batch.adv [B, T]; returns the estimator's inputs (the correct-set statistics reuse them)."""
    lengths = batch.mask.sum(-1).long()  # [B]
    token_rewards = torch.zeros_like(batch.mask)  # [B, T]
    token_rewards[torch.arange(len(batch)), lengths - 1] = batch.rewards
    mask = batch.mask if batch.kept_mask is None else batch.kept_mask  # after rejection sampling, as verl's
    inputs = AdvantageInputs(token_rewards, mask, batch.group_ids, old_logp=batch.old_logp,
                             response_keys=batch.response_keys())
    batch.adv = algo.advantage(inputs).advantages
    if algo.ent_adv is not None:
        batch.adv = algo.ent_adv(batch.adv, batch.old_entropy) * batch.mask
    return inputs


@dataclass
class UpdateResult:
    loss_stats: LossStatsMean = field(default_factory=LossStatsMean)
    # per optimizer step, over its mini-batch (not per micro-batch: the grouping into micro-batches does not matter)
    losses: list[float] = field(default_factory=list)  # policy term: the mini-batch's loss
    entropies: list[float] = field(default_factory=list)  # mean token entropy
    kls: list[float] = field(default_factory=list)  # mean k3 KL to the reference, when used
    norms: list[float] = field(default_factory=list)  # gradient norm of each optimizer step
    logps: list[torch.Tensor] = field(default_factory=list)  # detached [b, T] per micro-batch, reuse_update_logp only
    order: torch.Tensor | None = None  # logps concatenated -> batch order (row_order), when packed


def _in_batch_order(values: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    return values if order is None else values[order]


def _micro_batches(run: Run, batch: RolloutBatch, *, same_count_on_all_ranks: bool):
    """This batch's micro-batches (rlvrlab.train.batch.micro_batches). Packed by a token budget, their number can
    differ between ranks; for a backward pass every rank takes the largest (DeepSpeed reduces gradients in it)."""
    t = run.cfg.trainer
    tokens = t.micro_batch_tokens
    if tokens is None and t.pack_by_length:
        tokens = packing_budget(batch, t.micro_batch_size, run.cfg.rollout.max_new_tokens)
    parts = micro_batches(batch, rows=t.micro_batch_size, tokens=tokens, prompt_cache=run.shared_cache)
    if tokens is not None and same_count_on_all_ranks and run.world_size > 1:
        parts = split_to(parts, all_max(len(parts)))
    return parts


def update_policy(run: Run, batch: RolloutBatch, step: int, *, with_stats: bool = True) -> UpdateResult:
    """ppo_epochs passes over this process's rows, each split into mini-batches (one optimizer step each),
    each accumulated over micro-batches. Losses are normalised by the mini-batch's counts over all processes,
    so the update does not depend on how rows are split into micro-batches or processes. with_stats=False: the
    same update; the result holds the gradient norms only (no loss, entropy or KL means, no loss diagnostics), and
    the token entropy is not computed unless the loss has an entropy term."""
    cfg, algo, result = run.cfg, run.algorithm, UpdateResult()
    for epoch in range(cfg.trainer.ppo_epochs):
        if cfg.trainer.mini_batches > 1:
            minis = list(shuffled_rows(len(batch), seed=(cfg.seed, step, epoch)).chunk(cfg.trainer.mini_batches))
        else:
            minis = [slice(0, len(batch))]  # the whole batch, no copy
        for rows in minis:
            mini = batch.rows(rows)
            mini_mask = mini.loss_mask(drop_truncated=cfg.algorithm.overlong_filter)
            counts = all_sum(torch.tensor([mini_mask.sum(), (mini_mask.sum(-1) > 0).sum(), len(mini)],
                                          dtype=torch.float64))  # tokens, non-empty rows, rows
            agg = Aggregation(cfg.algorithm.agg, num_tokens=float(counts[0]), num_seqs=float(counts[1]),
                              num_rows=float(counts[2]), dp_size=run.world_size,
                              loss_scale_factor=cfg.algorithm.loss_scale_factor)
            parts = _micro_batches(run, mini, same_count_on_all_ranks=True)
            if batch.old_logp is None:  # reuse_update_logp: one mini-batch, the whole batch; its order back
                result.order = row_order(parts, len(mini))
            # per micro-batch: the policy term (its part of the mini-batch's loss); (sum, count) over its tokens of
            # the entropy and the KL to the reference, so that the logged means are the mini-batch's own, however its
            # rows were grouped into micro-batches
            mini_loss: list[float] = []
            mini_entropy: list[tuple[torch.Tensor, torch.Tensor]] = []
            mini_kl: list[tuple[torch.Tensor, torch.Tensor]] = []
            for i, micro_rows in enumerate(parts):
                x = mini.rows(micro_rows)
                logp, entropy = logp_and_entropy(run.update.module, x, temperature=cfg.rollout.temperature,
                                                 with_entropy=with_stats or algo.entropy_bonus is not None,
                                                 entropy_grad=algo.entropy_bonus is not None,
                                                 prompt_cache=run.shared_cache)
                old_logp = x.old_logp
                if old_logp is None:  # reuse_update_logp: the weights that sampled the batch are these, unchanged
                    old_logp = logp.detach()
                    result.logps.append(old_logp)
                mask = x.loss_mask(drop_truncated=cfg.algorithm.overlong_filter)
                out = algo.loss(LossInputs(logp, old_logp, x.adv, mask, is_weights=x.is_weights), agg)
                loss = out.loss
                if run.reference is not None:
                    loss = loss + algo.kl(logp, x.ref_logp, mask, agg)
                    if with_stats:
                        delta = (x.ref_logp - logp).detach()
                        mini_kl.append((masked_sum(torch.expm1(delta) - delta, mask), mask.sum()))
                if algo.entropy_bonus is not None:
                    loss = loss + algo.entropy_bonus(entropy, mask, agg)
                _require_finite(loss.item(), "loss", step, run)
                run.update.backward(loss, last=i == len(parts) - 1)
                if with_stats:  # the loss's diagnostics are computed here, on first read (LossOutput.stats)
                    result.loss_stats.add(out.stats, **sign_counts(x.adv, mask))
                    mini_loss.append(out.loss.item())
                    mini_entropy.append((masked_sum(entropy.detach(), x.mask), x.mask.sum()))
            if with_stats:
                result.losses.append(sum(mini_loss))
                result.entropies.append(_token_mean(mini_entropy))
            if mini_kl:
                result.kls.append(_token_mean(mini_kl))
            result.norms.append(run.update.step())
            _require_finite(result.norms[-1], "gradient norm", step, run)
            # a finite gradient times a huge learning rate can still overflow the weights; found here, not as a
            # torch error inside the next step's sampling
            weights = [p.detach() for p in run.update.module.parameters()]
            _require_finite(float(total_norm(weights)), "weight norm after the update", step, run)
    return result


@dataclass
class _Group:
    """One prompt's sampled responses with their verdicts (before collation)."""

    problem_id: str
    batch_index: int  # the data-stream batch it was sampled in
    generations: list
    scores: list[float]  # the verifier's
    rewards: list[float]  # scores plus DAPO's overlong penalty, when on
    truncated: list[bool]


def generate(run: Run, state: TrainState, *, version: int, timings: Timings) -> RolloutBatch:
    """Sample, verify and collate the next batch of the data stream (advancing state.next_batch); the trainer's
    log-probs of the generating weights go with it. With algorithm.dynamic_sampling (DAPO), groups whose verifier
    scores are all equal are set aside and further batches are sampled until every process's prompts are filled or
    algorithm.max_gen_batches batches were sampled; set-aside groups then fill what is missing (logged). Every
    process samples the same number of batches (one all-reduce after each): they keep one data position, log the
    same rollout/generated_batches and reach the update's collectives together, never one still sampling while
    another waits there; a process already filled keeps its first groups with signal, in sampling order."""
    cfg = run.cfg
    quota = cfg.rollout.prompts_per_step // run.world_size
    first, kept, spare, seconds_before = state.next_batch, [], [], timings.generate
    while True:
        groups = _sample_groups(run, state.next_batch, timings)
        state.next_batch += 1
        if not cfg.algorithm.dynamic_sampling:
            kept = groups
            break
        signal = set(groups_with_signal([i for i, g in enumerate(groups) for _ in g.scores],
                                        np.asarray([s for g in groups for s in g.scores], dtype=np.float64)))
        for i, g in enumerate(groups):
            (kept if i in signal and len(g.scores) > 1 else spare).append(g)
        if state.next_batch - first >= cfg.algorithm.max_gen_batches:  # the same count on every rank
            break
        if not all_max(int(len(kept) < quota), "DAPO's dynamic sampling (does a rank need another batch?)"):
            break
    filled = max(0, quota - len(kept))
    chosen = kept[:quota] + spare[:filled]
    # one group per sampled prompt: a prompt sampled again in a later batch is its own group (as verl's uids)
    ids: list[str] = []
    for g in chosen:
        ids.append(g.problem_id if g.problem_id not in ids else f"{g.problem_id}@{g.batch_index}")
    device = next(run.update.module.parameters()).device
    batch = collate([g.generations for g in chosen], ids,
                    [r for g in chosen for r in g.rewards], pad_id=run.pad_id, version=version, batch_index=first,
                    scores=[x for g in chosen for x in g.scores],
                    truncated=[x for g in chosen for x in g.truncated]).to(device)
    batch.generate_seconds = timings.generate - seconds_before
    batch.generated_batches, batch.filled_groups = state.next_batch - first, filled

    # vLLM on a GPU gives the device back before the trainer's log-prob pass and update
    run.rollout.sleep(keep_weights=not weights_rewritten_before_next_generate(cfg))
    tic = time.perf_counter()
    temperature, old, raw, ref, ent = cfg.rollout.temperature, [], [], [], []
    reuse = reuse_update_logp(cfg)
    share = run.shared_cache
    parts = _micro_batches(run, batch, same_count_on_all_ranks=False) if not reuse or run.reference is not None else []
    with torch.no_grad():
        for rows in parts:
            x = batch.rows(rows)
            if not reuse:
                logp, entropy = logp_and_entropy(run.update.module, x, temperature=temperature,
                                                 with_entropy=run.algorithm.ent_adv is not None, prompt_cache=share)
                old.append(logp)
                ent.append(entropy)
                raw.append(logp if temperature == 1.0 else logp_and_entropy(run.update.module, x, temperature=1.0,
                                                                             with_entropy=False, prompt_cache=share)[0])
            if run.reference is not None:
                ref.append(logp_and_entropy(run.reference, x, temperature=temperature, with_entropy=False,
                                            prompt_cache=share)[0])
    order = row_order(parts, len(batch))
    if not reuse:
        batch.old_logp, batch.raw_logp = (_in_batch_order(torch.cat(values), order) for values in (old, raw))
        if run.algorithm.ent_adv is not None:  # Ent-Adv's shaping is the one reader of the behaviour entropy
            batch.old_entropy = _in_batch_order(torch.cat(ent), order)
    batch.ref_logp = _in_batch_order(torch.cat(ref), order) if ref else None
    timings.logp += time.perf_counter() - tic
    return batch


def _sample_groups(run: Run, batch_index: int, timings: Timings) -> list[_Group]:
    """Batch `batch_index` of this process's prompts: n responses each, verified, shaped."""
    cfg, r, a = run.cfg, run.cfg.rollout, run.cfg.algorithm
    buffer = overlong_buffer_tokens(cfg)
    problems = stream_problems(run.problems, seed=cfg.seed, batch_index=batch_index, per_batch=r.prompts_per_step,
                               rank=run.rank, world=run.world_size)
    seed = int(np.random.SeedSequence([cfg.seed, batch_index, run.rank]).generate_state(1)[0])
    tic = time.perf_counter()
    groups = run.rollout.generate([run.prompt_ids(p) for p in problems], n=r.group_size, seed=seed)
    generate_time = time.perf_counter() - tic
    verdicts = run.verifier.score([g.text for group in groups for g in group],
                                  [p.answer for p, group in zip(problems, groups) for _ in group])
    timings.verify += time.perf_counter() - tic - generate_time
    timings.generate += generate_time
    out, position = [], 0
    for problem, gens in zip(problems, groups):
        scores = [v.score for v in verdicts[position:position + len(gens)]]
        position += len(gens)
        rewards = scores  # collate makes them float32, as the penalty's sum below is
        if buffer > 0:
            lengths = torch.tensor([len(g.response_ids) for g in gens])
            rewards = (torch.tensor(scores, dtype=torch.float32)
                       + overlong_penalty(lengths, max_len=r.max_new_tokens, buffer_len=buffer,
                                          factor=a.overlong_penalty)).tolist()
        truncated = [run.eos_id is not None and len(g.response_ids) >= r.max_new_tokens
                     and (not g.response_ids or g.response_ids[-1] != run.eos_id) for g in gens]
        out.append(_Group(problem.id, batch_index, list(gens), scores, list(rewards), truncated))
    return out


def reuse_update_logp(cfg: RunConfig) -> bool:
    """True when the no-grad pass for the behaviour log-probs can be skipped: one optimizer step per batch on
    fresh rollouts (ppo_epochs 1, mini_batches 1, staleness 0) makes them equal to the update's own forward pass
    before the step, bit for bit (tests/train/test_train_tiny.py); at temperature 1 they are also the log-probs compared
    with the engine's; and nothing reads them before the update (no estimator with reads_old_logp, no Ent-Adv, no
    rollout correction). TRL skips the same pass in this case; here it was 19% of a tiny-tier step
    (bench/README.md)."""
    t, a = cfg.trainer, cfg.algorithm
    return (t.ppo_epochs == 1 and t.mini_batches == 1 and t.staleness == 0 and cfg.rollout.temperature == 1.0
            and not ADVANTAGES[a.estimator].reads_old_logp and a.ent_adv_alpha == 0
            and a.tis_level == "none" and a.rollout_rs is None)


def weights_rewritten_before_next_generate(cfg: RunConfig) -> bool:
    """True when every sleep of the rollout engine is followed by a sync of every weight before its next generate,
    so the engine may drop its weights while asleep (vLLM's sleep level 2) instead of copying them to host memory.

    At staleness 0 a step generates one batch, sleeps, updates and syncs the update engine's full state dict
    (UpdateEngine.weights()); held-out evaluation samples after the sync. At staleness s > 0 the first step generates
    s + 1 batches back to back, each followed by a sleep and none by a sync, so the weights must be kept.
    tests/rollout/test_vllm_sleep.py records the calls of real runs to hold the loop to this; on a GPU the
    rollout/logp_gap_max the step logs (engine vs trainer log-probs of the tokens just sampled) shows that what the
    sync wrote is what the engine samples from."""
    return cfg.trainer.staleness == 0


def _require_finite(value: float, what: str, step: int, run: Run) -> None:
    if not math.isfinite(value):
        run.tracker.set_tags({T.NONFINITE_STEP: str(step)})
        last = checkpoint.latest(run.run_dir)
        kept = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
        raise RlvrlabError(f"step {step}: the {what} is {value}; run {run.tracker.run_id} is marked FAILED and "
                           f"{kept}; lower trainer.lr or check the rewards")


def _kill_after_step() -> str | None:
    """RLVRLAB_KILL_AFTER_STEP=k: SIGKILL this process right after step k (tests of resume after a crash); read
    once per run, not at every step."""
    return os.environ.get("RLVRLAB_KILL_AFTER_STEP")


def _fault_injection(step: int, kill_after: str | None) -> None:
    if kill_after == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
