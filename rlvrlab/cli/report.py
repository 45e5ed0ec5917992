"""`rlvrlab report`: tables (markdown, LaTeX, CSV) and plots with multi-seed confidence intervals from MLflow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError

FORMATS = ("md", "tex", "csv")


def report(
    experiment: Annotated[Optional[str], typer.Option("--experiment", help="The training runs of this MLflow "
                                                      "experiment.", show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option("--study", help="The seed runs of this sweep study.",
                                                 show_default=False)] = None,
    runs: Annotated[Optional[str], typer.Option("--runs", help="Comma-separated MLflow run ids.",
                                                show_default=False)] = None,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="Compare every group with this one "
                                                    "(an algorithm name or a group label).",
                                                    show_default=False)] = None,
    metric: Annotated[Optional[list[str]], typer.Option("--metric", help="Training metric(s) for the table and "
                                                        "curves (repeat or comma-separate); default: the study's "
                                                        "objective, else train/reward.", show_default=False)] = None,
    last: Annotated[Optional[int], typer.Option("--last", min=1, help="Per run: reduce the metric over its last N "
                                                "steps (default: the study's window, else 10).",
                                                show_default=False)] = None,
    reduce: Annotated[str, typer.Option("--reduce", help="mean | max | min over those steps.")] = "mean",
    evaluations: Annotated[bool, typer.Option("--eval/--no-eval", help="Include the runs' `rlvrlab eval "
                                              "pass-at-k` records (when they have any).")] = True,
    eval_stats: Annotated[Optional[str], typer.Option("--eval-stats", help="Evaluation columns, e.g. "
                                                      "avg@n,pass@1,pass@16,maj@16,diversity (default: avg@n, "
                                                      "every pass@k, the largest maj@k, diversity).",
                                                      show_default=False)] = None,
    formats: Annotated[str, typer.Option("--format", help="Any of md,tex,csv.")] = "md,tex,csv",
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default results/<experiment or "
                                                "study>).", show_default=False)] = None,
    interval: Annotated[str, typer.Option("--interval", help="bracket: mean [lo, hi]; pm: mean ± half-width.")]
    = "bracket",
    heatmap_keys: Annotated[Optional[str], typer.Option("--heatmap", help="Two swept keys KEY1,KEY2 for a study's "
                                                        "heatmap (default: its first two).",
                                                        show_default=False)] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots.")] = True,
    smooth: Annotated[int, typer.Option("--smooth", min=1, help="Moving average (steps) for training curves.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="RNG seed of the bootstrap (recorded).")] = 0,
    reps: Annotated[int, typer.Option("--reps", min=100, help="Bootstrap replicates.")] = 10_000,
    only_changed: Annotated[bool, typer.Option("--only-changed/--all-keys", help="Label groups by the config keys "
                                               "that differ between them, or by every key.")] = True,
    tracking_uri: Annotated[Optional[str], typer.Option("--tracking-uri", help="MLflow URI (default: "
                                                        "sqlite:///<output-dir>/mlflow.db).", show_default=False)]
    = None,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="The runs' output_dir (for the default MLflow "
                                             "store).")] = Path("runs"),
) -> None:
    """Group runs by configuration (seeds together), compute bootstrap intervals and baseline comparisons, and
    write table.md / table.tex / table.csv, PNG plots and sources.json into results/NAME/.

    [dim]rlvrlab report --study ucpo_tau
    rlvrlab report --experiment default --baseline grpo --metric train/reward,policy/entropy
    rlvrlab report --runs 3f2a...,9c1b... --no-eval --format md[/dim]
    """
    import numpy as np

    from rlvrlab.report import collect, plots as plotting, render
    from rlvrlab.report.table import build, lower_is_better
    from rlvrlab.tracking.store import default_uri

    chosen = [f.strip() for f in formats.split(",") if f.strip()]
    bad = [f for f in chosen if f not in FORMATS]
    if bad or not chosen:
        raise RlvrlabError(f"--format {formats!r}: use any of {', '.join(FORMATS)}, comma-separated")
    if interval not in ("bracket", "pm"):
        raise RlvrlabError(f"--interval {interval!r}: use bracket or pm")
    if reduce not in ("mean", "max", "min"):
        raise RlvrlabError(f"--reduce {reduce!r}: use mean, max or min")
    outputs.check_dir(out if out is not None else Path("results"), f"--out {out}" if out is not None else "results")
    uri = tracking_uri or default_uri(output_dir)
    if tracking_uri is None and not (output_dir / "mlflow.db").is_file():
        raise RlvrlabError(f"no MLflow store at {output_dir / 'mlflow.db'}; pass --output-dir of the runs or "
                           "--tracking-uri")
    run_ids = [r.strip() for r in (runs or "").split(",") if r.strip()]
    selection = collect.select(uri, experiment=experiment, study=study, run_ids=run_ids, only_changed=only_changed)
    client = collect.client_for(uri)

    study_params = _study_params(client, selection) if study else {}
    metrics = [m.strip() for entry in (metric or []) for m in entry.split(",") if m.strip()]
    if not metrics:
        metrics = [study_params.get("objective.metric", "train/reward")]
    last = last or int(study_params.get("objective.window", 10))
    available = collect.available_metrics(client, selection)
    for name in metrics:
        if name not in available:
            from rlvrlab.config.rules import unknown

            raise unknown("metric", name, available, where=f"the runs of {selection.experiment!r}")

    evals = collect.eval_records(client, selection) if evaluations else None
    stats_columns = _eval_columns(evals, eval_stats)
    result = build(client, selection, metrics=metrics, last=last, reduce=reduce, evals=evals,
                   eval_stats=stats_columns, baseline=baseline, seed=seed, reps=reps)

    folder = out or Path("results") / outputs.path_part(selection.study or selection.experiment)
    outputs.check_dir(folder, f"--out {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    texts = {"md": render.markdown(result, interval), "tex": render.latex(result, interval),
             "csv": render.to_csv(result)}
    for fmt in chosen:
        path = folder / f"table.{fmt}"
        path.write_text(texts[fmt])
        written.append(path)
    if plots:
        rng = np.random.default_rng(seed)
        for name in metrics:
            written.append(plotting.training_curves(client, selection, name, folder, rng, smooth))
        if evals is not None:
            for dataset in evals.datasets:
                path = plotting.passk_curves(selection, evals, dataset, folder, rng, min(reps, 2000))
                if path is not None:
                    written.append(path)
        keys = _heatmap_keys(selection, heatmap_keys)
        if keys is not None:
            means = {c.group: c.mean for c in result.cells if c.section == "train" and c.metric == metrics[0]}
            written.append(plotting.heatmap(selection, means, keys, metrics[0], folder,
                                            not lower_is_better(metrics[0])))
    sidecar = folder / "sources.json"
    sidecar.write_text(render.sources(selection, result, ["rlvrlab", "report", *sys.argv[2:]],
                                      evals.eval_runs if evals else {}, [p.name for p in written]))
    written.append(sidecar)

    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(soft_wrap=True, width=200)
    for table in render.rich_tables(result):
        console.print(table)
    for note in result.notes:
        console.print(f"[dim]{note}[/]")
    console.print(f"wrote {', '.join(p.name for p in written)} to {folder}")


def _study_params(client, selection) -> dict[str, str]:
    found = client.get_experiment_by_name(selection.study)
    runs = client.search_runs([found.experiment_id], filter_string="tags.`rlvrlab.role` = 'study'", max_results=1)
    return dict(runs[0].data.params) if runs else {}


def _eval_columns(evals, wanted: Optional[str]) -> list[str]:
    if evals is None:
        return []
    if wanted:
        columns = [c.strip() for c in wanted.split(",") if c.strip()]
        bad = [c for c in columns if c not in evals.statistics]
        if bad:
            raise RlvrlabError(f"--eval-stats {bad[0]!r} is not in the evaluation records; they have "
                               f"{', '.join(evals.statistics)}")
        return columns
    passes = [s for s in evals.statistics if s.startswith("pass@")]
    majs = [s for s in evals.statistics if s.startswith("maj@")]
    return ["avg@n", *passes, *(majs[-1:]), "diversity"]


def _heatmap_keys(selection, text: Optional[str]) -> Optional[tuple[str, str]]:
    if text:
        keys = [k.strip() for k in text.split(",") if k.strip()]
        if len(keys) != 2:
            raise RlvrlabError(f"--heatmap {text!r}: give two keys, e.g. --heatmap algorithm.tau,trainer.staleness")
        return keys[0], keys[1]
    if selection.study and len(selection.swept) >= 2:
        return selection.swept[0], selection.swept[1]
    return None
