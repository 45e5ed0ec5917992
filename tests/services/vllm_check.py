"""End-to-end check of VLLMEngine, run inside the vllm environment (.venv-vllm) by tests/services/test_vllm_engine.py.

    .venv-vllm/bin/python tests/services/vllm_check.py [--workdir DIR] [--dtype float32|bfloat16]
    -> the last stdout line is "VLLM_CHECK_RESULT {json}" (vLLM itself logs to stdout too)

1. Builds the tiny random Qwen2 with rlvrlab.policy.tiny.build_tiny_model and trains it for a few seconds on
   random arithmetic lines + eos (a random tied-embedding model mostly repeats its last token), so samples are
   varied and some stop by themselves with eos, others are cut at max_new_tokens.
2. Starts VLLMEngine (temperature 0.7, top_p 0.9: sampling is filtered, the returned log-probs must not be)
   and measures:
   (a) same seed -> same samples and log-probs; another seed -> different samples;
   (b) engine log-probs vs transformers' teacher-forced log_softmax of the raw logits (fp32 reference), and,
       to show the check can tell, vs the temperature-scaled log-probs;
   eos: responses that stopped end with exactly one eos and carry its log-prob; the others have max_new_tokens;
   (c) after adding noise to every weight of the transformers model and sync_weights(model.named_parameters()),
       the new samples match the perturbed model (small gap) and not the old one (large gap); syncing the old
       weights back restores the first samples exactly;
   (d) engine seeding (no request seeds, rollout.vllm_seeding=engine): the engine's own stream moves on from
       call to call, restarts from its seed, leaves the trainer's global generator where it was, and the
       log-probs are still the raw ones;
   (e) a generate in either mode leaves the trainer's python, NumPy and torch RNG states as they were, and the
       keyword arguments rlvrlab hands vllm.LLM are all fields of this vLLM's EngineArgs.
   "samples" holds the token ids and log-probs of the first request-seeded call and of the first two engine-seeded
   calls; `--repro` (a second fresh process, on the model an earlier run left in --workdir) builds the engine with
   the same seed and makes only those three calls, for the test to compare the two processes.
The script only measures; tests/services/test_vllm_engine.py holds the thresholds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()

import torch  # noqa: E402


def _corpus(count: int = 300) -> list[str]:
    rng = random.Random(0)
    lines = []
    for _ in range(count):
        a, b, c = (rng.randint(1, 20) for _ in range(3))
        op = rng.choice("+-*")
        lines.append(rng.choice([f"Use {a}, {b}, {c} to make {a + b + c}.", f"Answer: ({a} {op} {b}) + {c}",
                                 f"Reach {a * b} with {a} and {b}: {a} * {b} = {a * b}"]))
    return lines


CORPUS = _corpus()
PROMPTS_TEXT = ["Use 3, 4,", "Answer: (", "Reach 10 with", "Use 5"]
TEMPERATURE, TOP_P, MAX_NEW, N, SEED = 0.7, 0.9, 14, 4, 1234
TRAIN_STEPS = 80


def build_model(folder: Path) -> Path:
    """The tiny random model, then ~100 plain-torch steps of next-token training on CORPUS lines + eos, so
    that samples are varied (a random tied-embedding Qwen2 mostly repeats its last token) and some of them
    stop by themselves with eos within MAX_NEW tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvrlab.policy.tiny import build_tiny_model

    raw = build_tiny_model(folder / "raw", corpus=CORPUS, layers=2, hidden=128, heads=4, seed=0)
    tok = AutoTokenizer.from_pretrained(raw)
    model = AutoModelForCausalLM.from_pretrained(raw, dtype=torch.float32)
    rows = [tok(line)["input_ids"] + [tok.eos_token_id] for line in CORPUS]
    rng = random.Random(0)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(TRAIN_STEPS):
        batch = [rows[rng.randrange(len(rows))] for _ in range(16)]
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for i, r in enumerate(batch):
            ids[i, : len(r)] = torch.tensor(r)
            labels[i, : len(r)] = torch.tensor(r)
        loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    final = folder / "model"
    model.save_pretrained(final)
    tok.save_pretrained(final)
    return final


def teacher_logps(model, gens) -> list[list[float]]:
    out = []
    with torch.no_grad():
        for g in gens:
            ids = torch.tensor([list(g.prompt_ids) + list(g.response_ids)])
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
            P = len(g.prompt_ids)
            pos = torch.arange(P - 1, P - 1 + len(g.response_ids))
            out.append(logp[pos, torch.tensor(g.response_ids)].tolist())
    return out


def max_gap(gens, ref) -> float:
    return max(abs(a - b) for g, r in zip(gens, ref) for a, b in zip(g.logp, r))


def flat(rows):
    return [g for row in rows for g in row]


