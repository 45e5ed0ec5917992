"""A short run on 2 ranks (torchrun, gloo) that records, beside the statistics the loop logs, each rank's own values,
computed here from its batch and update as one process computes them, with the weights a reduction over ranks needs.

    torchrun --nproc_per_node 2 tests/services/rank_stats_check.py OUT_DIR [override ...]

The run goes to OUT_DIR/runs (its MLflow store OUT_DIR/runs/mlflow.db). After each logged step each rank writes
OUT_DIR/rank<r>.json: per step "logged" (the StepStats the loop logged, over all ranks; "metrics": the same by
metric name), "own" (this rank's values alone) and "weights" (its rows, groups, response tokens, correct sets, per
optimizer step the tokens of its entropy and KL means, per loss diagnostic the tokens its mean is over, its
generation seconds); and the run id.
"""

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from rlvrlab.algorithms import correct_set_stats, mismatch_kl
from rlvrlab.algorithms.types import LossStats
from rlvrlab.config import compose
from rlvrlab.train import loop
from rlvrlab.train.metrics import step_metrics


def own_values(batch, trainer, adv_inputs, update, timings, correction) -> dict:
    """This rank's statistics alone, by the one-process definitions."""
    gap = (batch.engine_logp - trainer.raw).abs() * batch.mask
    groups: dict[str, list[float]] = {}
    for gid, r in zip(batch.group_ids, batch.rewards.tolist()):
        groups.setdefault(gid, []).append(r)
    sets = correct_set_stats(adv_inputs)
    k3, k1 = mismatch_kl(trainer.raw, batch.engine_logp, batch.mask)
    loss = update.loss_stats.result()
    return {
        "reward": float(batch.rewards.double().mean()), "accuracy": float((batch.rewards > 0).double().mean()),
        "solved_groups": sum(max(v) > 0 for v in groups.values()) / len(groups),
        "signal_groups": sum(max(v) != min(v) for v in groups.values()) / len(groups),
        "response_length": float(batch.mask.double().sum(-1).mean()),
        "overlong_frac": float(batch.truncated.double().mean()),
        "logp_gap_max": float(gap.max()), "logp_gap_mean": float(gap.double().sum() / batch.mask.sum()),
        "mismatch_kl": k3, "mismatch_kl_k1": k1,
        "correct_entropy": float(sets.correct_entropy.mean()) if sets.correct_entropy.numel() else None,
        "correct_max_q": float(sets.correct_max_q.mean()) if sets.correct_max_q.numel() else None,
        "policy_loss": float(np.mean(update.losses)), "entropies": list(update.entropies), "kls": list(update.kls),
        "norms": list(update.norms), "loss": dataclasses.asdict(loss),
        "tokens_per_s": float(batch.mask.sum()) / batch.generate_seconds,
        "generated_batches": batch.generated_batches, "filled_groups": batch.filled_groups,
        "timings": dataclasses.asdict(timings), "rollout_corr": correction,
    }


def weights(batch, adv_inputs, update) -> dict:
    """What each of this rank's means is over."""
    on_side = {"tokens": [], "pos": [], "neg": []}  # per loss evaluation, its stats and its tokens on each side
    for stats, counts in update.loss_stats.items:
        for side in on_side:
            on_side[side].append((stats, counts[side]))
    per_field = {}
    for f in dataclasses.fields(LossStats):
        side = "pos" if f.name.endswith("_pos") or f.name == "cap_pos_mean" else "neg" if f.name.endswith("_neg") \
            else "tokens"
        per_field[f.name] = sum(n for stats, n in on_side[side] if getattr(stats, f.name) is not None)
    return {
        "rows": len(batch), "groups": len(set(batch.group_ids)), "tokens": float(batch.mask.sum()),
        "correct_sets": int(correct_set_stats(adv_inputs).correct_entropy.numel()),
        "entropy_tokens": list(update.entropy_tokens), "kl_tokens": list(update.kl_tokens),
        "loss": per_field, "generate_seconds": batch.generate_seconds,
    }


def main(out: str, overrides: list[str]) -> None:
    cfg = compose(None, [f"output_dir={Path(out) / 'runs'}", "trainer.checkpoint_every=0", *overrides])
    steps: list[dict] = []
    step_stats = loop.step_stats

    def recorded(run, step, batch, trainer, adv_inputs, update, correction, timings):
        stats = step_stats(run, step, batch, trainer, adv_inputs, update, correction, timings)
        steps.append({"step": step, "logged": dataclasses.asdict(stats), "metrics": step_metrics(stats),
                      "own": own_values(batch, trainer, adv_inputs, update, timings, correction),
                      "weights": weights(batch, adv_inputs, update)})
        Path(out, f"rank{run.rank}.json").write_text(json.dumps({"run_id": run.tracker.run_id, "steps": steps}))
        return stats

    loop.step_stats = recorded
    loop.train(cfg)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
