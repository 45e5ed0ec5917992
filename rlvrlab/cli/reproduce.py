"""`rlvrlab reproduce`: re-run N seeds of a committed study folder and say whether they land inside its intervals,
and which recorded identity differs (rlvrlab.sweep.reproduce; docs/reproducibility.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from rlvrlab.cli.options import print_table, say


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
    from rlvrlab.sweep import view
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
    say(console, view.reproduce_header(outcome))
    for table in view.reproduce_tables(outcome):
        print_table(console, table, marked_style="red", plain=True)
    say(console, view.reproduce_footer(outcome))
    raise typer.Exit(outcome.exit_code)
