"""`rlvrlab report`: tables (markdown, LaTeX, CSV) and plots with multi-seed confidence intervals from MLflow runs,
a CSV of per-seed values or TensorBoard event files. Its options are the fields of
rlvrlab.report.request.ReportRequest, each with its flag and help: the signature below is built from them."""

from __future__ import annotations

import inspect
import sys
import typing
from dataclasses import fields
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from rlvrlab.report.request import ReportRequest

TYPES = typing.get_type_hints(ReportRequest)  # field -> its type; a tuple[str, ...] field is a repeatable option


def report(**given) -> None:
    """Group runs by configuration (seeds together), compute t-intervals and paired (or Welch) comparisons with
    Holm-adjusted p and minimum detectable effects, and write table.md / table.tex / table.csv, comparisons.csv,
    PNG plots and sources.json into results/NAME/ (docs/report.md).

    [dim]rlvrlab report --study ucpo_tau --baseline "ucpo tau=0.0"
    rlvrlab report --experiment default --baseline grpo --metric train/reward,loss/grad_norm:max:60
    rlvrlab report --study up_stability --compare "up_dapo:dapo eps_high=inf" --target-halfwidth 0.02
    rlvrlab report --runs 3f2a...,9c1b... --no-eval --format md
    rlvrlab report --experiment trl --group-by learning_rate --metric reward --tracking-uri URI
    rlvrlab report --source tensorboard:runs/trl --metric train/reward:mean:10 --out /tmp/trl
    rlvrlab report --reanalyse results/up_pairs[/dim]
    """
    from rlvrlab.report import render
    from rlvrlab.report.command import make_report

    values: dict[str, Any] = {name: tuple(value or ()) if _repeated(name) else value for name, value in given.items()}
    outcome = make_report(ReportRequest(**values, command=("rlvrlab", "report", *sys.argv[2:])))
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


def _repeated(name: str) -> bool:
    return typing.get_origin(TYPES[name]) is tuple


def _parameter(name: str, default) -> inspect.Parameter:
    """A ReportRequest field as a typer option: its flag, help and min; a repeatable one as Optional[list[str]]."""
    option = next(f.metadata["cli"] for f in fields(ReportRequest) if f.name == name)
    kind = Optional[list[str]] if _repeated(name) else TYPES[name]
    info = typer.Option(option.flag, help=option.help, show_default=option.show_default, min=option.min)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None if _repeated(name) else default,
                             annotation=Annotated[kind, info])


report.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [_parameter(f.name, f.default) for f in fields(ReportRequest) if "cli" in f.metadata], return_annotation=None)
report.__annotations__ = {}
