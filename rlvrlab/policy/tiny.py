"""The tiny tier: a small randomly initialised Qwen2 with its own byte-level BPE tokenizer, built offline.

`build_tiny_model` trains the tokenizer on the task's text and saves a random model; `warm_start` fine-tunes
it on prompt -> one of the task's warm-start targets (rlvrlab.data.problems.Task.warm_start, passed in as
`solutions_fn`) so that RL starts with a non-zero success rate; `tiny_model_folder` does both once and caches the
folder under a hash of everything that determines it. Its `seed` (model.warm_start_seed, by default the run's seed:
rlvrlab.config.warm_start_seed) seeds both the random weights and the warm start's batches, and is part of that
hash: one folder per seed, the same weights bit for bit whenever it is built again (same software, same CPU).

Conventions the rest of rlvrlab relies on:
- The prompt is ``problem.prompt`` tokenised as is: the tokenizer adds no BOS or any other special token.
  The response follows it directly and ends with the eos token ``<|im_end|>``.
- Padding is on the left with ``<|endoftext|>``; a ChatML chat template is attached for use_chat_template.
- The saved generation config samples from the raw distribution (do_sample, temperature 1, top_p 1,
  top_k 0): transformers' global default ``top_k=50`` would otherwise truncate it silently.

Heavy imports (torch, transformers, tokenizers) happen inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlvrlab.data.problems import Problem, ResponsesFn

# Bump when anything below changes what a folder contains (tokenizer, model or warm start recipe):
# it is part of the cache key, so stale folders are never reused.
CODE_VERSION = "tiny-v1"
DIGEST_FILE = "digest.json"  # the built model's digest (rlvrlab.tracking.identity.state_digest), checked at each load

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, IM_START_TOKEN]
VOCAB_SIZE = 320  # upper bound: 256 bytes + 3 special tokens + merges (~20 on Countdown: digits stay single)
# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX (digits split one by one)
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
MAX_POSITIONS = 256
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Warm-start recipe (tuned for the Countdown task and the default 4 x 128 model on 2 CPU cores).
WARMSTART_LR = 3e-3
WARMSTART_BATCH_SIZE = 32
WARMSTART_WARMUP_STEPS = 20


def tokenizer_corpus(problems: Sequence[Problem], solutions_fn: ResponsesFn) -> list[str]:
    """The text the tokenizer is trained on: every prompt and every warm-start target."""
    corpus = []
    for problem in problems:
        corpus.append(problem.prompt)
        corpus.extend(solutions_fn(problem))
    return corpus


def train_tokenizer(corpus: Sequence[str], *, vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE trained on `corpus`, wrapped as a left-padding PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Exactly Qwen2's normalizer and pre-tokenizer: transformers' AutoTokenizer rebuilds a Qwen2Tokenizer
    # (from config.json's model_type) with these, whatever tokenizer.json says; with any other pre-tokenizer,
    # tokenizers.Tokenizer.from_file and AutoTokenizer would split the same text differently.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()  # no post-processor: no BOS or other special token is added
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START_TOKEN],
        padding_side="left",
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_model(
    folder: Path,
    *,
    corpus: Sequence[str],
    layers: int,
    hidden: int,
    heads: int,
    seed: int,
    vocab_size: int = VOCAB_SIZE,
) -> Path:
    """Train the tokenizer on `corpus`, build a random Qwen2 (seeded) and save both into `folder`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,  # not the global default 50: sample from the whole distribution
        max_new_tokens=32,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine down to 10%


