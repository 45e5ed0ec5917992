"""rlvrlab.config.memory: the per-GPU memory estimate, the check at composition, `config show --memory`, vLLM's
extensible-KV-cache cap, and the estimate against the peak memory measured on the CPU, at small shapes
(tests/services/memory_check.py) and at Qwen2.5-0.5B's (tests/services/qwen_shape_memory.py; docs/scaling.md); at
1,024 tokens a row: tests/services/test_long_row_memory.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvrlab.config import compose, memory
from rlvrlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
QWEN3_8B = str(REPO / "experiments" / "up_grpo_qwen3_8b.yaml")


def test_qwen3_8b_parameters_and_zero_stages():
    cfg = compose(QWEN3_8B, ["trainer.grad_accum_fp32=false"])  # bf16 gradients (the experiment sums in fp32)
    arch = memory.architecture(cfg)
    assert arch is not None and arch.params == pytest.approx(8.19e9, rel=0.01)  # Qwen3-8B: 8.2B
    two = memory.update_parts(cfg, arch, 8)
    three = memory.update_parts(compose(QWEN3_8B, ["trainer.zero_stage=3"]), arch, 8)
    one_gpu = memory.update_parts(cfg, arch, 1)
    assert two["weights"] == arch.params * 2 and three["weights"] == arch.params * 2 // 8  # bf16, sharded at 3
    assert one_gpu["optimizer"] == arch.params * 8 and two["optimizer"] == arch.params  # AdamW fp32 m, v / 8
    assert one_gpu["master_weights"] == arch.params * 4 and one_gpu["gradients"] == arch.params * 2
    offload = memory.update_parts(compose(QWEN3_8B, ["trainer.offload_optimizer=true"]), arch, 8)
    assert offload["optimizer"] == offload["master_weights"] == 0
    fp32_grads = memory.update_parts(compose(QWEN3_8B, ["trainer.grad_accum_fp32=true"]), arch, 8)
    assert fp32_grads["gradients"] == 2 * two["gradients"]
    checkpointed = memory.update_parts(compose(QWEN3_8B, ["trainer.gradient_checkpointing=true"]), arch, 8)
    assert checkpointed["activations"] < two["activations"] / 10


def test_qwen3_8b_on_one_gpu_is_refused_with_the_estimate_and_fits_its_eight():
    with pytest.raises(ConfigError) as caught:
        compose(QWEN3_8B, ["trainer.world_size=1"])
    message = str(caught.value)
    assert "\n" not in message and "does not fit" in message and "at 1 GPU(s)" in message
    fits = memory.estimate(compose(QWEN3_8B), memory.architecture(compose(QWEN3_8B)), world_size=8,
                           device_bytes=140 * memory.GIB)
    assert compose(QWEN3_8B).trainer.world_size == 8 and fits.fits


def test_config_show_memory_and_the_one_line_refusal():
    env = {**os.environ, "COLUMNS": "40"}
    refused = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "config", "show", QWEN3_8B,
                              "trainer.world_size=1"], capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0
    lines = [line for line in (refused.stdout + refused.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "GiB per GPU at 1 GPU(s)" in lines[0]
    shown = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "config", "show", QWEN3_8B, "--memory"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "# memory per GPU (8.191B parameters)" in shown.stdout and "at 8 GPU(s)" in shown.stdout
    assert "#   AdamW states" in shown.stdout


def test_launch_world_size_and_rules():
    with pytest.raises(ConfigError, match="trainer.offload_optimizer=true needs DeepSpeed ZeRO"):
        compose(None, ["trainer.offload_optimizer=true"])
    with pytest.raises(ConfigError, match="not divisible by trainer.world_size=3"):
        compose(None, ["trainer.world_size=3"])
    with pytest.raises(ConfigError, match="trainer.grad_accum_fp32 has no effect"):
        compose(None, ["trainer.grad_accum_fp32=true"])
    assert compose(None, ["trainer.zero_stage=3"]).trainer.zero_stage == 3


def measure(tmp_path: Path, *overrides: str) -> dict:
    out = tmp_path / "memory.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "tests" / "services" / "memory_check.py"), str(out),
                             *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


# measured / estimate (anonymous memory of one optimizer step, tests/services/memory_check.py): the tiny model
# 0.91 at both shapes, SmolLM2 0.94 and 0.88 (tests/services/test_smollm2.py). Below 1 because the estimate sums
# gradients and activations, which backward frees as gradients appear. docs/scaling.md, "Memory estimate".
LOW, HIGH = 0.80, 1.10


@pytest.mark.slow
@pytest.mark.parametrize("shape", [("64", "64", "8"), ("32", "32", "16")])
def test_the_estimate_against_the_measured_peak_on_the_tiny_model(tmp_path, shape):
    prompt, new, micro = shape
    found = measure(tmp_path, f"rollout.max_prompt_tokens={prompt}", f"rollout.max_new_tokens={new}",
                    f"trainer.micro_batch_size={micro}")
    assert LOW <= found["measured"] / found["estimate"] <= HIGH, found


def test_micro_batches_packed_by_tokens_are_estimated_at_their_budget():
    """trainer.micro_batch_tokens: the activations of `budget` tokens (at least one full row), and as many logit
    positions (more short-prompt rows may share a pass than micro_batch_size full ones); the budget of
    micro_batch_size full rows has their activations."""
    rows_only = ["trainer.pack_by_length=false"]  # the experiment packs by length; the row micro-batches it replaces
    cfg = compose(QWEN3_8B, rows_only)
    arch = memory.architecture(cfg)
    micro = memory.micro_batch_rows(cfg, 8)
    full = memory.sequence_tokens(cfg) * micro
    rows = memory.update_parts(cfg, arch, 8)
    same = memory.update_parts(compose(QWEN3_8B, [*rows_only, f"trainer.micro_batch_tokens={full}"]), arch, 8)
    assert same["activations"] == rows["activations"]
    assert same["logits"] * micro * (cfg.rollout.max_new_tokens + 1) == rows["logits"] * full
    half = memory.update_parts(compose(QWEN3_8B, [*rows_only, f"trainer.micro_batch_tokens={full // 2}"]), arch, 8)
    assert half["activations"] == rows["activations"] // 2
    one = memory.update_parts(compose(QWEN3_8B, [*rows_only, "trainer.micro_batch_tokens=1"]), arch, 8)
    assert one["activations"] == rows["activations"] // memory.micro_batch_rows(cfg, 8)  # a row goes alone
    # pack_by_length: at most micro_batch_size rows at their longest allowed, the full budget's estimate
    assert memory.update_parts(compose(QWEN3_8B), arch, 8) == same  # the experiment itself


UCPO_1_5B = str(REPO / "experiments" / "ucpo_r1_1.5b.yaml")
# Qwen2.5-0.5B's config.json: 494M parameters, 151,936-token vocabulary, tied embeddings
QWEN2_5_0_5B = memory.Architecture(hidden=896, layers=24, intermediate=4864, heads=14, kv_heads=2, head_dim=64,
                                   vocab=151_936, tied=True)


def test_fixed_gpu_overheads_by_world_size_and_engine_and_none_on_the_cpu():
    cfg = compose(QWEN3_8B)
    arch = memory.architecture(cfg)
    eight = memory.estimate(cfg, arch, world_size=8, device_bytes=140 * memory.GIB)
    inside = memory.CUBLAS_WORKSPACE_BYTES + memory.CUDA_GRAPHS_BYTES  # vLLM's graphs: rollout.engine=vllm
    assert eight.overhead == memory.CUDA_CONTEXT_BYTES + memory.NCCL_BYTES + inside
    assert eight.overhead_outside_allocator == memory.CUDA_CONTEXT_BYTES + memory.NCCL_BYTES
    one = memory.estimate(compose(None), memory.architecture(compose(None)), world_size=1, device_bytes=memory.GIB)
    assert one.overhead == memory.CUDA_CONTEXT_BYTES + memory.CUBLAS_WORKSPACE_BYTES  # hf engine, no NCCL
    assert one.rollout == one.overhead + one.resident + one.engine  # counted in every phase
    cpu = memory.estimate(cfg, arch, world_size=8, device_bytes=140 * memory.GIB, on_gpu=False)
    assert cpu.overhead == 0 and eight.update - cpu.update == eight.overhead
    assert ("CUDA context/NCCL/cuBLAS/graphs", eight.overhead / memory.GIB) in eight.rows()


def test_the_logged_entropy_is_counted_in_pieces_and_an_entropy_term_whole():
    """The logits: three fp32 [positions, vocab] tensors at the pass's peak. A logged entropy's two temporaries of a
    piece come beside two of them: counted is what they add over the third (nothing once the micro-batch is two
    pieces or more). An entropy term in the loss: five more tensors of the logits' size."""
    cfg = compose(QWEN3_8B)
    arch = memory.architecture(cfg)
    positions = memory.update_parts(cfg, arch, 8)["logits"] // (arch.vocab * 3 * 4)
    per_piece = memory.ENTROPY_CHUNK_ELEMENTS // arch.vocab  # 220 positions of Qwen3's 151,936 tokens
    assert positions > 2 * per_piece  # a micro-batch of the experiment is several pieces
    assert memory.update_parts(cfg, arch, 8)["entropy"] == 0  # the pieces stay under the third tensor
    in_loss = memory.update_parts(compose(QWEN3_8B, ["algorithm.entropy_coef=0.001"]), arch, 8)
    assert in_loss["entropy"] == 5 * 4 * positions * arch.vocab  # softmax kept, five fp32 tensors in its backward
    one_row = compose(None, ["trainer.micro_batch_size=1", "trainer.pack_by_length=false", "rollout.max_new_tokens=299"])
    between = memory.update_parts(one_row, QWEN2_5_0_5B, 1)  # 300 positions: between one piece and two
    assert between["entropy"] == (2 * 4 * per_piece - 4 * 300) * QWEN2_5_0_5B.vocab > 0
    short = memory.update_parts(compose(None), memory.architecture(compose(None)), 1)  # the tiny model: one piece
    assert short["entropy"] == (2 * 4 - 4) * short["logits"] // 12


