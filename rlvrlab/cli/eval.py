"""`rlvrlab eval pass-at-k`: sample n responses per problem, verify them, report pass@k / maj@k / avg@n.

The pipeline is `rlvrlab.eval.pipeline`; this module holds the typer signature and what is printed.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlvrlab.cli.train import AllowInitialModelChangeOpt, ProtocolOpt

eval_app = typer.Typer(help="Evaluate a model or a training run's checkpoint on datasets.", no_args_is_help=True)


def summary_table(summary: dict, ks: list[int], n: int) -> Table:
    """One column per dataset (and per source within it, when they differ), one row per statistic. Each mean over
    problems is printed with its per-problem standard error and 95% t-interval (rlvrlab.algorithms.passk.
    problem_interval); ks above n / SAMPLES_PER_K are marked (few samples per k: close to one indicator per
    problem)."""
    from rlvrlab.algorithms.passk import SAMPLES_PER_K  # rlvrlab.algorithms imports torch: not at --help

    columns: list[tuple[str, dict]] = []
    for name, entry in summary.items():
        columns.append((name, entry))
        columns += [(f"{name}/{source}", sub) for source, sub in entry.get("by_source", {}).items()]
    short = [k for k in ks if SAMPLES_PER_K * k > n]
    caption = (f"† n < {SAMPLES_PER_K}k: few samples per k, close to one indicator per problem; raise --n to "
               f"{SAMPLES_PER_K * max(short)} for k = {max(short)}") if short else None
    table = Table(title=f"n={n} samples per problem; means over problems (se: per-problem standard error) "
                        "[95% t-interval over problems]", caption=caption)
    table.add_column("statistic")
    for label, _ in columns:
        table.add_column(label, justify="right")

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    def with_interval(entry: dict, name: str) -> str:
        value, iv = entry[name], entry.get("intervals", {}).get(name)
        if value is None or not iv or iv["se"] is None:
            return fmt(value)
        return f"{value:.3f} (se {iv['se']:.3f}) [{iv['low']:.3f}, {iv['high']:.3f}]"

    table.add_row("problems", *(str(e["problems"]) for _, e in columns))
    table.add_row(f"avg@{n}", *(with_interval(e, "avg@n") for _, e in columns))
    for stat in ("pass", "maj"):
        for k in ks:
            table.add_row(f"{stat}@{k}" + (" †" if k in short else ""),
                          *(with_interval(e, f"{stat}@{k}") for _, e in columns))
    table.add_row("diversity of correct", *(fmt(e["diversity"]) for _, e in columns))
    table.add_row("  problems with a correct", *(str(e["diversity_problems"]) for _, e in columns))
    table.add_row("no answer", *(f"{e['no_answer_rate']:.1%}" for _, e in columns))
    return table


def seeds_table(outcomes: Sequence) -> Table | None:
    """Over the training seeds of one configuration (--study / --runs-of; EvalOutcome.config_hash): each mean over
    seeds and problems with the crossed seeds × problems 95% interval that `rlvrlab report` gives evaluation
    columns (rlvrlab.stats.crossed_interval), for every configuration with 2+ seeds evaluated on the same
    problems; None when there is none."""
    import numpy as np

    from rlvrlab import stats
    from rlvrlab.algorithms.passk import SAMPLES_PER_K

    by_config: dict[str, list] = defaultdict(list)
    for outcome in outcomes:
        if outcome.config_hash:
            by_config[outcome.config_hash].append(outcome)
    table = Table(title="over training seeds: means over seeds and problems [95% crossed seeds x problems "
                        "interval, as in rlvrlab report]")
    for column in ("configuration", "seeds", "dataset", "statistic"):
        table.add_column(column)
    table.add_column("mean [95% interval]", justify="right")
    shown = False
    for config, group in by_config.items():
        keyed = [{(r["dataset"], str(r["id"])): r for r in o.records} for o in group]
        if len(group) < 2 or any(k.keys() != keyed[0].keys() for k in keyed):
            continue
        names = ["avg@n", *(f"{stat}@{k}" for stat in ("pass", "maj") for k in group[0].ks)]
        for dataset in sorted({d for d, _ in keyed[0]}):
            ids = sorted(i for d, i in keyed[0] if d == dataset)
            for name in names:
                iv = stats.crossed_interval(np.asarray([[rows[(dataset, i)][name] for i in ids] for rows in keyed],
                                                       dtype=np.float64))
                short = name != "avg@n" and SAMPLES_PER_K * int(name.split("@")[1]) > group[0].n
                table.add_row(config, str(len(group)), dataset, name + (" †" if short else ""),
                              f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]")
                shown = True
    return table if shown else None


@eval_app.command("pass-at-k")
def pass_at_k(
    model: Annotated[Optional[Path], typer.Option("--model", help="A Hugging Face model folder.",
                                                  show_default=False)] = None,
    run: Annotated[Optional[str], typer.Option("--run", help="A training run id: evaluates its newest complete "
                                               "checkpoint.", show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option("--study", help="Every finished seed run of this sweep study "
                                                 "(runs already evaluated with the same settings are skipped).",
                                                 show_default=False)] = None,
    of_experiment: Annotated[Optional[str], typer.Option("--runs-of", help="Every finished training run of this "
                                                         "MLflow experiment (same skipping).",
                                                         show_default=False)] = None,
    checkpoint: Annotated[Optional[int], typer.Option("--checkpoint", help="With --run: the step to evaluate.",
                                                      show_default=False)] = None,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="Where training runs and the MLflow store "
                                             "(mlflow.db) live.")] = Path("runs"),
    dataset: Annotated[Optional[list[str]], typer.Option("--dataset", help="A dataset file name in "
                                                         "experiments/datasets/ (repeatable); with --run, "
                                                         "default: the run's own dataset.",
                                                         show_default=False)] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="A dataset override, e.g. "
                                                      "dataset.path=bench.jsonl, or NAME:dataset.path=... for one "
                                                      "of several datasets (repeatable).",
                                                      show_default=False)] = None,
    split: Annotated[str, typer.Option("--split", help="auto: the held-out problems if the dataset holds some "
                                       "out, else all; or train | eval | all.")] = "auto",
    n: Annotated[int, typer.Option("--n", help="Samples per problem.")] = 64,
    k: Annotated[str, typer.Option("--k", help="Comma-separated ks, each <= n.")] = "1,4,16,64",
    temperature: Annotated[Optional[float], typer.Option(help="Default: the run's (or default experiment's) "
                                                         "rollout.temperature.", show_default=False)] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Default: rollout.top_p of the run.",
                                                   show_default=False)] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Default: rollout.max_new_tokens of the run.",
                                                          show_default=False)] = None,
    engine: Annotated[Optional[str], typer.Option(help="hf | vllm; default: rollout.engine of the run.",
                                                  show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    limit: Annotated[Optional[int], typer.Option(help="Evaluate only the first N problems of each dataset.",
                                                 show_default=False)] = None,
    batch_prompts: Annotated[Optional[int], typer.Option(help="Prompts per generate call; default ~256/n (hf).",
                                                         show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder; default results/eval/<name>.",
                                                show_default=False)] = None,
    experiment: Annotated[Optional[str], typer.Option(help="MLflow experiment; default eval, or "
                                                      "<training experiment>-eval with --run.",
                                                      show_default=False)] = None,
    protocol: ProtocolOpt = None,
    allow_initial_model_change: AllowInitialModelChangeOpt = False,
) -> None:
    """Unbiased pass@k, exact expected maj@k and avg@n of a model on datasets, recorded in MLflow.

    [dim]rlvrlab eval pass-at-k --run 3f2a... --dataset countdown --n 64 --k 1,4,16,64
    rlvrlab eval pass-at-k --model /models/Qwen2.5-Math-1.5B --dataset math500 --n 16 --k 1,4,16 \\
        --temperature 0.6 --top-p 0.95 --max-new-tokens 4096 --engine vllm
    rlvrlab eval pass-at-k --study tiny_algorithms --n 64 --k 1,4,16,64     # every seed run of a sweep[/dim]
    """
    from rlvrlab.eval import pipeline  # torch and transformers: not needed for --help
    from rlvrlab.tracking.testbed import optional

    testbed = optional(protocol, allow_initial_model_change)  # a bad protocol file: one line before anything runs

    request = pipeline.EvalRequest(model=model, run=run, study=study, runs_of=of_experiment, checkpoint=checkpoint,
                                   output_dir=output_dir, datasets=tuple(dataset or ()), sets=tuple(set_ or ()),
                                   split=split, n=n, k=k, temperature=temperature, top_p=top_p,
                                   max_new_tokens=max_new_tokens, engine=engine, seed=seed, limit=limit,
                                   batch_prompts=batch_prompts, out=out, experiment=experiment, testbed=testbed)
    console, err = Console(soft_wrap=True), Console(stderr=True)
    with _progress_bar(err) as progress:
        outcomes = pipeline.pass_at_k(request, progress=progress,
                                      announce=lambda i, of, run_id: err.print(f"[bold]run {i}/{of}[/]: {run_id}"))
        done = []
        for outcome in outcomes:
            done.append(outcome)
            console.print(summary_table(outcome.summary, outcome.ks, outcome.n))
            console.print(f"[green]done[/]: {', '.join(str(f) for f in outcome.files)}")
            console.print(f"  MLflow run [bold]{outcome.mlflow_run_id}[/] (experiment {outcome.experiment!r}) in "
                          f"{outcome.uri}")
    if not done:
        console.print("every finished training run already has an evaluation with these settings")
    elif (over_seeds := seeds_table(done)) is not None:
        console.print(over_seeds)


@contextmanager
def _progress_bar(console: Console) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar per dataset, as a progress(label, done, total) callback."""
    from rlvrlab.cli.progress import progress_display  # rich's bar on a terminal, plain lines in a log file

    bar: Progress = progress_display(console, TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), unit="problems",
                                     disable=os.environ.get("RLVRLAB_NO_PROGRESS") == "1")
    tasks: dict[str, TaskID] = {}

    def update(label: str, done: int, total: int) -> None:
        if label not in tasks:
            tasks[label] = bar.add_task(label, total=total)
        bar.update(tasks[label], completed=done)

    with bar:
        yield update
