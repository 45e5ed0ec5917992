"""Peak memory of DeepSpeed update steps at a real model's shape on the CPU, phase by phase, against
rlvrlab.config.memory.

    python tests/services/qwen_shape_memory.py --build FOLDER [SHAPE]   # the model folder (once; SHAPE in SHAPES)
    python tests/services/qwen_shape_memory.py OUT.json FOLDER [override ...]   # prints measured / estimate
    python tests/services/qwen_shape_memory.py --long OUT.json FOLDER [override ...]   # LONG_RUN's rows

--build writes a randomly initialised Qwen2ForCausalLM of SHAPE's config.json values (default qwen2.5-0.5b:
Qwen2.5-0.5B's, 494M parameters, tied embeddings; long-rows: the same family at hidden 384 and 12 layers, untied as
DeepSeek-R1-Distill-Qwen-1.5B, 150M parameters, most of them the vocabulary's) and a byte-level BPE tokenizer of
exactly 151,936 entries (vocabulary and merges built here, Qwen2's pre-tokenizer) to FOLDER: the real model's
vocabulary without the hub.

The measure runs in a fresh process with MALLOC_MMAP_THRESHOLD_ fixed (glibc then gives every large freed block
back at once instead of keeping it in its heap: the resident set follows the live tensors). It composes the run
config with model.tier=real model.path=FOLDER, RUN (or LONG_RUN) and the overrides, so that the run and the
estimate read one config. After the imports it takes the resident set (VmRSS) as its baseline, loads the model
through rlvrlab.components.load_model, copies the weights out of the memory-mapped safetensors file into anonymous
memory (as they are on a GPU; the file's pages go with the mapping), resets the resident-set high-water mark (VmHWM,
"5" into /proc/self/clear_refs) and builds the update engine through rlvrlab.components.update_engine. Two update
steps follow on one micro-batch of full-length rows (rollout.max_prompt_tokens + rollout.max_new_tokens, every
response token counted: the rows reach the length), each in the phases of bench/gpu_phases.py, the high-water mark
reset at each boundary: `logp`, the trainer's log-prob pass (rlvrlab.train.logprobs.logp_and_entropy without a
graph); `forward`, the same with the graph and the entropy logged; `backward`, DeepSpeed's backward; `step`, its
optimizer step (the first creates AdamW's states; the check fails if the weights did not change).

measured (per phase) = VmHWM at its end - the baseline - the library pages read in so far (file-backed, not
tensors): the weights, gradients, AdamW states, activations, logits, entropy and the backward's and the step's
temporaries, all anonymous memory of this process; the run's measure is the largest phase. estimate = the same
config's MemoryEstimate on the CPU (on_gpu=False), without the rollout engine (none is built) and without the fixed
GPU overheads (CUDA context, NCCL, cuBLAS workspaces, CUDA graphs: none exists on a CPU), with AdamW's step as it
runs on the CPU (one tensor at a time, not torch's multi-tensor step on CUDA): the update phase beside logp,
forward and backward, the optimizer step phase beside step, and MemoryEstimate.trainer (the larger) beside the run.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

QWEN2_5_0_5B: dict[str, Any] = dict(  # Qwen/Qwen2.5-0.5B's config.json, the values that set its shape
    hidden_size=896, num_hidden_layers=24, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
    head_dim=64, vocab_size=151_936, tie_word_embeddings=True, rope_theta=1_000_000.0, max_position_embeddings=32_768,
    rms_norm_eps=1e-6, hidden_act="silu", attention_dropout=0.0, bos_token_id=151_933, eos_token_id=151_933,
)
# the measured run: fp32 (bf16 is ~5x slower on the CPU), ZeRO-0 (ZeRO-1/2 clone an fp32 partition and add buckets:
# past the memory a test may take here), one micro-batch of 2 rows x 32 tokens per step
RUN = ["model.dtype=float32", "trainer.engine=deepspeed", "trainer.zero_stage=0", "rollout.prompts_per_step=1",
       "rollout.group_size=2", "trainer.micro_batch_size=2", "rollout.max_prompt_tokens=16",
       "rollout.max_new_tokens=16"]
# the same family with the vocabulary and the untied embeddings of DeepSeek-R1-Distill-Qwen-1.5B (ucpo_r1_1.5b's
# model) at a CPU's size: hidden 384, 12 layers, MLP 5.3x, GQA 3:1; 150M parameters, 117M of them the vocabulary's
LONG_ROWS: dict[str, Any] = dict(
    QWEN2_5_0_5B, hidden_size=384, num_hidden_layers=12, intermediate_size=2048, num_attention_heads=6,
    num_key_value_heads=2, tie_word_embeddings=False,
)
SHAPES = {"qwen2.5-0.5b": QWEN2_5_0_5B, "long-rows": LONG_ROWS}
# rows at a reasoning run's lengths, where activations and logits are most of the memory: 4 rows x (256 + 768)
# tokens a step in two micro-batches of 2 (the second runs beside the first's gradients, as in any run that
# accumulates), not packed by length (the estimate's logit positions are then the rows'), fp32, ZeRO-0 (as RUN)
LONG_RUN = [*RUN[:-4], "rollout.group_size=4", "trainer.micro_batch_size=2", "trainer.pack_by_length=false",
            "rollout.max_prompt_tokens=256", "rollout.max_new_tokens=768"]
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2.5's first three special tokens


def build(folder: Path, shape: str = "qwen2.5-0.5b") -> None:
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from rlvrlab.policy.tiny import QWEN2_PRETOKENIZE_REGEX

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape]))
    model.save_pretrained(folder)
    # a byte-level BPE of exactly vocab_size entries, as Qwen2's (AutoTokenizer rebuilds a Qwen2Tokenizer from its
    # vocabulary and merges with Qwen2's normalizer and pre-tokenizer): the 256 bytes, every pair of them, then
    # pair + byte merges up to the size, and three of Qwen2.5's special tokens
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [(a, b) for a in alphabet for b in alphabet]
    pairs = [a + b for a, b in merges]
    vocab = SHAPES[shape]["vocab_size"]
    regular = vocab - len(SPECIAL)
    merges += [(pair, c) for pair in pairs for c in alphabet][: regular - len(alphabet) - len(pairs)]
    tokens = alphabet + [a + b for a, b in merges]
    assert len(tokens) == len(set(tokens)) == regular
    core = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL))  # ids 151933-151935, after the regular vocabulary
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=list(SPECIAL[1:]), padding_side="left")
    tokenizer.save_pretrained(folder)
    assert len(AutoTokenizer.from_pretrained(folder)) == vocab  # as rlvrlab loads it


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def main(out: str, folder: str, run: list[str], overrides: list[str]) -> None:
    import gc

    import deepspeed  # noqa: F401  imported before the baseline: its import is not what the estimate sizes
    import torch
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401  the same for the model's code

    from rlvrlab import components
    from rlvrlab.config import compose, memory
    from rlvrlab.train.batch import RolloutBatch
    from rlvrlab.train.logprobs import logp_and_entropy
    from rlvrlab.update.deepspeed_engine import DeepSpeedEngine

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = compose(None, ["model.tier=real", f"model.path={folder}", *run, *overrides])
    arch = memory.architecture(cfg)
    assert arch is not None
    rows, p, t = memory.micro_batch_rows(cfg, 1), cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens
    ids = torch.randint(0, arch.vocab, (rows, p + t), generator=torch.Generator().manual_seed(0))
    batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids), mask=torch.ones(rows, t), prompt_width=p,
                         group_ids=["g"] * rows, rewards=torch.zeros(rows), engine_logp=torch.zeros(rows, t),
                         texts=[""] * rows, version=0, batch_index=0,
                         scores=torch.zeros(rows), truncated=torch.zeros(rows, dtype=torch.bool))
    gc.collect()
    baseline, baseline_file = _status_kib("VmRSS"), _status_kib("RssFile")

    def peak() -> int:
        """Bytes of anonymous memory at the high-water mark since the last reset: over the baseline, less the
        libraries' pages read in so far (files, not tensors)."""
        return (_status_kib("VmHWM") - baseline - (_status_kib("RssFile") - baseline_file)) * 1024

    def reset() -> None:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS

    model = components.load_model(Path(folder), components.torch_dtype(cfg.model.dtype))
    with torch.no_grad():
        for parameter in model.parameters():  # tied weights are one Parameter: they stay tied
            parameter.data = parameter.data.clone()
    gc.collect()
    loaded = _status_kib("VmRSS")
    reset()  # now that the file's mapping is gone
    update = components.update_engine(cfg, model, 1)
    assert isinstance(update, DeepSpeedEngine)
    phases: list[tuple[str, int]] = [("build", peak())]
    engine_step = update.engine.step  # DeepSpeed's: it steps the optimizer at the accumulation boundary

    def marked_step() -> None:  # only marks the boundary between backward and the optimizer step
        phases.append((f"backward {micro + 1}", peak()))
        reset()
        engine_step()

    update.engine.step = marked_step
    # the final norm's weight: small, and every step changes it (an untied model's last parameter is its lm_head, whose
    # copy here would add a vocabulary x hidden tensor to the measure)
    last = [parameter for parameter in update.module.parameters() if parameter.dim() == 1][-1]
    probe = last.detach().clone()
    micro_batches = -(-cfg.rollout.prompts_per_step * cfg.rollout.group_size // cfg.trainer.mini_batches // rows)
    for step in range(2):  # the first step creates AdamW's states; the second runs with them
        if step == 1:
            reset()
            with torch.no_grad():  # the trainer's log-prob pass: no graph, the entropy logged
                logp_and_entropy(update.module, batch, temperature=cfg.rollout.temperature)
            phases.append(("logp", peak()))
        for micro in range(micro_batches):  # later micro-batches run with the earlier ones' gradients
            reset()
            logp, entropy = logp_and_entropy(update.module, batch, temperature=cfg.rollout.temperature)
            assert entropy is not None  # logged: its temporaries are part of the measure
            phases.append((f"forward {micro + 1}", peak()))
            reset()
            update.backward(-(logp.sum() / batch.mask.sum()), last=micro == micro_batches - 1)
            del logp, entropy
        phases.append(("step", peak()))
        update.step()
    if torch.equal(probe, last.detach()):
        raise SystemExit("the steps did not change the weights: the optimizer did not step")
    measured = max(bytes_ for _, bytes_ in phases)
    found = memory.estimate(cfg, arch, world_size=1, device_bytes=2**50, on_gpu=False)
    engine = 0 if found.engine_asleep_in_update else found.engine  # the hf engine's copy: none is built here
    update_phase, step_phase = found.update - found.overhead - engine, found.step - found.overhead - engine
    second = dict(phases[len(phases) - 2 * micro_batches - 2:])  # the second step: AdamW's states exist
    estimates = {name: step_phase if name == "step" else update_phase for name in second}
    result = {"measured": measured, "estimate": found.trainer, "ratio": measured / found.trainer,
              "peak_phase": max(phases, key=lambda phase: phase[1])[0],
              "phases_gib": [[name, round(bytes_ / 2**30, 3)] for name, bytes_ in phases],
              "steady_gib": {name: round(bytes_ / 2**30, 3) for name, bytes_ in second.items()},
              "estimate_gib": {name: round(bytes_ / 2**30, 3) for name, bytes_ in estimates.items()},
              "weights_loaded": (loaded - baseline) * 1024, "shmem": _status_kib("RssShmem") * 1024,
              "params": arch.params, "rows": rows, "tokens": p + t,
              "gradient_checkpointing": cfg.trainer.gradient_checkpointing,
              "parts_gib": {name: round(gib, 4) for name, gib in found.rows()}}
    Path(out).write_text(json.dumps(result))
    print(f"{arch.params / 1e6:.0f}M parameters, {rows} rows x {p}+{t} tokens, gradient checkpointing "
          f"{'on' if cfg.trainer.gradient_checkpointing else 'off'}")
    print(f"{'phase (2nd step)':<18}{'measured GiB':>13}{'estimate GiB':>13}{'ratio':>7}")
    for name, bytes_ in second.items():
        print(f"{name:<18}{bytes_ / 2**30:>13.3f}{estimates[name] / 2**30:>13.3f}{bytes_ / estimates[name]:>7.3f}")
    print(f"run peak ({result['peak_phase']}): measured {measured / 2**30:.3f} GiB, estimate {found.trainer / 2**30:.3f} "
          f"GiB, measured/estimate {measured / found.trainer:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.argv[1] == "--build":
        build(Path(sys.argv[2]), *sys.argv[3:4])
        sys.exit(0)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # read by glibc at start
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})
    if sys.argv[1] == "--long":
        main(sys.argv[2], sys.argv[3], LONG_RUN, sys.argv[4:])
    else:
        main(sys.argv[1], sys.argv[2], RUN, sys.argv[3:])
