"""The training loop, top to bottom. One step:

    generate (policy of step t - staleness) -> verify -> advantages -> ppo_epochs x mini-batches of policy-loss
    updates through the update engine -> push weights to the rollout engine -> metrics -> checkpoint

Run it with `rlvrlab train`; `train(cfg)` is the library entry point (sweeps call it in-process). What each stage
does is in its own module: rlvrlab.train.rollouts (sampling, verifying, the trainer's log-probs),
rlvrlab.train.optimize (rollout correction, advantages, the update), rlvrlab.train.step_stats (the step's
statistics), rlvrlab.train.lifecycle (resume, extension, how a run ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rlvrlab import outputs, rundir
from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import RlvrlabError
from rlvrlab.procs import raise_if_stop_requested, stop_at_safe_points
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.store import check_reachable, store
from rlvrlab.tracking.testbed import Testbed
from rlvrlab.train import checkpoint
from rlvrlab.train.batch import Behaviour, RolloutBatch, TrainerLogp
from rlvrlab.train.checkpoint import TrainState
from rlvrlab.train.lifecycle import (
    NothingLeft,
    RunInterrupted,
    RunStopped,
    extension_notes,
    fault_injection,
    kill_after_step,
    nothing_left_or_extension,
    record_extension,
    resume_point,
    stderr_warning,
    stopped_by_storage,
    storage_trouble,
    tag_failure,
    toy_threads,
)
from rlvrlab.train.metrics import step_metrics
from rlvrlab.train.optimize import correct_rollouts, update_policy, update_rows
from rlvrlab.train.rollouts import generate, weights_rewritten_before_next_generate
from rlvrlab.train.setup import Run, build
from rlvrlab.train.stats import StepStats, Timings
from rlvrlab.train.step_stats import heldout_over_ranks, step_stats
from rlvrlab.update.dist import world

__all__ = ["NothingLeft", "OnStep", "RunInterrupted", "RunStopped", "logs_step", "train", "train_step"]

# on_step(step, batch, run, stats): after every step; stats is None on the steps that log nothing (logs_step)
OnStep = Callable[[int, RolloutBatch, Run, "StepStats | None"], None]


def train(cfg: RunConfig, *, resume: str | None = None, on_step: OnStep | None = None, progress=None,
          tags: dict[str, str] | None = None, warn: Callable[[str], None] | None = None,
          testbed: Testbed | None = None) -> str:
    """Run cfg.steps steps (or continue run `resume` from its newest intact checkpoint); returns the MLflow run id.
    tags: extra MLflow tags for a new run (sweeps nest seed runs under their trial with mlflow.parentRunId).
    testbed: a protocol's fixed initial model (--protocol), checked before the run is created (rlvrlab.tracking.
    testbed).
    warn: where a one-line warning goes (a damaged checkpoint skipped); default stderr.
    One process trains a run at a time (rlvrlab.outputs.RunLock); a resumed run's records change only once its
    lock is held and its checkpoint is known to be intact."""
    warn = warn or stderr_warning
    output_dir = outputs.check_dir(cfg.output_dir, f"output_dir={cfg.output_dir}")
    rank, _ = world()
    if rank == 0 and cfg.tracking.backend == "mlflow":  # in seconds, not after the model is built (or never)
        check_reachable(store(output_dir, cfg.tracking.uri).uri)
    lock = None
    folder = None
    extended_from: int | None = None
    notes: list[str] = []
    if resume:
        run_folder = rundir.run_dir(output_dir, resume)
        lock = outputs.RunLock(run_folder, resume).acquire() if rank == 0 else None
        try:
            folder = resume_point(run_folder, resume, warn)  # before build() marks the MLflow run RUNNING
            extended_from = nothing_left_or_extension(cfg, resume, folder, run_folder)
            notes = extension_notes(run_folder)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
    try:
        with stop_at_safe_points(), toy_threads(cfg):  # the first Ctrl-C or SIGTERM: between steps (rlvrlab.procs)
            run = build(cfg, run_id=resume, tags=tags, testbed=testbed)
            if rank == 0 and lock is None:
                lock = outputs.RunLock(run.run_dir, run.tracker.run_id).acquire()
            if resume:
                record_extension(run, notes, extended_from)
            try:
                return _run_steps(run, cfg, folder, on_step, progress)
            except Exception as error:
                trouble = storage_trouble(error)  # a full disk, a held store, a store that vanished
                if trouble is None:
                    raise
                raise stopped_by_storage(run, error, trouble) from None
    finally:
        if lock is not None:
            lock.release()


def _run_steps(run: Run, cfg: RunConfig, folder: Path | None, on_step, progress) -> str:
    status = "FAILED"
    state = TrainState()
    records_kept = False  # a resume that cannot read its checkpoint leaves the run's records as they were
    try:
        if folder is not None:
            try:
                state = checkpoint.restore(run, folder)
            except Exception as error:  # a checkpoint written before checksums existed, damaged
                records_kept = True
                status = run.tracker.prior_status if hasattr(run.tracker, "prior_status") else "FAILED"
                raise RlvrlabError(f"run {run.tracker.run_id}: checkpoint {folder} cannot be read "
                                   f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                                   f"its records are unchanged (MLflow status {status})") from None
        kill_after = kill_after_step()
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
            fault_injection(step, kill_after)
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
    except Exception as error:  # whatever raised: the FAILED run says why (rlvrlab.tracking.tags.FAIL_REASON)
        if status == "FAILED" and not records_kept:
            tag_failure(run, error)
        raise
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


def _evaluate(run: Run, step: int) -> dict[str, float]:
    """trainer.eval_every's evaluation of the policy after `step` updates; the first time the held-out group signal
    falls below its floor, the run is tagged with that step."""
    assert run.heldout is not None  # built exactly when trainer.eval_every is set (rlvrlab.train.heldout.make)
    from rlvrlab.train.heldout import regime_check

    metrics = heldout_over_ranks(run.heldout.evaluate(run, step))  # the same on every rank
    in_regime = regime_check(metrics)
    if in_regime is not None:
        metrics["eval/heldout/in_regime"] = float(in_regime)
        if not in_regime and not run.left_regime:
            run.left_regime = True
            run.tracker.set_tags({T.LEFT_REGIME_STEP: str(step)})
    return metrics


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
    sampled = state.queue.popleft()
    batch, trainer = sampled.batch, sampled.trainer
    # vLLM on GPU frees its KV cache for the update; the sync below wakes it
    run.rollout.sleep(keep_weights=not weights_rewritten_before_next_generate(cfg))

    # 2. verl's rollout correction (importance weights, rejection), then advantages from outcome rewards (on each
    #    response's last token) and the behaviour log-probs.
    correction, kept, weights = None, None, None
    if run.algorithm.rollout_correction is not None:
        assert trainer is not None  # rollout correction implies Behaviour.SAMPLER_PASS
        kept, weights, correction = correct_rollouts(run, batch, trainer.raw)
    rows, adv_inputs = update_rows(run, batch, trainer, sampled.reference, kept_mask=kept, is_weights=weights)

    # 3. Policy updates through the update engine.
    update_start = time.perf_counter()
    update = update_policy(run, rows, step, with_stats=with_stats)
    t.update = time.perf_counter() - update_start
    if rows.source is Behaviour.UPDATE_FORWARD:  # the update's own forward gave the behaviour log-probs
        assert update.behaviour is not None
        trainer = TrainerLogp(update.behaviour, update.behaviour)  # temperature 1 (rollouts.behaviour_source)
        adv_inputs = replace(adv_inputs, old_logp=trainer.behaviour)
    assert trainer is not None  # Behaviour.SAMPLER_PASS: the sampler pass's, queued with the batch

    # 4. The rollout engine samples the next batch from the updated weights.
    sync_start = time.perf_counter()
    run.rollout.sync_weights(run.update.weights())
    t.sync = time.perf_counter() - sync_start
    t.step = time.perf_counter() - start
    if not with_stats:
        return None, batch

    # 5. Statistics of the consumed batch (means over ranks) and of the update.
    return step_stats(run, step, batch, trainer, adv_inputs, update, correction, t), batch
