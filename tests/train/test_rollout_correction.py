"""verl's rollout correction in the trainer (rlvrlab.train.optimize.correct_rollouts): the importance weights and the
rejection mask reach the loss and its token count, the metrics keep verl's names, and over several ranks the
correction is the global batch's (tests/algorithms/test_reference_vectors.py holds the functions to verl's own)."""

import os
import socket
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlvrlab.algorithms import LossStats, bind_algorithm, parse_rejection, rollout_correction
from rlvrlab.config import compose
from rlvrlab.train.batch import TrainerLogp, collate
from rlvrlab.train.logprobs import logp_and_entropy
from rlvrlab.train.metrics import metric_names, step_metrics
from rlvrlab.train.optimize import correct_rollouts, update_policy, update_rows
from rlvrlab.train.setup import build
from rlvrlab.train.stats import StepStats, Timings

CORRECTION = ["algorithm.tis_level=token", "algorithm.tis_lower=0.8", "algorithm.tis_cap=1.25",
              "algorithm.tis_batch_normalize=true", "algorithm.rollout_rs=token_k1,seq_max_k2",
              "algorithm.rollout_rs_threshold=0.5_2.0,0.08"]


def _mismatched_batch(run, cfg):
    """One toy batch whose engine log-probs differ from the trainer's by seeded noise (the toy engine is exact)."""
    problems = run.problems[: cfg.rollout.prompts_per_step]
    groups = run.rollout.generate([run.prompt_ids(p) for p in problems], n=cfg.rollout.group_size, seed=1234)
    verdicts = run.verifier.score([g.text for group in groups for g in group],
                                  [p.answer for p, group in zip(problems, groups) for _ in group])
    batch = collate(groups, [p.id for p in problems], [v.score for v in verdicts], pad_id=run.pad_id, version=0,
                    batch_index=0)
    with torch.no_grad():
        logp, _ = logp_and_entropy(run.update.module, batch, temperature=1.0)
    noise = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(0)) * 0.25
    return replace(batch, engine_logp=logp + noise * batch.mask), TrainerLogp(logp, logp)


def test_weights_and_rejection_reach_the_loss_and_its_token_count(tmp_path: Path) -> None:
    """IcePop weights (normalised) and a chain of rejection options on a batch with a rollout mismatch: the batch
    carries rollout_correction's weights and mask, and the step's policy loss (clip loss at ratio 1, token-mean) is
    -sum(A w) over the kept tokens divided by their number, not by all response tokens."""
    cfg = compose("toy", [f"output_dir={tmp_path}", "trainer.checkpoint_every=0", *CORRECTION])
    run = build(cfg)
    try:
        batch, trainer = _mismatched_batch(run, cfg)
        kept_mask, is_weights, metrics = correct_rollouts(run, batch, trainer.raw)
        expected = rollout_correction(trainer.raw, batch.engine_logp, batch.mask, level="token", cap=1.25,
                                      lower=0.8, normalize=True,
                                      rejection=parse_rejection("token_k1,seq_max_k2", "0.5_2.0,0.08"))
        assert is_weights is not None and expected.weights is not None
        assert torch.equal(kept_mask, expected.mask) and torch.equal(is_weights, expected.weights)
        assert metrics == expected.metrics
        kept, tokens = float(kept_mask.sum()), float(batch.mask.sum())
        assert 0 < kept < tokens  # some tokens rejected, some kept
        assert bool(((is_weights == 0) & (kept_mask > 0)).any())  # IcePop zeroed some kept tokens

        rows, _ = update_rows(run, batch, trainer, None, kept_mask=kept_mask, is_weights=is_weights)
        assert torch.equal(rows.loss_mask(drop_truncated=False), kept_mask)
        assert bool((rows.adv[kept_mask == 0] == 0).all())  # the advantages see the rejected mask, as verl's
        result = update_policy(run, rows, step=0)
        loss = -float((rows.adv * is_weights * kept_mask).sum()) / kept
        assert result.losses[0] == pytest.approx(loss, abs=1e-6)
        assert abs(loss - (-float((rows.adv * is_weights * batch.mask).sum()) / tokens)) > 1e-4
    finally:
        run.tracker.finish("FINISHED")


