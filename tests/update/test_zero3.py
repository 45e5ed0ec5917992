"""ZeRO-3 in rlvrlab.update.deepspeed_engine on the CPU: the weights gathered for the rollout engine's sync and for
the checkpoint's model folder are the full ones, the run takes the same update as ZeRO-0, and the weight check after
each update sees the ranks' partitions (in one process and over 2 gloo ranks)."""

import pytest

from rlvrlab.config import compose
from rlvrlab.train.loop import train

pytestmark = pytest.mark.slow


def test_zero3_syncs_and_saves_the_gathered_weights_as_zero0_trains_them(tmp_path, mlflow_history):
    import torch
    from safetensors.torch import load_file

    def run(stage: int) -> tuple[dict, dict]:
        out = tmp_path / f"zero{stage}"
        cfg = compose(None, ["steps=2", "seed=3", "model.warm_start_seed=0", "trainer.checkpoint_every=1",
                             f"trainer.zero_stage={stage}", "rollout.prompts_per_step=4", "rollout.group_size=4",
                             f"output_dir={out}"])  # one warm start (seed 0's, shared) for both runs
        run_id = train(cfg)
        weights = load_file(str(out / run_id / "checkpoints" / "step_000001" / "model" / "model.safetensors"))
        return mlflow_history(out, run_id), weights  # the model folder of the checkpoint after step 1

    linear = torch.nn.functional.linear
    (history0, weights0), (history3, weights3) = run(0), run(3)
    # DeepSpeed's ZeRO-3 replaced torch.nn.functional.linear for the run; the run's end put it back (a later run in
    # this process computed its linear layers differently, ~1e-8 in its metrics)
    assert torch.nn.functional.linear is linear
    # step 1 sampled from the weights synced after step 0: the hf engine got the full, updated weights
    assert history3["rollout/logp_gap_max"][1] < 1e-4
    assert history3["train/reward"] == history0["train/reward"]
    # step 0 trained both on the same batch: the same loss and gradient norm (ZeRO-3's own norm over its shards)
    assert history3["loss/policy"][0] == pytest.approx(history0["loss/policy"][0], rel=1e-5, abs=1e-7)
    assert history3["loss/grad_norm"][0] == pytest.approx(history0["loss/grad_norm"][0], rel=1e-5)
    # the gathered copies no longer share storage, so the tied lm_head is written too, equal to the embedding
    assert set(weights3) - set(weights0) <= {"lm_head.weight"} and set(weights0) <= set(weights3)
    if "lm_head.weight" in weights3:
        assert torch.equal(weights3["lm_head.weight"], weights3["model.embed_tokens.weight"])
    # after the first step: full tensors, not ZeRO-3 shards, moved as ZeRO-0's: AdamW's first step moves every
    # element by ~lr x sign(gradient), so round-off in a gradient near 0 can flip an element by up to 2 x lr
    # (measured: max 5.3e-6, every element within 1e-6 but a handful)
    diffs = []
    for name, tensor in weights0.items():
        assert weights3[name].shape == tensor.shape and weights3[name].numel() > 0
        diffs.append((weights3[name] - tensor).abs().flatten())
    diff = torch.cat(diffs)
    assert float(diff.max()) <= 2 * 1e-4 * 1.001  # the default experiment's trainer.lr
    agree = float((diff <= 1e-6).float().mean())
    print(f"ZeRO-3 vs ZeRO-0: max weight difference {float(diff.max()):.3g}, share within 1e-6 {agree:.4f}")
    assert agree > 0.99


# ---------------------------------------------------------------- the weight check after each update
# Under ZeRO-3 module.parameters() are empty placeholders between forwards (their norm is 0 whatever the weights
# are), so the check after each optimizer step asks the engine (UpdateEngine.weight_norm): the ranks' own fp32
# partitions, squared, summed and added over ranks. The same code runs in one process (below) and as 2 gloo ranks
# (this file as a torchrun script), where the odd-sized weights leave padding at the end of rank 1's partitions.

