"""GRPO with TRL's GRPOTrainer, logging to MLflow (or TensorBoard): the script a lab adapts to sweep its own TRL
training with `rlvrlab sweep` (sweeps/examples/trl_grpo.yaml; docs/sweeps.md, "Sweeping another trainer's command"),
or to report its TensorBoard event files (docs/report.md, "Sources").

    .venv/bin/pip install -e '.[dev]'                     # trl==1.16.0 (also in the bench extra)
    .venv/bin/python examples/trl_grpo.py --learning-rate 1e-4 --seed 0 --steps 4      # alone: its own MLflow run
    .venv/bin/rlvrlab sweep sweeps/examples/trl_grpo.yaml                              # 2 learning rates x 2 seeds
    .venv/bin/python examples/trl_grpo.py --report-to tensorboard --seed 0 --output-dir runs/trl/learning_rate=0.0001

What is TRL's and what is rlvrlab's: the trainer, its loss and its MLflow logging are TRL's (GRPOTrainer with
`report_to=["mlflow"]`: transformers' MLflowCallback, which calls `mlflow.start_run()`, and so logs into the run
that MLFLOW_RUN_ID names when rlvrlab's sweep sets it). Only the task comes from rlvrlab, to have something
small that trains on CPU: the tiny tier's model folder (a 4-layer Qwen2 built and warm-started locally once, then
cached; --model PATH takes any Hugging Face causal-LM folder instead), its Countdown prompts, and its Countdown
verifier as the reward function (1 for a correct equation, else 0). A lab replaces these with its own model,
dataset and reward; the command-line options and `report_to` are all the sweep needs.

TRL logs each step's `reward`, `reward_std`, `rewards/countdown_reward/mean`, `loss`, `entropy`, ... to MLflow
(names without a `train/` prefix), at step = TRL's global step, every --logging-steps. With --report-to tensorboard
the same values go to OUTPUT_DIR/runs/<date_host>/ as `train/reward`, ... (float32), with the TrainingArguments
(seed included) as the `args` text; `rlvrlab report --source tensorboard:DIR` reads them under MLflow's names.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0, help="TRL's seed (sampling, data order, initialisation)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (TRL's max_steps)")
    parser.add_argument("--model", type=Path, default=None,
                        help="a Hugging Face causal-LM folder (default: rlvrlab's tiny tier model, built once)")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4, help="completions per prompt (the GRPO group)")
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model)")
    parser.add_argument("--loss-type", default="dapo", help="TRL's loss_type: grpo, dapo, dr_grpo, bnpo, ...")
    parser.add_argument("--logging-steps", type=int, default=1)
    parser.add_argument("--output-dir", type=Path, default=None, help="TRL's output_dir (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--report-to", default="mlflow",
                        help="TRL's report_to, comma-separated: mlflow, tensorboard or both (tensorboard,mlflow)")
    return parser.parse_args(argv)


def countdown_task(model: Path | None, count: int):
    """(model folder, tokenizer, prompts with their answers, reward function) of rlvrlab's tiny Countdown task."""
    from rlvrlab.components import load_tokenizer, model_folder, prompt_renderer
    from rlvrlab.config import compose
    from rlvrlab.data import load_split
    from rlvrlab.rewards import VERIFIERS

    cfg = compose(None, ["seed=0"])  # the default experiment: the tiny tier, Countdown; its model of warm start 0
    problems = load_split(cfg.dataset, cfg.model)
    folder = model if model is not None else model_folder(cfg, problems)
    tokenizer = load_tokenizer(folder)
    render = prompt_renderer(cfg.dataset, tokenizer)
    rows = [{"prompt": tokenizer.decode(render(p)), "answer": p.answer} for p in problems[:count]]
    check = VERIFIERS[cfg.dataset.verifier].check

    def countdown_reward(completions, answer, **_):
        return [check(completion, target).score for completion, target in zip(completions, answer)]

    return folder, tokenizer, rows, countdown_reward


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    rows_per_step = args.prompts_per_step * args.num_generations
    folder, tokenizer, rows, reward = countdown_task(args.model, args.prompts_per_step * (args.steps + 1))
    scratch = tempfile.TemporaryDirectory(prefix="trl-grpo-")  # output_dir when none is given; removed at exit
    config = GRPOConfig(
        output_dir=str(args.output_dir or scratch.name), max_steps=args.steps,
        seed=args.seed, learning_rate=args.learning_rate, beta=args.beta, loss_type=args.loss_type,
        per_device_train_batch_size=rows_per_step, gradient_accumulation_steps=1,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        use_cpu=True, bf16=False, fp16=False, logging_steps=args.logging_steps,
        report_to=[name.strip() for name in args.report_to.split(",") if name.strip()],
        save_strategy="no", eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer)
    trainer.train()


if __name__ == "__main__":
    main()
