#!/usr/bin/env bash
# The GPU path as a long run takes it, in a few steps: one rank per GPU (2 when 2 or more GPUs are present),
# vLLM rollouts in sleep mode woken by tag, a separate log-prob pass (trainer.mini_batches=2, so the update's
# forward cannot stand in for it), DeepSpeed ZeRO-2 in bf16, responses long enough to fill the KV pool. Each rank
# prints the peak memory of every phase (rollout, log-prob pass, update, sync) next to the estimate
# (rlvrlab config show --memory), then the run's speed and agreement figures.
#
#   bench/gpu_smoke.sh /path/to/hf-model-folder      # e.g. SmolLM2-135M or Qwen2.5-Math-1.5B
#   bench/gpu_smoke.sh                               # the tiny tier (built locally), on the GPU
#
# Environment: PYTHON (default .venv/bin/python; rlvrlab and vllm, `pip install torch==2.13.0 && pip install -e
# '.[vllm]'`), STEPS (3, at least 2), NEW (max new tokens, 1024 for a real model), ENGINE (vllm; hf where vLLM is
# not installed), VLLM_MEM (0.3), DTYPE (bfloat16), WORK (the run's folder: MLflow store, run folders, checkpoints;
# a new temporary folder by default), SUMMARY (where the small summary goes: gpu_smoke.log and phases.jsonl, tens of
# kB; default $OUT when set, as a lent GPU node returns only a small $OUT, else WORK/summary).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! command -v "$PYTHON" >/dev/null; then
  echo "PYTHON=$PYTHON not found: bench/gpu_smoke.sh runs in rlvrlab's own environment with vLLM (see above); on a" \
       "stock image without it, bench/device_check.sh checks the GPU path with uploaded wheels"
  exit 2
fi
WORK=${WORK:-$(mktemp -d)}
SUMMARY=${SUMMARY:-${OUT:-$WORK/summary}}
mkdir -p "$WORK" "$SUMMARY" && WORK=$(cd "$WORK" && pwd) && SUMMARY=$(cd "$SUMMARY" && pwd)
if [[ "$WORK" == "$SUMMARY" ]]; then echo "WORK and SUMMARY are one folder: give WORK a folder of its own"; exit 2; fi
exec > >(tee -a "$SUMMARY/gpu_smoke.log") 2>&1
STEPS=${STEPS:-3}
ENGINE=${ENGINE:-vllm}
if (( STEPS < 2 )); then echo "STEPS=$STEPS: at least 2 steps (the second wakes the engine after an update)"; exit 2; fi
GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
if (( GPUS == 0 )); then echo "no CUDA device: bench/gpu_smoke.sh measures the GPU path"; exit 2; fi
RANKS=$(( GPUS >= 2 ? 2 : 1 ))
args=("rollout.engine=$ENGINE" trainer.engine=deepspeed trainer.zero_stage=2 "steps=$STEPS"
      trainer.checkpoint_every=0 rollout.prompts_per_step=16 rollout.group_size=8 trainer.mini_batches=2
      "trainer.world_size=$RANKS" trainer.device=cuda "output_dir=$WORK/runs")
[[ "$ENGINE" == vllm ]] && args+=("rollout.vllm_gpu_memory_utilization=${VLLM_MEM:-0.3}")
if [[ -n "${1:-}" ]]; then
  # a real model on Countdown, asked in words, with room to think: long responses exercise the KV pool
  args+=(model.tier=real "model.path=$1" "model.dtype=${DTYPE:-bfloat16}" "rollout.max_new_tokens=${NEW:-1024}"
         rollout.max_prompt_tokens=256 trainer.micro_batch_size=4 trainer.lr=1e-6
         'dataset.template=Using the numbers and target in "{prompt}", find one arithmetic expression with + - * / that reaches the target. Think step by step, then give the expression.'
         dataset.use_chat_template=true)
else
  args+=(model.dtype=float32 "rollout.max_new_tokens=${NEW:-200}" rollout.max_prompt_tokens=56)  # tiny: 256 positions
fi
"$PYTHON" -c "import torch; print('devices:', [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
echo "ranks: $RANKS; estimate:"
"$PYTHON" -m rlvrlab.cli.main config show "${args[@]}" --memory | grep '^# memory' -A 13
"$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$RANKS" bench/gpu_phases.py \
  --record "$SUMMARY/phases.jsonl" "${args[@]}"
"$PYTHON" bench/run_figures.py "$WORK/runs"
echo "gpu smoke done; summary (gpu_smoke.log, phases.jsonl) in $SUMMARY, runs in $WORK/runs"
