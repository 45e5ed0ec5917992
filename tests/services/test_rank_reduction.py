"""Every step statistic of a 2-rank run is of both ranks: each logged value equals the reduction of the two ranks' own
values (tests/services/rank_stats_check.py records them), computed here from the ranks' weights."""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the tiny tier, 2 steps: 2 prompts x 4 responses per rank, 2 epochs x 2 mini-batches (4 optimizer steps, packed
# micro-batches), a reference (kl_ref), token-level rollout correction and DAPO's dynamic sampling with one batch
# (groups without signal fill the batch: filled_groups)
ARGS = ("rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.micro_batch_size=2", "trainer.mini_batches=2",
        "trainer.ppo_epochs=2", "algorithm.kl_coef=0.05", "algorithm.tis_level=token",
        "algorithm.dynamic_sampling=true", "algorithm.max_gen_batches=1", "steps=2")
TIMINGS = ("generate", "verify", "logp", "update", "sync", "step")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weighted(values: list[float | None], weights: list[float]) -> float | None:
    pairs = [(v, w) for v, w in zip(values, weights) if v is not None]
    if not pairs:
        return None
    assert all(w > 0 for _, w in pairs), (values, weights)
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)


def _per_step(means: list[list[float]], tokens: list[list[float]]) -> float:
    """Per optimizer step the mean over both ranks' tokens, then the mean over steps."""
    steps = [sum(m * n for m, n in zip(ms, ns)) / sum(ns) for ms, ns in zip(zip(*means), zip(*tokens))]
    return sum(steps) / len(steps)


def _expected(own: list[dict], w: list[dict]) -> dict:
    """The logged StepStats that the two ranks' own values and weights make."""
    by = {name: [x[name] for x in own] for name in own[0]}
    rows, groups, tokens = ([x[k] for x in w] for k in ("rows", "groups", "tokens"))
    out = {name: _weighted(by[name], rows) for name in ("reward", "accuracy", "response_length", "overlong_frac")}
    out |= {name: _weighted(by[name], groups) for name in ("solved_groups", "signal_groups")}
    out |= {name: _weighted(by[name], tokens) for name in ("logp_gap_mean", "mismatch_kl", "mismatch_kl_k1")}
    out |= {name: _weighted(by[name], [x["correct_sets"] for x in w]) for name in ("correct_entropy", "correct_max_q")}
    out["logp_gap_max"] = max(by["logp_gap_max"])
    out["policy_loss"] = sum(by["policy_loss"]) / 2  # each rank's loss is its share times the number of ranks
    out["entropy"] = _per_step(by["entropies"], [x["entropy_tokens"] for x in w])
    out["kl_ref"] = _per_step(by["kls"], [x["kl_tokens"] for x in w])
    out["tokens_per_s"] = sum(tokens) / max(x["generate_seconds"] for x in w)
    out["filled_groups"] = sum(by["filled_groups"])
    out["timings"] = {name: max(t[name] for t in by["timings"]) for name in TIMINGS}
    loss = {}
    for name in own[0]["loss"]:
        values = [x["loss"][name] for x in own]
        if name.startswith("ratio_max"):
            present = [v for v in values if v is not None]
            loss[name] = max(present) if present else None
        else:
            loss[name] = _weighted(values, [x["loss"][name] for x in w])
    out["loss"] = loss
    return out


def _close(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            _close(got[key], want[key], f"{where}.{key}")
    elif want is None:
        assert got is None, where
    else:
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), where


@pytest.mark.slow
def test_each_logged_statistic_of_two_ranks_is_the_reduction_of_their_own_values(tmp_path, mlflow_history):
    """Two ranks with different prompts (their rewards, lengths and token counts differ): on every rank and in MLflow
    each step's statistics are the means over both ranks' rows, groups and tokens (per optimizer step for the
    entropy and the KL), the loss diagnostics over both ranks' tokens (ratio_max: the max), the mean of the policy
    losses, the max of logp_gap_max and of each stage's seconds, the sum of filled groups and the tokens of both per
    second of the slower generation; the gradient norms and the rollout-correction metrics are the same on both
    ranks before any reduction and logged as they are."""
    from rlvrlab.components import model_folder
    from rlvrlab.config import compose
    from rlvrlab.data import load_split

    cfg = compose(None, list(ARGS))
    model_folder(cfg, load_split(cfg.dataset, cfg.model))  # built once here, not by both ranks at once
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
               "tests/services/rank_stats_check.py", str(tmp_path), *ARGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    history = mlflow_history(tmp_path / "runs", ranks[0]["run_id"])
    differ = set()
    for zero, one in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        step, own, weights = zero["step"], [zero["own"], one["own"]], [zero["weights"], one["weights"]]
        assert zero["logged"] == one["logged"]  # the same statistics on every rank
        logged = zero["logged"]
        differ |= {name for name in ("reward", "response_length", "entropies", "loss") if own[0][name] != own[1][name]}
        assert own[0]["norms"] == own[1]["norms"]  # DeepSpeed's norm of the all-reduced gradient
        assert logged["grad_norm"] == pytest.approx(sum(own[0]["norms"]) / len(own[0]["norms"]), rel=1e-12)
        assert own[0]["rollout_corr"] == own[1]["rollout_corr"] == logged["rollout_corr"]  # of the global batch
        assert own[0]["generated_batches"] == own[1]["generated_batches"] == logged["generated_batches"]
        want = _expected(own, weights)
        for name, value in want.items():
            _close(logged[name], value, f"step {step}: {name}")
        for name, value in zero["metrics"].items():
            assert history[name][step] == pytest.approx(value, rel=1e-12), (step, name)
    # the ranks' data differed where a wrong reduction would show
    assert differ == {"reward", "response_length", "entropies", "loss"}
    assert any(w["weights"]["tokens"] != o["weights"]["tokens"] for w, o in zip(ranks[0]["steps"], ranks[1]["steps"]))
    assert any(s["logged"]["filled_groups"] > 0 for s in ranks[0]["steps"])
    assert any(s["logged"]["correct_entropy"] is not None for s in ranks[0]["steps"])
    assert not math.isnan(ranks[0]["steps"][-1]["logged"]["kl_ref"])