def warm_start(
    folder: Path,
    problems: Sequence[Problem],
    *,
    steps: int,
    seed: int,
    solutions_fn: ResponsesFn,
    lr: float = WARMSTART_LR,
    batch_size: int = WARMSTART_BATCH_SIZE,
    warmup_steps: int = WARMSTART_WARMUP_STEPS,
    threads: int | None = 1,
) -> dict[str, float]:
    """Supervised fine-tune of the model in `folder` on prompt -> one of `solutions_fn(problem)`, drawn uniformly,
    + eos.

    Loss on the response tokens only; plain torch AdamW, fp32, CPU; linear warm-up then cosine decay to 10%.
    The model is saved back into `folder`. Returns {"loss": mean loss of the last 10% of steps, "seconds"}.

    threads: torch intra-op threads while training (restored afterwards; None = leave as is). One thread is
    the default: for a model this small it is about as fast as two on an idle 2-core machine and several
    times faster when other processes compete for the cores. The result does not depend on it.
    """
    if steps <= 0:
        return {"loss": float("nan"), "seconds": 0.0}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.train()
        eos_id = tokenizer.eos_token_id
        pad_id = tokenizer.pad_token_id

        # (prompt ids, [response ids + eos, ...]) per problem, tokenised separately as at RL time.
        examples = []
        for problem in problems:
            responses = [tokenizer(s)["input_ids"] + [eos_id] for s in solutions_fn(problem)]
            if responses:
                examples.append((tokenizer(problem.prompt)["input_ids"], responses))
        if not examples:
            raise ValueError("warm_start needs at least one problem with a solution")

        rng = random.Random(seed)
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: _lr_factor(s, steps, min(warmup_steps, steps))
        )
        tail_losses = []
        for step in range(steps):
            batch = []
            for _ in range(batch_size):
                prompt, responses = examples[rng.randrange(len(examples))]
                batch.append((prompt, responses[rng.randrange(len(responses))]))
            width = max(len(p) + len(r) for p, r in batch)
            # Right padding, so positions start at 0 as they do for left-padded prompts in generate().
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (p, r) in enumerate(batch):
                n = len(p) + len(r)
                input_ids[i, :n] = torch.tensor(p + r)
                labels[i, len(p) : n] = torch.tensor(r)
                attention[i, :n] = 1
            loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            if step >= steps - max(1, steps // 10):
                tail_losses.append(float(loss.detach()))
        model.eval()
        model.save_pretrained(folder)
        return {"loss": sum(tail_losses) / len(tail_losses), "seconds": time.perf_counter() - start}
    finally:
        torch.set_num_threads(previous_threads)


def cache_key(
    *,
    layers: int,
    hidden: int,
    heads: int,
    warmstart_steps: int,
    problems: Sequence[Problem],
    seed: int,
    solutions_fn: ResponsesFn,
) -> str:
    """The hex digest naming a tiny-model folder: everything that determines its contents, the software and CPU that
    build it included (build_environment)."""
    fn = solutions_fn  # its name and what it returns for these problems are both in the key
    payload = {
        "version": CODE_VERSION,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "warmstart_steps": warmstart_steps,
        "seed": seed,
        "solutions_fn": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}",
        "recipe": [VOCAB_SIZE, MAX_POSITIONS, WARMSTART_LR, WARMSTART_BATCH_SIZE, WARMSTART_WARMUP_STEPS],
        "problems": [[p.prompt, p.answer] for p in problems],
        # what the warm start fine-tunes on, not only the function's name: a changed recipe is a new folder
        "targets": hashlib.sha256(json.dumps([list(fn(p)) for p in problems]).encode()).hexdigest(),
        "environment": build_environment(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def build_environment() -> dict[str, str]:
    """What besides the recipe can change the bytes of a build (part of cache_key): the torch, transformers and
    tokenizers versions (initialisation, kernels, BPE training), the CPU architecture and the SIMD kernels torch
    dispatches to (torch.backends.cpu.get_cpu_capability(); the build runs on the CPU even on a GPU machine).
    Not the thread count: the warm start trains on one thread (warm_start's threads=1) and the random init does not
    depend on it; a build with 1 and with 2 threads gives the same digest, also when the warm start itself trains
    on 2 (tests/reproducibility/test_initial_model.py::test_warm_start_digest_does_not_depend_on_threads;
    pairs test bed, 600 steps, measured 2026-12-07)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    return {"torch": torch.__version__, "transformers": installed("transformers"),
            "tokenizers": installed("tokenizers"), "machine": platform.machine(),
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability())}


def tiny_model_folder(
    *,
    layers: int,
    hidden: int,
    heads: int,
    warmstart_steps: int,
    problems: Sequence[Problem],
    seed: int,
    cache_root: Path,
    solutions_fn: ResponsesFn,
    digest: Callable[[Path], str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """The cached, warm-started tiny model for these settings: built on the first call, reused after.

    The folder is cache_root/"tiny"/<first 20 hex digits of `cache_key`>. It is built in a temporary folder
    next to it and renamed into place, so a crash never leaves a half-written folder under the final name.

    digest: folder -> the digest of its weights (rlvrlab.components passes rlvrlab.tracking.identity's, over the
    model as a run loads it). The build writes it to DIGEST_FILE; a cached folder whose weights no longer have that
    digest (or which has none) is not used: `warn` says so in one line (default: stderr) and it is built again.
    """
    recipe = {"layers": layers, "hidden": hidden, "heads": heads, "warmstart_steps": warmstart_steps, "seed": seed}
    key = cache_key(**recipe, problems=problems, solutions_fn=solutions_fn)
    parent = Path(cache_root) / "tiny"
    final = parent / key[:20]
    if (final / "config.json").is_file():
        problem = _digest_problem(final, digest)
        if problem is None:
            return final
        (warn or _stderr)(f"the cached tiny model {final} {problem}; building it again")
        _set_aside(final)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:20]}-", dir=parent))
    try:
        corpus = tokenizer_corpus(problems, solutions_fn)
        start = time.perf_counter()
        build_tiny_model(tmp, corpus=corpus, layers=layers, hidden=hidden, heads=heads, seed=seed)
        build_seconds = time.perf_counter() - start
        stats = warm_start(tmp, problems, steps=warmstart_steps, seed=seed, solutions_fn=solutions_fn)
        info = {
            "key": key,
            "version": CODE_VERSION,
            **recipe,
            "num_problems": len(problems),
            "build_seconds": build_seconds,
            "warmstart": stats,
        }
        (tmp / "rlvrlab_tiny.json").write_text(json.dumps(info, indent=2) + "\n")
        if digest is not None:
            (tmp / DIGEST_FILE).write_text(json.dumps({"sha256": digest(tmp)}) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not a concurrent builder winning the race
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _digest_problem(folder: Path, digest: Callable[[Path], str] | None) -> str | None:
    """Why the cached `folder` cannot be used (its weights do not have the digest its build recorded, or it
    recorded none), or None when it can (or there is no digest to check)."""
    if digest is None:
        return None
    try:
        recorded = json.loads((folder / DIGEST_FILE).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"has no readable {DIGEST_FILE}"
    try:
        actual = digest(folder)
    except Exception as error:  # noqa: BLE001 - weights that cannot even be loaded are rebuilt too
        return f"cannot be loaded ({type(error).__name__})"
    if actual == recorded:
        return None
    return f"has weights of digest {actual[:12]}, not the {recorded[:12]} it was built with"


def _set_aside(folder: Path) -> None:
    """Move a bad cached folder out of the way (renamed, then removed), so that a concurrent reader never sees half
    of it deleted under its final name."""
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}-bad-", dir=folder.parent))
    try:
        os.rename(folder, aside / folder.name)
    except OSError:  # another process set it aside (or rebuilt it) first
        pass
    shutil.rmtree(aside, ignore_errors=True)


def _stderr(message: str) -> None:
    import sys

    print(f"warning: {message}", file=sys.stderr, flush=True)