def test_tied_embeddings_fp32_zero_partitions_and_the_optimizer_step():
    cfg = compose(None)  # fp32, DeepSpeed ZeRO-0, one micro-batch of 8 rows x (1024 + 32) tokens
    psi, embedding = QWEN2_5_0_5B.params, QWEN2_5_0_5B.vocab * QWEN2_5_0_5B.hidden
    assert QWEN2_5_0_5B.largest_tensor == embedding and psi == pytest.approx(494e6, rel=0.01)
    zero0 = memory.update_parts(cfg, QWEN2_5_0_5B, 1)
    assert zero0["tied_gradient"] == 2 * embedding * 4  # the lm_head's and the embedding's contributions, summed
    untied = memory.update_parts(cfg, memory.Architecture(**{**vars(QWEN2_5_0_5B), "tied": False}), 1)
    assert untied["tied_gradient"] == 0
    assert zero0["master_weights"] == 0 and zero0["optimizer_step"] == 4 * psi  # multi-tensor AdamW: sqrt(v) of all
    cpu = memory.update_parts(cfg, QWEN2_5_0_5B, 1, on_gpu=False)
    assert cpu["optimizer_step"] == 2 * 4 * embedding  # the CPU's loop: two temporaries of its largest tensor
    for stage in (1, 2):  # ZeRO-1/2 clone an fp32 partition of fp32 weights too, and step it flat
        zero = memory.update_parts(compose(None, [f"trainer.zero_stage={stage}"]), QWEN2_5_0_5B, 2)
        assert zero["master_weights"] == int(psi * 4 / 2)
        assert zero["optimizer_step"] == int(psi / 2) * 4 * (2 if stage == 1 else 1)  # ZeRO-1 flattens its gradients
    assert memory.update_parts(compose(None, ["trainer.zero_stage=3"]), QWEN2_5_0_5B, 2)["master_weights"] == 0
    bf16 = compose(QWEN3_8B, ["trainer.grad_accum_fp32=false"])
    arch = memory.architecture(bf16)
    assert memory.update_parts(bf16, arch, 8)["optimizer_step"] == 2 * 4 * int(arch.params / 8)  # + the fp32 cast
    assert memory.update_parts(compose(QWEN3_8B), arch, 8)["optimizer_step"] == 4 * int(arch.params / 8)
    offload = memory.update_parts(compose(QWEN3_8B, ["trainer.offload_optimizer=true"]), arch, 8)
    assert offload["optimizer_step"] == 0
    found = memory.estimate(cfg, QWEN2_5_0_5B, world_size=1, device_bytes=80 * memory.GIB)
    assert found.step == found.overhead + found.resident + found.optimizer_step + found.engine  # hf engine awake
    assert found.peak == max(found.update, found.step, found.rollout)


