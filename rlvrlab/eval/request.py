"""`rlvrlab eval pass-at-k`'s options, defined once: each field of EvalRequest with `Option` metadata is an option
with its flag and help, and rlvrlab.cli.eval builds the typer command from these fields (as rlvrlab report does
from rlvrlab.report.request); rlvrlab.eval.pipeline checks them before the model is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlvrlab.config.flags import option as _opt
from rlvrlab.tracking.testbed import Testbed


@dataclass(frozen=True)
class EvalRequest:
    """One `rlvrlab eval pass-at-k` invocation. Unset sampling fields default to the run's (or the default
    experiment's) rollout settings."""

    model: Optional[Path] = _opt(None, "--model", "A Hugging Face model folder.")
    run: Optional[str] = _opt(None, "--run", "A training run id: evaluates its newest complete checkpoint.")
    study: Optional[str] = _opt(None, "--study", "Every finished seed run of this sweep study (runs already "
                                "evaluated with the same settings are skipped).")
    runs_of: Optional[str] = _opt(None, "--runs-of", "Every finished training run of this MLflow experiment (same "
                                  "skipping).")
    checkpoint: Optional[int] = _opt(None, "--checkpoint", "With --run: the step to evaluate.")
    output_dir: Path = _opt(Path("runs"), "--output-dir", "Where training runs and the MLflow store (mlflow.db) live.",
                            shown=True)
    datasets: tuple[str, ...] = _opt((), "--dataset", "A dataset file name in experiments/datasets/ (repeatable); "
                                     "with --run, default: the run's own dataset.")
    sets: tuple[str, ...] = _opt((), "--set", "A dataset override, e.g. dataset.path=bench.jsonl, or "
                                 "NAME:dataset.path=... for one of several datasets (repeatable).")
    split: str = _opt("auto", "--split", "auto: the held-out problems if the dataset holds some out, else all; or "
                      "train | eval | all.", shown=True)
    n: int = _opt(64, "--n", "Samples per problem.", shown=True)
    k: str = _opt("1,4,16,64", "--k", "Comma-separated ks, each <= n.", shown=True)
    temperature: Optional[float] = _opt(None, "--temperature", "Default: the run's (or default experiment's) "
                                        "rollout.temperature.")
    top_p: Optional[float] = _opt(None, "--top-p", "Default: rollout.top_p of the run.")
    max_new_tokens: Optional[int] = _opt(None, "--max-new-tokens", "Default: rollout.max_new_tokens of the run.")
    engine: Optional[str] = _opt(None, "--engine", "hf | vllm; default: rollout.engine of the run.")
    seed: int = _opt(0, "--seed", "Sampling seed.", shown=True)
    limit: Optional[int] = _opt(None, "--limit", "Evaluate only the first N problems of each dataset.")
    batch_prompts: Optional[int] = _opt(None, "--batch-prompts", "Prompts per generate call; default ~256/n (hf).")
    out: Optional[Path] = _opt(None, "--out", "Output folder; default results/eval/<name>.")
    experiment: Optional[str] = _opt(None, "--experiment", "MLflow experiment; default eval, or <training "
                                     "experiment>-eval with --run.")
    testbed: Optional[Testbed] = None  # --protocol: the initial model its test bed fixes (rlvrlab.tracking.testbed)