def _norms(world_size: int) -> dict[str, float]:
    """After one ZeRO-3 step of a 2-layer net: the engine's weight norm, the norm of its gathered full weights, the
    norm of module.parameters(), and the engine's norm with inf in the padding and then in an owned element of the
    last rank's partition of the second layer's weight (3 elements: at 2 ranks, 2 owned by rank 0, 1 by rank 1)."""
    import torch
    from deepspeed.utils import safe_get_local_fp32_param, safe_set_local_fp32_param

    from rlvrlab.update.base import total_norm
    from rlvrlab.update.deepspeed_engine import DeepSpeedEngine

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 1))  # 15, 3, 3 and 1 elements
    engine = DeepSpeedEngine(module, lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=1.0, zero_stage=3,
                             bf16=False, micro_batch_size=2, accumulation_steps=1, world_size=world_size)
    try:
        x = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
        engine.backward((engine.module(x) ** 2).sum(), last=True)
        engine.step()
        norms = {"engine": engine.weight_norm(), "gathered": float(total_norm([t for _, t in engine.weights()])),
                 "placeholders": float(total_norm([p.detach() for p in engine.module.parameters()]))}
        weight, last = engine.module[1].weight, torch.distributed.get_rank() == world_size - 1
        for name, at in (("padding", 1), ("owned", 0)):  # the last rank's partition: [owned, padding] at 2 ranks
            local = safe_get_local_fp32_param(weight).detach().clone()
            if last and at < local.numel() and (name == "owned" or world_size > 1):  # 1 rank: no padding
                local[at] = float("inf")
            safe_set_local_fp32_param(weight, local)
            norms[name] = engine.weight_norm()
        return norms
    finally:
        engine.close()


def _check(norms: dict[str, float]) -> None:
    import math

    assert norms["placeholders"] == 0.0  # what the check saw before: nothing
    assert norms["gathered"] > 0 and norms["engine"] == pytest.approx(norms["gathered"], rel=1e-6)
    assert norms["padding"] == pytest.approx(norms["engine"], rel=1e-12)  # padding is no weight
    assert math.isinf(norms["owned"])


def test_zero3_weight_norm_is_the_norm_of_the_gathered_weights_and_sees_a_partition_go_inf():
    _check(_norms(world_size=1))


def test_zero3_weight_norm_over_two_gloo_ranks_adds_their_partitions(tmp_path):
    """torchrun, 2 CPU ranks: every rank gets the norm of the full weights, and inf on rank 1 stops both."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                             f"--master_port={port}", __file__, str(tmp_path)], cwd=repo, capture_output=True,
                            text=True, timeout=600, env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for norms in ranks:
        _check(norms)
    assert ranks[0]["engine"] == ranks[1]["engine"]


def test_a_zero3_run_whose_weights_go_inf_in_a_partition_stops_at_that_step(tmp_path, monkeypatch):
    """The run's own check after each update (rlvrlab.train.optimize): the optimizer's step leaves inf in one
    element of the rank's partition; before, the check read module.parameters() (placeholders) and let it through."""
    from deepspeed.utils import safe_get_local_fp32_param, safe_set_local_fp32_param

    from rlvrlab.errors import RlvrlabError
    from rlvrlab.update.deepspeed_engine import DeepSpeedEngine

    step = DeepSpeedEngine.step

    def overflowing_step(self: DeepSpeedEngine) -> float:
        norm = step(self)
        weight = next(p for p in self.module.parameters() if p.requires_grad)
        local = safe_get_local_fp32_param(weight).detach().clone()
        local[0] = float("nan")
        safe_set_local_fp32_param(weight, local)
        return norm

    monkeypatch.setattr(DeepSpeedEngine, "step", overflowing_step)
    cfg = compose(None, ["steps=2", "trainer.zero_stage=3", "rollout.prompts_per_step=4", "rollout.group_size=4",
                         f"output_dir={tmp_path}"])
    with pytest.raises(RlvrlabError, match="^step 0: the weight norm after the update is nan; run .* FAILED"):
        train(cfg)


if __name__ == "__main__":  # one rank of the 2-process test above
    import json
    import os
    import sys
    from pathlib import Path

    rank = os.environ["RANK"]
    Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps(_norms(int(os.environ["WORLD_SIZE"]))))