def test_the_metrics_keep_verls_names_under_rollout_corr() -> None:
    out = rollout_correction(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.1, -1.5]]), torch.ones(1, 2),
                             level="sequence", rejection=parse_rejection("seq_sum_k3", "0.5"))
    plain = {f.name: 0.0 for f in fields(StepStats) if f.name not in ("loss", "timings", "lag", "toy", "rollout_corr")}
    stats = StepStats(**plain, loss=LossStats(**{f.name: 0.0 for f in fields(LossStats)}), lag=0,
                      timings=Timings(), rollout_corr=out.metrics)
    logged = {k: v for k, v in step_metrics(stats).items() if k.startswith("rollout_corr/")}
    assert logged == {f"rollout_corr/{k}": v for k, v in out.metrics.items()}
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_seq_sum_k3_masked_fraction",
            "rollout_corr/chi2_seq"} <= set(logged) <= set(metric_names())
    assert not any(k.startswith("rollout_corr/") for k in step_metrics(replace(stats, rollout_corr=None)))


def test_an_all_masked_icepop_batch_has_effective_sample_size_zero() -> None:
    """Every weight outside IcePop's window: verl divides by zero for the effective sample size; rlvrlab gives 0."""
    out = rollout_correction(torch.tensor([[3.0, 3.0]]), torch.zeros(1, 2), torch.ones(1, 2), level="token",
                             cap=2.0, lower=0.5)
    assert out.weights is not None and bool((out.weights == 0).all())
    assert out.metrics["rollout_is_eff_sample_size"] == 0.0 and out.metrics["rollout_is_oob_ratio"] == 1.0


# ---------------------------------------------------------------- several ranks

# rank -> its rows of one global batch (different response widths: 3 and 5 tokens)
RANK_ROWS = {0: ([[-0.5, -1.0, -0.2], [-0.3, -0.1, 0.0]], [[-0.4, -1.6, -0.2], [-0.9, -0.1, 0.0]],
                 [[1, 1, 1], [1, 1, 0]]),
             1: ([[-1.0, -0.5, -0.7, -0.1, -0.3], [-0.2, -0.2, -0.2, -0.2, 0.0], [-2.0, 0.0, 0.0, 0.0, 0.0]],
                 [[-1.1, -0.2, -0.7, -0.6, -0.3], [-0.2, -0.25, -0.2, -0.1, 0.0], [-0.5, 0.0, 0.0, 0.0, 0.0]],
                 [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])}


def _rank_batch(rank: int) -> SimpleNamespace:
    trainer, engine, mask = (torch.tensor(values) for values in RANK_ROWS[rank])
    return SimpleNamespace(raw_logp=trainer, engine_logp=engine, mask=mask.float())


def _algorithm():
    return bind_algorithm(compose(None, ["algorithm.tis_level=sequence", "algorithm.tis_batch_normalize=true",
                                         "algorithm.rollout_rs=token_k2,seq_mean_k1",
                                         "algorithm.rollout_rs_threshold=0.05,0.8_1.2"]).algorithm)


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        batch = _rank_batch(rank)
        run = SimpleNamespace(rank=rank, world_size=2, algorithm=_algorithm())
        kept, weights, metrics = correct_rollouts(run, batch, batch.raw_logp)  # type: ignore[arg-type]
        torch.save({"weights": weights, "kept": kept, "metrics": metrics}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_correct_the_global_batch(tmp_path: Path) -> None:
    """Batch-normalised sequence weights and rejection on 2 gloo ranks whose rows have different widths: each rank
    gets its rows of the one-process correction of all rows, and the same metrics."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(port, str(tmp_path / "out")), nprocs=2, start_method="spawn")
    width = 5
    rows = [_rank_batch(rank) for rank in (0, 1)]
    padded = [torch.cat([torch.nn.functional.pad(getattr(b, name), (0, width - b.mask.shape[1])) for b in rows])
              for name in ("raw_logp", "engine_logp", "mask")]
    whole = _algorithm().rollout_correction(*padded)
    assert whole.weights is not None
    start = 0
    for rank, batch in enumerate(rows):
        got = torch.load(tmp_path / f"out.{rank}")
        n, t = batch.mask.shape
        assert torch.equal(got["weights"], whole.weights[start:start + n, :t])
        assert torch.equal(got["kept"], whole.mask[start:start + n, :t])
        assert got["metrics"] == whole.metrics
        start += n
    assert 0 < float(whole.mask.sum()) < float(padded[2].sum())  # the rejection kept some tokens and not others
