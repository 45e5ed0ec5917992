"""`rlvrlab report`: tables (markdown, LaTeX, CSV) and plots with multi-seed confidence intervals from MLflow runs,
a CSV of per-seed values or TensorBoard event files. Its options are the fields of
rlvrlab.report.request.ReportRequest, each with its flag and help: the signature below is built from them."""

from __future__ import annotations

import sys

from rich.console import Console

from rlvrlab.cli.options import request_values, with_request_options
from rlvrlab.report.request import ReportRequest


def report(**given) -> None:
    """Group runs by configuration (seeds together), compute t-intervals and paired (or Welch) comparisons with
    Holm-adjusted p and minimum detectable effects, and write table.md / table.tex / table.csv, comparisons.csv,
    PNG plots and sources.json into results/NAME/ (docs/report.md).

    [dim]rlvrlab report --study ucpo_tau --baseline "ucpo tau=0.0"
    rlvrlab report --experiment default --baseline grpo --metric train/reward,loss/grad_norm:max:60
    rlvrlab report --study up_stability --compare "up_dapo:dapo eps_high=inf" --target-halfwidth 0.02
    rlvrlab report --runs 3f2a...,9c1b... --no-eval --format md
    rlvrlab report --experiment trl --group-by learning_rate --metric reward --tracking-uri URI
    rlvrlab report --source tensorboard:runs/trl --metric reward:mean:10 --out /tmp/trl
    rlvrlab report --reanalyse results/up_pairs[/dim]
    """
    from rlvrlab.report import render
    from rlvrlab.report.command import make_report

    outcome = make_report(ReportRequest(**request_values(ReportRequest, given),
                                        command=("rlvrlab", "report", *sys.argv[2:])))
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


with_request_options(report, ReportRequest)
