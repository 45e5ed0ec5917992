"""A step's rollouts: sample prompts' responses, verify and shape their rewards, collate them, and take the trainer's
log-probs of the sampled tokens (the behaviour policy's, and the reference policy's when a KL term is on)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from rlvrlab.algorithms import ADVANTAGES, groups_with_signal, overlong_penalty
from rlvrlab.config.rules import overlong_buffer_tokens
from rlvrlab.config.schema import RunConfig
from rlvrlab.rollout.base import Generation
from rlvrlab.train.batch import Behaviour, RolloutBatch, Sampled, TrainerLogp, collate, stream_problems
from rlvrlab.train.checkpoint import TrainState
from rlvrlab.train.logprobs import logp_and_entropy
from rlvrlab.train.optimize import in_batch_order, run_micro_batches
from rlvrlab.train.packing import row_order
from rlvrlab.train.setup import Run
from rlvrlab.train.stats import Timings
from rlvrlab.update.dist import all_max


def behaviour_source(cfg: RunConfig) -> Behaviour:
    """UPDATE_FORWARD when the no-grad pass can be skipped: one optimizer step per batch on fresh rollouts
    (ppo_epochs 1, mini_batches 1, staleness 0) makes the behaviour log-probs equal to the update's own forward pass
    before the step, bit for bit (tests/train/test_train_tiny.py); at temperature 1 they are also the log-probs
    compared with the engine's; and nothing reads them before the update (no estimator with reads_old_logp, no
    Ent-Adv, no rollout correction). TRL's GRPOTrainer makes the same choice (`old_per_token_logps =
    per_token_logps.detach()` when it has none); the pass costs a forward per batch (bench/README.md, tiny tier)."""
    t, a = cfg.trainer, cfg.algorithm
    fresh = (t.ppo_epochs == 1 and t.mini_batches == 1 and t.staleness == 0 and cfg.rollout.temperature == 1.0
             and not ADVANTAGES[a.estimator].reads_old_logp and a.ent_adv_alpha == 0
             and a.tis_level == "none" and a.rollout_rs is None)
    return Behaviour.UPDATE_FORWARD if fresh else Behaviour.SAMPLER_PASS


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


@dataclass
class _Group:
    """One prompt's sampled responses with their verdicts (before collation)."""

    problem_id: str
    batch_index: int  # the data-stream batch it was sampled in
    generations: list[Generation]
    scores: list[float]  # the verifier's
    rewards: list[float]  # scores plus DAPO's overlong penalty, when on
    truncated: list[bool]


def generate(run: Run, state: TrainState, *, version: int, timings: Timings) -> Sampled:
    """Sample, verify and collate the next batch of the data stream (advancing state.next_batch); the trainer's
    log-probs of the generating weights go with it. With algorithm.dynamic_sampling (DAPO), groups whose verifier
    scores are all equal are set aside and further batches are sampled until every process's prompts are filled or
    algorithm.max_gen_batches batches were sampled; set-aside groups then fill what is missing (logged). Every
    process samples the same number of batches (one all-reduce after each): they keep one data position, log the
    same rollout/generated_batches and reach the update's collectives together, never one still sampling while
    another waits there; a process already filled keeps its first groups with signal, in sampling order."""
    cfg = run.cfg
    quota = cfg.rollout.prompts_per_step // run.world_size
    first, seconds_before = state.next_batch, timings.generate
    kept: list[_Group] = []
    spare: list[_Group] = []
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
    batch = replace(batch, generate_seconds=timings.generate - seconds_before,
                    generated_batches=state.next_batch - first, filled_groups=filled)

    # vLLM on a GPU gives the device back before the trainer's log-prob pass and update
    run.rollout.sleep(keep_weights=not weights_rewritten_before_next_generate(cfg))
    tic = time.perf_counter()
    trainer, reference = _trainer_logp(run, batch)
    timings.logp += time.perf_counter() - tic
    return Sampled(batch, trainer, reference)


def _trainer_logp(run: Run, batch: RolloutBatch) -> tuple[TrainerLogp | None, torch.Tensor | None]:
    """The behaviour policy's log-probs (Behaviour.SAMPLER_PASS only) and the reference policy's (with a KL term),
    in no-grad passes over the batch's micro-batches."""
    temperature, share = run.cfg.rollout.temperature, run.shared_cache
    sampler_pass = behaviour_source(run.cfg) is Behaviour.SAMPLER_PASS
    if not sampler_pass and run.reference is None:
        return None, None
    parts = run_micro_batches(run, batch, same_count_on_all_ranks=False)
    old, raw, ref, ent = [], [], [], []
    with torch.no_grad():
        for rows in parts:
            x = batch.rows(rows)
            if sampler_pass:
                logp, entropy = logp_and_entropy(run.update.module, x, temperature=temperature,
                                                 with_entropy=run.algorithm.ent_adv is not None, prompt_cache=share)
                old.append(logp)
                if entropy is not None:  # with Ent-Adv, its one reader
                    ent.append(entropy)
                raw.append(logp if temperature == 1.0 else logp_and_entropy(run.update.module, x, temperature=1.0,
                                                                             with_entropy=False, prompt_cache=share)[0])
            if run.reference is not None:
                ref.append(logp_and_entropy(run.reference, x, temperature=temperature, with_entropy=False,
                                            prompt_cache=share)[0])
    order = row_order(parts, len(batch))
    trainer = None
    if sampler_pass:
        trainer = TrainerLogp(in_batch_order(torch.cat(old), order), in_batch_order(torch.cat(raw), order),
                              in_batch_order(torch.cat(ent), order) if ent else None)
    return trainer, in_batch_order(torch.cat(ref), order) if ref else None


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
