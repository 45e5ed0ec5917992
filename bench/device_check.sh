#!/usr/bin/env bash
# The device check of a stock GPU node: torch and transformers preinstalled; no vLLM, DeepSpeed, omegaconf, pydantic,
# hjson or MLflow; no network. It installs the uploaded wheels (`make device-wheels` builds device-wheels/) into a
# folder of its own, builds a random model of DeepSeek-R1-Distill-Qwen-1.5B's shape (1.78B parameters) with a
# tokenizer of its vocabulary, and trains it on the GPU with the hf rollout engine and DeepSpeed ZeRO-2 in bf16,
# without MLflow (tracking.backend=none): once as is, once with trainer.gradient_checkpointing=true. Each run prints
# the peak memory of every phase (rollout, log-prob pass, update, sync) beside rlvrlab.config.memory's estimate
# (bench/gpu_phases.py), then both runs side by side. The path it drives needs neither vLLM, MLflow, typer nor rich.
#
#   make device-wheels                      # where there is network: device-wheels/, carried with the checkout
#   bench/device_check.sh                   # on the GPU node, in the checkout's root
#   DEVICE=cpu bench/device_check.sh        # the same on the CPU: a small model of the same family, in fp32
#   DEVICE=cpu WHEELS=none PYTHON=.venv/bin/python bench/device_check.sh     # with rlvrlab's own environment
#
# The GPU run's size fits 6 minutes on one H100 with room: 2 steps per run (the second step's rollout holds the AdamW
# states the first created), 8 prompts x 4 responses of 256 new tokens (a random model almost never samples eos, so
# every response runs to the cap, the length the estimate sizes), trainer.mini_batches=2 so that the log-prob pass
# is its own pass, micro-batches of 4 rows. The time goes to 4 rollouts of 256 sequential decoding steps (tens of
# ms each), saving the 3.6 GB model once and loading it twice, and starting 4 Python processes; the update's
# arithmetic is seconds.
#
# Environment: PYTHON (python3, the image's own; never .venv), DEVICE (cuda | cpu), WHEELS (device-wheels; none:
# install nothing and use what PYTHON has), SITE (where the wheels go, default $OUT/site), OUT (a new temporary
# folder: model, runs, phases.jsonl), STEPS (2, at least 2), NEW (max new tokens: 256 on cuda, 16 on cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WHEELS=${WHEELS:-device-wheels}
SITE=${SITE:-$OUT/site}
STEPS=${STEPS:-2}
if (( STEPS < 2 )); then
  echo "STEPS=$STEPS: at least 2 steps (the second rollout holds the optimizer's states)"
  exit 2
fi
case "$DEVICE" in
  cuda) SHAPE=r1-1.5b DTYPE=bfloat16 NEW=${NEW:-256} PROMPTS=8 ;;
  # the CPU path even on a GPU machine; glibc gives freed blocks back at once, so the resident set follows the
  # live tensors (docs/scaling.md, "Memory estimate")
  cpu) SHAPE=small DTYPE=float32 NEW=${NEW:-16} PROMPTS=4
       export CUDA_VISIBLE_DEVICES="" MALLOC_MMAP_THRESHOLD_=131072 ;;
  *) echo "DEVICE=$DEVICE: give cuda (the default) or cpu"; exit 2 ;;
esac

if [[ "$WHEELS" == none ]]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  if (( ${#wheels[@]} == 0 )); then
    echo "no wheels in $WHEELS/: run \`make device-wheels\` where there is network and bring the folder (WHEELS=none" \
         "uses what $PYTHON has)"
    exit 2
  fi
  tag=$("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  if compgen -G "$WHEELS/pydantic_core-*" >/dev/null && ! compgen -G "$WHEELS/pydantic_core-*-$tag-*" >/dev/null; then
    echo "$WHEELS/ has no pydantic-core wheel for $PYTHON ($tag): run \`make device-wheels DEVICE_PYTHONS=<its" \
         "version>\` where there is network"
    exit 2
  fi
  # by name from the folder: pip takes the one pydantic-core wheel that fits this interpreter
  mapfile -t names < <(for w in "${wheels[@]}"; do basename "$w" | cut -d- -f1; done | sort -u)
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --no-index --no-deps \
    --find-links "$WHEELS" --target "$SITE" "${names[@]}"
  echo "installed ${#names[@]} wheels into $SITE ($(du -sh "$WHEELS" | cut -f1) uploaded)"
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" DEVICE_CHECK_SITE="$SITE"
fi
if [[ "$DEVICE" == cuda ]]; then
  "$PYTHON" -c "import sys, torch
torch.cuda.is_available() or sys.exit('no CUDA device here: DEVICE=cpu runs the check on the CPU')"
fi

args=(model.tier=real "model.path=$OUT/model" "model.dtype=$DTYPE" rollout.engine=hf trainer.engine=deepspeed
      trainer.zero_stage=2 tracking.backend=none "steps=$STEPS" trainer.checkpoint_every=0
      "rollout.prompts_per_step=$PROMPTS" rollout.group_size=4 trainer.mini_batches=2 trainer.micro_batch_size=4
      "rollout.max_new_tokens=$NEW" trainer.lr=1e-6 "output_dir=$OUT/runs" dataset.use_chat_template=true
      'dataset.template=Using the numbers and target in "{prompt}", find one arithmetic expression with + - * / that reaches the target. Think step by step, then give the expression.')
# the last line it prints: rollout.max_prompt_tokens=<the longest training prompt>, so the estimate's rows are the run's
fit=$("$PYTHON" bench/gpu_phases.py --build-model "$OUT/model" "$SHAPE" "${args[@]}" | tail -n 1)
record="$OUT/phases.jsonl"
"$PYTHON" bench/gpu_phases.py --record "$record" "${args[@]}" "$fit"
"$PYTHON" bench/gpu_phases.py --record "$record" "${args[@]}" "$fit" trainer.gradient_checkpointing=true
"$PYTHON" bench/gpu_phases.py --compare "$record"
echo "device check ($DEVICE) done in $((SECONDS - start)) s; model, runs and phases.jsonl in $OUT"
