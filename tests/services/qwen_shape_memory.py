"""Peak memory of DeepSpeed update steps at a real model's shape on the CPU, against rlvrlab.config.memory.

    python tests/services/qwen_shape_memory.py --build FOLDER   # the model folder (once)
    python tests/services/qwen_shape_memory.py OUT.json FOLDER [override ...]   # prints measured / estimate

--build writes a randomly initialised Qwen2ForCausalLM with Qwen2.5-0.5B's config.json values (QWEN2_5_0_5B: 494M
parameters, tied embeddings) and a byte-level BPE tokenizer of exactly 151,936 entries (vocabulary and merges built
here, Qwen2's pre-tokenizer) to FOLDER: the real model's shape without the hub.

The measure runs in a fresh process with MALLOC_MMAP_THRESHOLD_ fixed (glibc then gives every large freed block
back at once instead of keeping it in its heap: the resident set follows the live tensors). It composes the run
config with model.tier=real model.path=FOLDER, RUN and the overrides, so that the run and the estimate read one
config. After the imports it takes the resident set (VmRSS) as its baseline, loads the model through
rlvrlab.components.load_model, copies the weights out of the memory-mapped safetensors file into anonymous memory
(as they are on a GPU; the file's pages go with the mapping), resets the resident-set high-water mark (VmHWM, "5"
into /proc/self/clear_refs) and builds the update engine through rlvrlab.components.update_engine. Two update
steps follow on one micro-batch of full-length rows (rollout.max_prompt_tokens + rollout.max_new_tokens):
rlvrlab.train.logprobs.logp_and_entropy with the entropy logged, DeepSpeed's backward and its optimizer step (the
first creates AdamW's states; the check fails if the weights did not change).

measured = VmHWM at the end - the baseline - the library pages the steps read in (file-backed, not tensors): the
weights, gradients, AdamW states, activations, logits, entropy and the backward's and the step's temporaries, all
anonymous memory of this process. estimate = MemoryEstimate.trainer of the same config estimated for the CPU
(on_gpu=False): the update or the optimizer step, whichever is larger, without the rollout engine (none is built)
and without the fixed GPU overheads (CUDA context, NCCL, cuBLAS workspaces, CUDA graphs: none exists on a CPU), with
AdamW's step as it runs on the CPU (one tensor at a time, not torch's multi-tensor step on CUDA).
"""

import json
import os
import sys
from pathlib import Path

QWEN2_5_0_5B = dict(  # Qwen/Qwen2.5-0.5B's config.json, the values that set its shape
    hidden_size=896, num_hidden_layers=24, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
    head_dim=64, vocab_size=151_936, tie_word_embeddings=True, rope_theta=1_000_000.0, max_position_embeddings=32_768,
    rms_norm_eps=1e-6, hidden_act="silu", attention_dropout=0.0, bos_token_id=151_933, eos_token_id=151_933,
)
# the measured run: fp32 (bf16 is ~5x slower on the CPU), ZeRO-0 (ZeRO-1/2 clone an fp32 partition and add buckets:
# past the memory a test may take here), one micro-batch of 2 rows x 32 tokens per step
RUN = ["model.dtype=float32", "trainer.engine=deepspeed", "trainer.zero_stage=0", "rollout.prompts_per_step=1",
       "rollout.group_size=2", "trainer.micro_batch_size=2", "rollout.max_prompt_tokens=16",
       "rollout.max_new_tokens=16"]
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2.5's first three special tokens


def build(folder: Path) -> None:
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from rlvrlab.policy.tiny import QWEN2_PRETOKENIZE_REGEX

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_5_0_5B))
    model.save_pretrained(folder)
    # a byte-level BPE of exactly vocab_size entries, as Qwen2's (AutoTokenizer rebuilds a Qwen2Tokenizer from its
    # vocabulary and merges with Qwen2's normalizer and pre-tokenizer): the 256 bytes, every pair of them, then
    # pair + byte merges up to the size, and three of Qwen2.5's special tokens
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [(a, b) for a in alphabet for b in alphabet]
    pairs = [a + b for a, b in merges]
    regular = QWEN2_5_0_5B["vocab_size"] - len(SPECIAL)
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
    assert len(AutoTokenizer.from_pretrained(folder)) == QWEN2_5_0_5B["vocab_size"]  # as rlvrlab loads it


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def main(out: str, folder: str, overrides: list[str]) -> None:
    import gc

    import deepspeed  # noqa: F401  imported before the baseline: its import is not what the estimate sizes
    import torch
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401  the same for the model's code

    from rlvrlab import components
    from rlvrlab.config import compose, memory
    from rlvrlab.train.batch import RolloutBatch
    from rlvrlab.train.logprobs import logp_and_entropy

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = compose(None, ["model.tier=real", f"model.path={folder}", *RUN, *overrides])
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

    model = components.load_model(Path(folder), components.torch_dtype(cfg.model.dtype))
    with torch.no_grad():
        for parameter in model.parameters():  # tied weights are one Parameter: they stay tied
            parameter.data = parameter.data.clone()
    gc.collect()
    loaded = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS, now that the file's mapping is gone
    update = components.update_engine(cfg, model, 1)
    last = list(update.module.parameters())[-1]  # the final norm's weight: small, and every step changes it
    probe = last.detach().clone()
    marks = []  # VmHWM - baseline (GiB) after each forward, and after each backward and optimizer step
    for _ in range(2):  # the first step creates AdamW's states; the second runs with them
        logp, entropy = logp_and_entropy(update.module, batch, temperature=cfg.rollout.temperature)
        assert entropy is not None  # logged: its temporaries are part of the measure
        marks.append(round((_status_kib("VmHWM") - baseline) / 2**20, 3))
        update.backward(-(logp.sum() / batch.mask.sum()), last=True)
        update.step()
        marks.append(round((_status_kib("VmHWM") - baseline) / 2**20, 3))
        del logp, entropy
    if torch.equal(probe, last.detach()):
        raise SystemExit("the steps did not change the weights: the optimizer did not step")
    paged_in = _status_kib("RssFile") - baseline_file  # libraries' pages the steps read in: files, not tensors
    measured = (_status_kib("VmHWM") - baseline - paged_in) * 1024
    found = memory.estimate(cfg, arch, world_size=1, device_bytes=2**50, on_gpu=False)
    result = {"measured": measured, "estimate": found.trainer, "ratio": measured / found.trainer,
              "weights_loaded": (loaded - baseline) * 1024, "file_backed_paged_in": paged_in * 1024,
              "shmem": _status_kib("RssShmem") * 1024, "marks_gib": marks, "params": arch.params, "rows": rows,
              "tokens": p + t, "parts_gib": {name: round(gib, 4) for name, gib in found.rows()}}
    Path(out).write_text(json.dumps(result))
    print(f"{arch.params / 1e6:.0f}M parameters, {rows} rows x {p}+{t} tokens: measured {measured / 2**30:.3f} GiB, "
          f"estimate {found.trainer / 2**30:.3f} GiB, measured/estimate {measured / found.trainer:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.argv[1] == "--build":
        build(Path(sys.argv[2]))
        sys.exit(0)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # read by glibc at start
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