def samples(rows) -> list:
    """Token ids and log-probs of every response of one call (JSON keeps floats exactly)."""
    return [[list(g.response_ids), list(g.logp)] for g in flat(rows)]


def trainer_rng() -> tuple:
    import numpy as np

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def same_rng(a: tuple, b: tuple) -> bool:
    import numpy as np

    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1])) and torch.equal(a[2], b[2])


def start_engine(folder: Path, dtype: str):
    from rlvrlab.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model_path=str(folder), temperature=TEMPERATURE, top_p=TOP_P, max_new_tokens=MAX_NEW,
                      gpu_memory_utilization=0.02, dtype=dtype, seed=0)


def repro(work: Path) -> dict:
    """The three calls of "samples" in a fresh process: the engine built with the same seed, nothing else done."""
    import numpy as np
    from transformers import AutoTokenizer

    folder = work / "model"
    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [tok(t)["input_ids"] for t in PROMPTS_TEXT]
    engine = start_engine(folder, "float32")
    # the trainer's generators are where this process alone puts them: what is sampled must not depend on them
    random.seed(os.getpid())
    np.random.seed(os.getpid())
    torch.manual_seed(os.getpid())
    request = engine.generate(prompts, n=N, seed=SEED)
    engine.per_request_seeds = False
    first = engine.generate(prompts, n=N, seed=SEED)
    second = engine.generate(prompts, n=N, seed=SEED)
    engine.close()
    return {"samples": {"request": samples(request), "engine_first": samples(first),
                        "engine_second": samples(second)}, "total_s": round(time.perf_counter() - T0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repro", action="store_true", help="only the calls of 'samples' (float32, model in --workdir)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="vllm-check-"))
    if args.repro:
        print("VLLM_CHECK_RESULT " + json.dumps(repro(work)))
        sys.stdout.flush()
        return
    res: dict = {"torch": torch.__version__, "dtype": args.dtype, "max_new_tokens": MAX_NEW}

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res["transformers"] = transformers.__version__
    t = time.perf_counter()
    folder = work / "model"
    if not (folder / "config.json").is_file():  # reuse a model built by an earlier run in the same workdir
        folder = build_model(work)
    res["build_model_s"] = round(time.perf_counter() - t, 2)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    prompts = [tok(t)["input_ids"] for t in PROMPTS_TEXT]

    t = time.perf_counter()
    import vllm

    from rlvrlab.rollout.vllm_args import EXTENSIBLE_KV_CACHE_ARG, engine_arg_names, engine_kwargs, host_ram_bytes

    res["vllm"] = vllm.__version__
    res["import_vllm_s"] = round(time.perf_counter() - t, 2)
    # (e) every argument rlvrlab may hand vllm.LLM, on CPU and GPU, is a field of this vLLM's EngineArgs
    names = engine_arg_names(vllm)
    res["vllm_has_extensible_kv_cache"] = EXTENSIBLE_KV_CACHE_ARG in names
    passed: set[str] = set()
    for on_cpu in (True, False):
        passed |= set(engine_kwargs(model_path=str(folder), dtype=args.dtype, seed=0, on_cpu=on_cpu, arg_names=names,
                                    gpu_memory_utilization=0.02, host_memory_bytes=host_ram_bytes(),
                                    kv_cache_bytes=2**28, max_model_len=64, external_launcher=True,
                                    sleep_mode=True))
    res["engine_kwargs_unknown_to_vllm"] = sorted(passed - names)
    random.seed(7)
    torch.manual_seed(7)
    rng_probe = torch.rand(1).item()
    torch.manual_seed(7)
    t = time.perf_counter()
    engine = start_engine(folder, args.dtype)
    res["engine_start_s"] = round(time.perf_counter() - t, 2)
    res["trainer_rng_untouched"] = torch.rand(1).item() == rng_probe  # the engine kept the global RNG state
    res["on_cpu"] = engine.on_cpu

    t = time.perf_counter()
    before = trainer_rng()
    a = engine.generate(prompts, n=N, seed=SEED)
    res["request_seeding_keeps_trainer_rng"] = same_rng(trainer_rng(), before)
    res["generate_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    b = engine.generate(prompts, n=N, seed=SEED)
    res["generate_again_s"] = round(time.perf_counter() - t, 3)
    c = engine.generate(prompts, n=N, seed=SEED + 1)
    fa, fb, fc = flat(a), flat(b), flat(c)
    res["shape_ok"] = len(a) == len(prompts) and all(len(row) == N for row in a) and all(
        g.prompt_ids == tuple(p) for row, p in zip(a, prompts) for g in row)
    res["same_seed_same_samples"] = [g.response_ids for g in fa] == [g.response_ids for g in fb]
    res["same_seed_same_logp"] = max(abs(x - y) for g, h in zip(fa, fb) for x, y in zip(g.logp, h.logp))
    res["other_seed_differs"] = [g.response_ids for g in fa] != [g.response_ids for g in fc]
    res["distinct_samples_per_prompt"] = [len({g.response_ids for g in row}) for row in a]
    res["response_lengths"] = [len(g.response_ids) for g in fa]

    eos = tok.eos_token_id
    stopped = [g for g in fa + fc if g.response_ids and g.response_ids[-1] == eos]
    res["num_stopped_by_eos"] = len(stopped)
    res["num_total"] = len(fa + fc)
    res["eos_only_at_end"] = all(eos not in g.response_ids[:-1] for g in fa + fc)
    res["num_cut_at_max_len"] = sum(1 for g in fa + fc if g not in stopped)
    res["unstopped_have_max_len"] = all(len(g.response_ids) == MAX_NEW for g in fa + fc if g not in stopped)
    res["logp_len_ok"] = all(len(g.logp) == len(g.response_ids) for g in fa + fc)
    res["eos_logp_finite"] = all(math.isfinite(g.logp[-1]) for g in stopped)
    bad = [(g.text, tok.decode(list(g.response_ids), skip_special_tokens=True)) for g in fa + fc
           if g.text != tok.decode(list(g.response_ids), skip_special_tokens=True)]
    res["text_mismatch_example"] = bad[:2]
    res["mean_logp"] = sum(x for g in fa for x in g.logp) / max(1, sum(len(g.logp) for g in fa))
    res["text_ok"] = all(g.text == tok.decode(list(g.response_ids), skip_special_tokens=True) for g in fa + fc)

    # (b) raw log-probs, although sampled at temperature 0.7 / top_p 0.9
    ref_a = teacher_logps(model, fa + fc)
    res["gap_before_sync"] = max_gap(fa + fc, ref_a)
    temp_scaled = []  # what "processed" log-probs would have been, to show the check can tell them apart
    with torch.no_grad():
        for g in fa[:4]:
            ids = torch.tensor([list(g.prompt_ids) + list(g.response_ids)])
            lp = torch.log_softmax(model(ids).logits[0] / TEMPERATURE, -1)
            P = len(g.prompt_ids)
            temp_scaled += [abs(lp[P - 1 + i, t].item() - g.logp[i]) for i, t in enumerate(g.response_ids)]
    res["gap_vs_temperature_scaled"] = max(temp_scaled)

    # (c) perturb every weight, sync, resample
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        old_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * p.std().clamp_min(1e-3))
    t = time.perf_counter()
    engine.sync_weights(model.named_parameters())
    res["sync_s"] = round(time.perf_counter() - t, 3)
    d = engine.generate(prompts, n=N, seed=SEED)
    fd = flat(d)
    res["gap_after_sync_new_weights"] = max_gap(fd, teacher_logps(model, fd))
    res["gap_after_sync_old_weights"] = max_gap(fd, teacher_logps(old_model, fd))
    res["samples_changed_after_sync"] = [g.response_ids for g in fd] != [g.response_ids for g in fa]

    # a second sync back to the original weights must restore the original samples exactly
    engine.sync_weights(old_model.state_dict().items())  # state_dict: tied lm_head.weight included, skipped
    e = engine.generate(prompts, n=N, seed=SEED)
    res["sync_back_restores_samples"] = [g.response_ids for g in flat(e)] == [g.response_ids for g in fa]
    res["gap_after_sync_back"] = max_gap(flat(e), teacher_logps(old_model, flat(e)))

    # (d) engine seeding: the same engine switched to one stream of its own
    engine.per_request_seeds = False
    before = trainer_rng()
    first_rows = engine.generate(prompts, n=N, seed=SEED)
    second_rows = engine.generate(prompts, n=N, seed=SEED)
    res["engine_seeding_trainer_rng_untouched"] = same_rng(trainer_rng(), before)
    first, second = flat(first_rows), flat(second_rows)
    res["samples"] = {"request": samples(a), "engine_first": samples(first_rows),
                      "engine_second": samples(second_rows)}
    engine.streams.state = None  # as a new engine with the same seed
    again = flat(engine.generate(prompts, n=N, seed=SEED + 5))
    res["engine_seeding_shape_ok"] = len(first) == len(fa) and all(len(g.logp) == len(g.response_ids) for g in first)
    res["engine_seeding_stream_moves_on"] = [g.response_ids for g in first] != [g.response_ids for g in second]
    res["engine_seeding_restarts_from_its_seed"] = [g.response_ids for g in again] == [g.response_ids for g in first]
    res["engine_seeding_gap"] = max_gap(first, teacher_logps(old_model, first))
    engine.per_request_seeds = True

    engine.sleep()  # no-ops on CPU
    engine.wake_up()
    engine.close()
    res["total_s"] = round(time.perf_counter() - T0, 2)
    print("VLLM_CHECK_RESULT " + json.dumps(res))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
