"""`rlvrlab report`: tables (markdown, LaTeX, CSV) and plots with multi-seed confidence intervals from MLflow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console


def report(
    experiment: Annotated[Optional[str], typer.Option("--experiment", help="The training runs of this MLflow "
                                                      "experiment (with --group-by: any runs of it).",
                                                      show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option("--study", help="The seed runs of this sweep study.",
                                                 show_default=False)] = None,
    runs: Annotated[Optional[str], typer.Option("--runs", help="Comma-separated MLflow run ids.",
                                                show_default=False)] = None,
    group_by: Annotated[Optional[str], typer.Option("--group-by", help="Group any MLflow runs (e.g. TRL's or "
                                                    "verl's) of --experiment or --runs by these params or tags, "
                                                    "KEY[,KEY] (a param, else a tag; params.KEY or tags.KEY to say "
                                                    "which), instead of by rlvrlab's config hash.",
                                                    show_default=False)] = None,
    seed_key: Annotated[Optional[str], typer.Option("--seed-key", help="With --group-by: the param or tag holding "
                                                    "each run's integer seed; groups with the same seeds are paired "
                                                    "[default: seed].", show_default=False)] = None,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="Compare every group with this one "
                                                    "(an algorithm name or a group label).",
                                                    show_default=False)] = None,
    metric: Annotated[Optional[list[str]], typer.Option("--metric", help="Training metric(s) for the table and "
                                                        "curves, each NAME[:REDUCE[:LAST]] (repeat or comma-separate),"
                                                        " e.g. loss/grad_norm:max:60,train/reward:mean:20; default: "
                                                        "the study's objective, else train/reward.",
                                                        show_default=False)] = None,
    last: Annotated[Optional[int], typer.Option("--last", min=1, help="Per run: reduce a metric over its last N "
                                                "steps unless it says (default: the study's window, else 10).",
                                                show_default=False)] = None,
    reduce: Annotated[str, typer.Option("--reduce", help="mean | max | min | auc (area under the curve per step) "
                                        "over those steps, unless the metric says.")] = "mean",
    compare: Annotated[Optional[list[str]], typer.Option("--compare", help="Extra comparisons A:B (group labels or "
                                                         "algorithm names; repeat or comma-separate); best:B compares "
                                                         "the best group (selected, adjusted over the candidates) "
                                                         "with B; A:B[m1|m2] tests it on those columns only. All "
                                                         "comparisons of a report are one Holm family.",
                                                         show_default=False)] = None,
    target_halfwidth: Annotated[Optional[float], typer.Option("--target-halfwidth", min=0.0, help="Print, per group "
                                                              "and metric, the seeds needed for a 95% interval of "
                                                              "this half-width.", show_default=False)] = None,
    rarefy: Annotated[int, typer.Option("--rarefy", min=1, help="rarefied@M: expected distinct correct forms "
                                        "among M correct responses (problems with at least M).")] = 4,
    allow_dirty: Annotated[bool, typer.Option("--allow-dirty", help="Write into results/ although some runs were "
                                              "trained from a tree with uncommitted changes (the table says so).")]
    = False,
    allow_mixed: Annotated[bool, typer.Option("--allow-mixed", help="Write into results/ although the runs come "
                                              "from more than one commit, and compare groups started from "
                                              "different initial models (refused anywhere without it; the table "
                                              "says so).")] = False,
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
    only_changed: Annotated[bool, typer.Option("--only-changed/--all-keys", help="Label groups by the config keys "
                                               "that differ between them, or by every key.")] = True,
    tracking_uri: Annotated[Optional[str], typer.Option("--tracking-uri", help="MLflow URI (default: "
                                                        "sqlite:///<output-dir>/mlflow.db).", show_default=False)]
    = None,
    event: Annotated[Optional[list[str]], typer.Option("--event", help="An event in the training curves, 'NAME: "
                                                       "METRIC OP VALUE [for K] | ... | nonfinite' (VALUE may be "
                                                       "F*initial); its rate per group with exact intervals and exact "
                                                       "tests against --baseline. Repeatable.",
                                                       show_default=False)] = None,
    protocol: Annotated[Optional[Path], typer.Option("--protocol", help="The study's protocol file: its commits go "
                                                     "into sources.json, the table says whether the study was "
                                                     "pre-registered (committed, unchanged since before the first "
                                                     "run), and its verdict rules (docs/report.md) are evaluated.",
                                                     show_default=False)] = None,
    equivalence: Annotated[Optional[str], typer.Option("--equivalence", help="Equivalence tests (TOST) at this "
                                                       "margin, in the metric's units: M for every column, or "
                                                       "NAME=M per column, comma-separated; they join the Holm "
                                                       "family, and a row reads 'equivalent within ±M' when its "
                                                       "Holm p < 0.05.", show_default=False)] = None,
    reanalyse: Annotated[Optional[Path], typer.Option("--reanalyse", help="Re-compute the tables of this results "
                                                      "folder from its recorded values (per_seed.csv, per_problem.csv"
                                                      ") and options (sources.json), without the runs; with --out "
                                                      "(default: the folder itself) and --protocol only.",
                                                      show_default=False)] = None,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="The runs' output_dir (for the default MLflow "
                                             "store).")] = Path("runs"),
) -> None:
    """Group runs by configuration (seeds together), compute t-intervals and paired (or Welch) comparisons with
    Holm-adjusted p and minimum detectable effects, and write table.md / table.tex / table.csv, comparisons.csv,
    PNG plots and sources.json into results/NAME/ (docs/report.md).

    [dim]rlvrlab report --study ucpo_tau --baseline "ucpo tau=0.0"
    rlvrlab report --experiment default --baseline grpo --metric train/reward,loss/grad_norm:max:60
    rlvrlab report --study up_stability --compare "up_dapo:dapo eps_high=inf" --target-halfwidth 0.02
    rlvrlab report --runs 3f2a...,9c1b... --no-eval --format md
    rlvrlab report --experiment trl --group-by learning_rate --metric reward --tracking-uri URI
    rlvrlab report --reanalyse results/up_pairs[/dim]
    """
    from rlvrlab.report import render
    from rlvrlab.report.command import ReportRequest, make_report

    outcome = make_report(ReportRequest(
        experiment=experiment, study=study, runs=runs, baseline=baseline, metric=tuple(metric or ()), last=last,
        reduce=reduce, compare=tuple(compare or ()), target_halfwidth=target_halfwidth, rarefy=rarefy,
        allow_dirty=allow_dirty, allow_mixed=allow_mixed, evaluations=evaluations, eval_stats=eval_stats,
        formats=formats, out=out, interval=interval, heatmap_keys=heatmap_keys, plots=plots, smooth=smooth,
        only_changed=only_changed, tracking_uri=tracking_uri, output_dir=output_dir, events=tuple(event or ()),
        protocol=protocol, equivalence=equivalence, group_by=group_by, seed_key=seed_key,
        command=("rlvrlab", "report", *sys.argv[2:]), reanalyse=reanalyse))
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(soft_wrap=True, width=200)
    for table in render.rich_tables(outcome.result):
        console.print(table)
    for note in outcome.result.notes:
        console.print(f"[dim]{note}[/]")
    if outcome.verdicts is not None:
        from rlvrlab.report.verdict import lines

        for line in lines(outcome.verdicts):
            console.print(line, markup=False)
    console.print(f"wrote {', '.join(p.name for p in outcome.written)} to {outcome.folder}")