@pytest.mark.parametrize("experiment, world_size, device_gib", [(UCPO_1_5B, 1, 141), (QWEN3_8B, 8, 140)],
                         ids=["ucpo_r1_1.5b", "up_grpo_qwen3_8b"])
def test_vllms_extensible_kv_cache_cap_binds_in_the_rollout_phase_and_is_lifted_for_the_update(
        experiment, world_size, device_gib):
    """vLLM >= 0.34's extensible KV cache caps PyTorch at about device - KV cache - 0.5 GiB for the whole process and
    its sleep() leaves the cap. Held through the update, the cap would not leave either shipped GPU experiment's
    update room (the out-of-memory of their first update); rlvrlab lifts it while the engine sleeps
    (rollout.vllm_sleep.ProcessMemoryCap), so it binds in the rollout phase only, where both fit under it."""
    from dataclasses import replace

    device = device_gib * memory.GIB
    cfg = compose(experiment, [f"trainer.device_memory_gib={device_gib}"])
    arch = memory.architecture(cfg)
    assert cfg.rollout.engine == "vllm" and not cfg.rollout.vllm_extensible_kv_cache
    off = memory.check_fits(cfg, arch, world_size=world_size, device_bytes=device)
    assert off.cap is None and off.fits and "vLLM's cap (extensible KV)" not in dict(off.rows())
    on_cfg = replace(cfg, rollout=replace(cfg.rollout, vllm_extensible_kv_cache=True))
    on = memory.check_fits(on_cfg, arch, world_size=world_size, device_bytes=device)
    kv_cache = int(cfg.rollout.vllm_gpu_memory_utilization * device) - arch.params * 2  # bf16 weights
    assert on.kv_cache == kv_cache and on.cap == device - kv_cache - memory.GIB // 2
    assert on.under_cap == on.rollout - kv_cache - on.overhead_outside_allocator <= on.cap and on.fits
    # the update and the step under the cap, had it stayed on while the engine slept: over it, or (Qwen3-8B on 8
    # GPUs: 98.7 of 98.8 GiB) within the allocator's fragmentation, which the estimate leaves out
    assert max(on.update, on.step) - on.overhead_outside_allocator > on.cap - memory.GIB
    rows = dict(on.rows())
    assert rows["vLLM's cap (extensible KV)"] == on.cap / memory.GIB
    assert rows["rollout under vLLM's cap"] == on.under_cap / memory.GIB
    assert not replace(on, cap=on.under_cap - 1).fits  # a cap below the rollout's ask does not fit


