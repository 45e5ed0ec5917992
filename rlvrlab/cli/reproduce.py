"""`rlvrlab reproduce`: re-run N seeds of a committed study folder and say whether they land inside its intervals,
and which recorded identity differs (rlvrlab.sweep.reproduce; docs/reproducibility.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console


def reproduce(
    folder: Annotated[Path, typer.Argument(help="A study folder written by `rlvrlab report --study`, e.g. "
                                           "results/ucpo_pairs.", show_default=False)],
    seeds: Annotated[int, typer.Option("--seeds", help="Re-run the first N seeds that the chosen groups share.")]
    = 2,
    groups: Annotated[Optional[str], typer.Option("--groups", help="Group labels LABEL[,LABEL] (default: the groups "
                                                  "of the folder's comparisons).", show_default=False)] = None,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="Where the re-runs are recorded (MLflow "
                                             "experiment <study>-reproduce).")] = Path("runs") / "reproduce",
    sweep: Annotated[Optional[Path], typer.Option("--sweep", help="The study's sweep file (default: the file in "
                                                  "sweeps/ whose name is the folder's study).",
                                                  show_default=False)] = None,
    at_recorded_commit: Annotated[bool, typer.Option("--at-recorded-commit", help="Run the seeds with the code of "
                                                     "the runs' recorded commit (a temporary shared clone of this "
                                                     "repository, removed after), not this checkout's.")] = False,
) -> None:
    """Re-run seeds of a committed study with its sweep's configuration and print, per seed, group and comparison,
    whether the re-run lands inside the committed interval, and which recorded identity (commit, initial model,
    environment, config) differs. Exit 0: every re-run value inside; 1: some outside; 2: bad input.

    [dim]rlvrlab reproduce results/ucpo_pairs --seeds 2
    rlvrlab reproduce results/up_pairs --seeds 3 --groups "grpo,up_grpo"
    rlvrlab reproduce results/ucpo_pairs --seeds 2 --at-recorded-commit[/dim]
    """
    from rlvrlab.errors import StorageError
    from rlvrlab.sweep.reproduce import InputError, Request, reproduce as rerun

    console = Console(soft_wrap=True)
    progress = Console(stderr=True, soft_wrap=True)
    asked = tuple(g.strip() for g in (groups or "").split(",") if g.strip())
    try:
        outcome = rerun(Request(folder, seeds, asked, output_dir, sweep, at_recorded_commit),
                        on_run=lambda label, seed, done, total: progress.print(
                            f"[{done + 1}/{total}] {label} seed {seed}", markup=False, highlight=False))
    except InputError as error:
        if isinstance(error, StorageError):
            raise
        Console(stderr=True).print(f"error: {error}", style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    for line in _header(outcome):
        console.print(line, markup=False, highlight=False)
    for title, columns, rows in _tables(outcome):
        _print_table(console, title, columns, rows)
    for line in outcome.footer():
        console.print(line, markup=False, highlight=False)
    console.print(f"re-runs: {outcome.output_dir} (MLflow experiment {outcome.study}-reproduce); exit "
                  f"{outcome.exit_code}", markup=False, highlight=False)
    raise typer.Exit(outcome.exit_code)


def _header(o) -> list[str]:
    sha, dirty = o.checkout
    recorded = ", ".join(c[:12] for c in o.recorded_commits)
    same = o.recorded_commits == [sha]
    lines = [f"reproduce {o.folder} (study {o.study}, sweep file {o.sweep_file}), seeds "
             f"{' '.join(map(str, o.seeds))} of {o.committed_seeds}",
             f"RECORDED COMMIT: {recorded}   THIS CHECKOUT: {sha[:12]}{' (dirty)' if dirty else ''}"
             f"   ({_versus(same, dirty)})"]
    if o.at_commit:
        lines.append(f"RE-RUN WITH THE CODE OF THE RECORDED COMMIT {o.at_commit[:12]} (a temporary shared clone, "
                     "removed after), not this checkout's")
    elif not same:
        lines.append("  to re-run with the recorded commit's code: add --at-recorded-commit "
                     "(docs/reproducibility.md)")
    return lines


def _versus(same: bool, dirty: bool) -> str:
    if same:
        return "same commit, with uncommitted changes here" if dirty else "same commit"
    return "DIFFERENT: the re-runs run this checkout's code" + (", with uncommitted changes" if dirty else "")


def _number(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.6g}"


def _tables(o) -> list[tuple[str, list[str], list[list[str]]]]:
    seeds = [[r.group, r.metric, str(r.seed), _number(r.committed), _number(r.rerun), _number(r.difference),
              f"[{r.low:.4g}, {r.high:.4g}]", r.status + (f": {r.failed}" if r.failed else "")] for r in o.rows]
    groups = [[g.group, g.metric, f"{g.mean:.4g} [{g.low:.4g}, {g.high:.4g}] ({g.n_committed} seeds)",
               _number(g.committed_mean), _number(g.rerun_mean),
               "-" if g.inside is None else "inside" if g.inside else "outside"] for g in o.groups]
    comparisons = [[f"{c.a} - {c.b}", c.metric, f"{c.delta:.4g} [{c.low:.4g}, {c.high:.4g}]",
                    f"{_number(c.rerun_delta)} ({c.n} paired seed{'s' * (c.n != 1)})",
                    "-" if c.inside is None else "inside" if c.inside else "outside"] for c in o.comparisons]
    identities = [[i.what, i.committed, i.rerun, i.verdict] for i in o.identities]
    n = len(o.seeds)
    return [
        ("per seed", ["group", "metric", "seed", "committed", "re-run", "|difference|", "committed interval",
                      "lands"], seeds),
        ("per group", ["group", "metric", "committed mean [95% CI]", f"committed, these {n} seed{'s' * (n != 1)}",
                       f"re-run, {n} seed{'s' * (n != 1)}", "re-run mean lands"], groups),
        *([("per comparison", ["a - b", "metric", "committed delta [95% CI]", "re-run delta", "re-run delta lands"],
            comparisons)] if comparisons else []),
        ("recorded identity", ["what", "committed runs", "re-runs", "verdict"], identities),
    ]


def _print_table(console: Console, title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A rich table on a terminal; aligned plain text otherwise (logs, pipes, tests)."""
    if console.is_terminal:
        from rich.table import Table

        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row, style="red" if any(cell.startswith(("OUTSIDE", "run failed", "differs"))
                                                   for cell in row) else None)
        console.print(table)
        return
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows)]
    console.print(f"{title}:", markup=False, highlight=False)
    for row in [columns, *rows]:
        console.print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(),
                      markup=False, highlight=False)
