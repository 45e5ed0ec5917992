"""Step throughput of `rlvrlab train` against TRL's GRPOTrainer (trl 1.16) on CPU, measured side by side in one run.

    .venv/bin/pip install -e '.[dev,bench]'                        # trl==1.16.0 (the bench extra)
    .venv/bin/python bench/trl_compare.py [--steps 10] [--warmup 3] [--rounds 4] [--threads 1]    # ~3.5 min
    .venv/bin/python bench/trl_compare.py --model models/SmolLM2-135M-Instruct --steps 2 --warmup 1 --rounds 1
        # the same comparison on a real model folder (model=smollm2 model.path=PATH; `rlvrlab model import smollm2`)

Each measurement is a fresh subprocess (DeepSpeed, accelerate and TRL keep process-wide state) that trains
`--warmup` + `--steps` steps; only the last `--steps` count. The five sides run in turn, `--rounds` times, in
the order of SIDES (rlvrlab-torch, rlvrlab-deepspeed, -rows, -unshared, TRL), reversed every other round, so slow
phases of a shared machine fall on all of them: a ratio from one run means more than an absolute figure. Both sides run with the same torch
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
from pathlib import Path

MARK = "BENCH_RESULT "
SIDES = ("rlvrlab-torch", "rlvrlab-deepspeed", "rlvrlab-deepspeed-rows", "rlvrlab-deepspeed-unshared", "trl")
SIDE_OVERRIDES = {  # what each rlvrlab side sets on top of the default experiment
    "rlvrlab-torch": [], "rlvrlab-deepspeed": [],
    "rlvrlab-deepspeed-rows": ["trainer.pack_by_length=false"],  # row micro-batches, as TRL's
    "rlvrlab-deepspeed-unshared": ["trainer.share_prompt=false"],  # the default before prompts were shared
}
MODEL: str | None = None  # --model PATH: a Hugging Face folder instead of the tiny tier's model


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
            "algorithm=grpo", "algorithm.kl_coef=0", *extra]


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
            "pack_by_length": cfg.trainer.pack_by_length}


def run_trl(total: int, threads: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvrlab.data import load_split
    from rlvrlab.rewards import VERIFIERS
    from rlvrlab.train.batch import stream_problems

    if threads:
        torch.set_num_threads(threads)
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
    )
    assert args.generation_batch_size == per_step, args.generation_batch_size
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ends, cpu = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            cpu.append(time.process_time())

    trainer = GRPOTrainer(model=model, reward_funcs=countdown_reward, args=args,
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
    return {"ends": ends, "cpu": cpu, "split": spent, "tokens": tokens, "reward": rewards,
            "threads": torch.get_num_threads(), "folder": args.output_dir}


def worker(side: str, total: int, threads: int) -> None:
    load = os.getloadavg()[0]
    if side == "trl":
        result = run_trl(total, threads)
    else:
        result = run_rlvrlab(side.split("-")[1], total, threads, tuple(SIDE_OVERRIDES[side]))
    result["load"] = [load, os.getloadavg()[0]]
    shutil.rmtree(result.pop("folder"), ignore_errors=True)
    print(MARK + json.dumps(result), flush=True)


def measure(side: str, warmup: int, steps: int, threads: int) -> dict:
    env = {**os.environ, "RLVRLAB_NO_PROGRESS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, __file__, "--worker", side, "--steps", str(steps), "--warmup", str(warmup), "--threads",
           str(threads), *(["--model", MODEL] if MODEL else [])]
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

    if side == "trl":
        parts = {"generate": mean("generate"), "verify": mean("verify")}
        parts["rollout other"] = mean("rollout") - parts["generate"] - parts["verify"]
        parts["train (fwd+bwd x8, AdamW, loader)"] = wall - mean("rollout")
    else:
        parts = {k: mean(k) for k in ("generate", "logp", "update", "sync", "verify")}
        parts["other in time/step"] = mean("step") - sum(parts.values())
        parts["outside time/step (stats, MLflow)"] = wall - mean("step")
    return "  ".join(f"{k} {v * 1000:.0f} ms ({v / wall:.0%})" for k, v in parts.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="steps run first and not measured (at least 1)")
    parser.add_argument("--rounds", type=int, default=4, help="times each side runs (order reversed every other round)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each run; 0: torch's "
                                                                 "default (one per core)")
    parser.add_argument("--model", help="a Hugging Face model folder (e.g. SmolLM2-135M-Instruct) instead of the tiny "
                        "tier's; both sides train it")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global MODEL
    MODEL = args.model
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1 (a step is timed from the end of the one before)")
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        sys.exit("trl is not installed: .venv/bin/pip install -e '.[dev,bench]' (the bench extra, trl==1.16.0)")
    if args.worker:
        worker(args.worker, args.warmup + args.steps, args.threads)
        return

    from importlib.metadata import version

    from rlvrlab.config import compose

    r = compose(None, overrides("torch", 1, "unused")).rollout
    rows = r.prompts_per_step * r.group_size
    packages = ("torch", "transformers", "trl", "deepspeed", "accelerate", "datasets")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start; "
          + ", ".join(f"{name} {version(name)}" for name in packages))
    print(f"{MODEL or 'tiny tier'}, {r.prompts_per_step} prompts x {r.group_size} completions, <= {r.max_new_tokens} new tokens, "
          f"T={r.temperature}; {args.warmup} warm-up + {args.steps} measured steps per run, {args.rounds} round(s), "
          f"torch threads {args.threads or 'default'}", flush=True)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            run = measure(side, args.warmup, args.steps, args.threads)
            runs[side].append(run)
            print(f"  round {round_ + 1} {side:18s} median {statistics.median(run['wall']):.3f} s/step  "
                  f"steps {' '.join(f'{w:.2f}' for w in run['wall'])}  ({run['process_s']:.0f} s with start-up, "
                  f"{run['threads']} threads, load {run['load'][0]:.1f}->{run['load'][1]:.1f})", flush=True)

    def pooled(side: str, key: str) -> list[float]:
        return [v for run in runs[side] for v in run[key]]

    print("\n1. seconds per step (measured steps of all rounds pooled)")
    print(f"   {'side':18s} {'median':>8s} {'mean':>8s} {'min':>8s} {'CPU s':>8s}  TRL/this (median, mean, CPU)")
    trl_wall, trl_cpu = pooled("trl", "wall"), pooled("trl", "cpu_s")
    for side in SIDES:
        wall, cpu = pooled(side, "wall"), pooled(side, "cpu_s")
        ratio = (f"x{statistics.median(trl_wall) / statistics.median(wall):.2f}, "
                 f"x{statistics.mean(trl_wall) / statistics.mean(wall):.2f}, "
                 f"x{statistics.median(trl_cpu) / statistics.median(cpu):.2f}") if side != "trl" else ""
        print(f"   {side:18s} {statistics.median(wall):8.3f} {statistics.mean(wall):8.3f} {min(wall):8.3f} "
              f"{statistics.median(cpu):8.3f}  {ratio}")
    print("   (rlvrlab-torch, rlvrlab-deepspeed: the default, packed by length, prompts shared; rlvrlab-deepspeed-rows: "
          "trainer.pack_by_length=false, micro-batches of 8 rows as TRL's; rlvrlab-deepspeed-unshared: "
          "trainer.share_prompt=false)")
    for side in SIDES[:-1]:
        per_round = [statistics.median(t["wall"]) / statistics.median(r["wall"])
                     for r, t in zip(runs[side], runs["trl"])]
        print(f"   TRL / {side} per round (medians): {', '.join(f'x{x:.2f}' for x in per_round)}")

    print("\n2. tokens (response tokens incl. eos, measured steps)")
    for side in SIDES:
        tokens = pooled(side, "tokens")
        gen = [v for run in runs[side] for v in run["split"]["generate"]]
        print(f"   {side:18s} {statistics.mean(tokens) / rows:5.2f} tokens/response; rollout "
              f"{sum(tokens) / sum(gen):7.0f} tok/s of generation; {sum(tokens) / sum(pooled(side, 'wall')):6.0f} "
              f"tok per step-second; reward {statistics.mean(v for run in runs[side] for v in run['reward']):.3f}")

    print("\n3. where a step goes (means over measured steps; share of the wall time per step)")
    for side in SIDES:
        print(f"   {side:18s} {shares(side, runs[side])}")


if __name__ == "__main__":
    main()