@pytest.mark.slow
@pytest.mark.heavy
def test_the_estimate_against_the_measured_peak_at_qwen2_5_0_5b_shape(tmp_path):
    """A randomly initialised model of Qwen2.5-0.5B's shape with a 151,936-entry tokenizer, built here (no hub), two
    DeepSpeed steps of rlvrlab's update path in a fresh process (tests/services/qwen_shape_memory.py: fp32, ZeRO-0,
    the entropy logged): the peak resident memory over the baseline before the model is loaded against the
    estimate of the same config on the CPU, which leaves out the fixed GPU overheads (CUDA context, NCCL, cuBLAS,
    CUDA graphs) and steps AdamW as the CPU does."""
    script, folder, out = REPO / "tests" / "services" / "qwen_shape_memory.py", tmp_path / "qwen", tmp_path / "m.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for args in (["--build", str(folder)], [str(out), str(folder)]):
        result = subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["params"] == QWEN2_5_0_5B.params and found["rows"] == 2 and found["tokens"] == 32
    assert LOW <= found["measured"] / found["estimate"] <= HIGH, found


def test_trained_parameters_size_the_gradients_and_optimizer_and_all_parameters_the_weights():
    """update_parts(trainable=N): an adapter's N trained parameters in the gradients, AdamW states, fp32 masters and
    the step's temporaries; every parameter in the weights (frozen ones too); no tied embedding's gradient sum."""
    cfg = compose(QWEN3_8B, ["trainer.grad_accum_fp32=false"])
    arch = memory.architecture(cfg)
    full, adapter = memory.update_parts(cfg, arch, 1), memory.update_parts(cfg, arch, 1, trainable=10_000_000)
    assert memory.update_parts(cfg, arch, 1, trainable=arch.params) == full
    assert adapter["weights"] == full["weights"] and adapter["activations"] == full["activations"]
    assert adapter["gradients"] == 2 * 10_000_000 and adapter["optimizer"] == 8 * 10_000_000
    assert adapter["master_weights"] == 4 * 10_000_000
    assert adapter["optimizer_step"] == 2 * 4 * 10_000_000  # sqrt(v) of all, and ZeRO-2 casts bf16 gradients to fp32
    tied = memory.update_parts(compose(None), QWEN2_5_0_5B, 1, trainable=1_000_000, on_gpu=False)
    assert tied["tied_gradient"] == 0 and tied["optimizer_step"] == 2 * 4 * 1_000_000
    smaller = memory.estimate(cfg, arch, world_size=1, device_bytes=140 * memory.GIB, trainable=10_000_000)
    assert smaller.resident < memory.estimate(cfg, arch, world_size=1, device_bytes=140 * memory.GIB).resident
