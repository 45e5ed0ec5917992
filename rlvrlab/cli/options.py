"""Arguments shared by the commands (one definition, one help text), the typer options built from a request's
fields, and the printing of what a library call returns (plain lines and tables)."""

import inspect
import typing
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

ExperimentArg = Annotated[
    Optional[str],
    typer.Argument(
        help="Experiment name (experiments/NAME.yaml) or path to a YAML file; default: default. "
        "A first argument with '=' is an override.",
        show_default=False,
    ),
]
OverridesArg = Annotated[
    Optional[list[str]],
    typer.Argument(help="GROUP=FILE (algorithm=ucpo) or KEY=VALUE (algorithm.tau=0.3, seed=3).", show_default=False),
]

# `rlvrlab train`, `sweep` and `eval pass-at-k`: a protocol's fixed initial model (rlvrlab.tracking.testbed)
ProtocolOpt = Annotated[
    Optional[Path],
    typer.Option("--protocol", help="The study's protocol file (results/protocols/NAME.md): when its ```testbed "
                 "block fixes the initial model's digest, a run starting from another model stops before it runs.",
                 show_default=False),
]
AllowInitialModelChangeOpt = Annotated[
    bool,
    typer.Option("--allow-initial-model-change", help="Run even when the initial model differs from the one "
                 "--protocol fixes (recorded on the run as rlvrlab.initial_model.override)."),
]


def with_request_options(command, request_type, *, after: int = 0):
    """`command(..., **given)` with a typer signature: its own parameters, and the options of `request_type` (the
    fields with `cli` metadata: an Option with flag, help, show_default, min) inserted after its first `after`
    parameters. A command's options are defined once, in its library request; a tuple field is repeatable."""
    hints = typing.get_type_hints(request_type)
    options = []
    for f in fields(request_type):
        if "cli" in f.metadata:
            option, repeated = f.metadata["cli"], typing.get_origin(hints[f.name]) is tuple
            info = typer.Option(option.flag, help=option.help, show_default=option.show_default, min=option.min)
            options.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None if repeated else
                                             f.default, annotation=Annotated[Optional[list[str]] if repeated else
                                                                             hints[f.name], info]))
    own = typing.get_type_hints(command, include_extras=True)
    params = [p.replace(annotation=own[p.name]) for p in inspect.signature(command).parameters.values()
              if p.kind is not inspect.Parameter.VAR_KEYWORD]
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[after:]]
    command.__signature__ = inspect.Signature([*params[:after], *options, *rest], return_annotation=None)
    command.__annotations__ = {}
    return command


def request_values(request_type, given: dict) -> dict:
    """The typer values of a request's options as its fields (a repeatable option's None as ())."""
    hints = typing.get_type_hints(request_type)
    return {name: tuple(value or ()) if typing.get_origin(hints[name]) is tuple else value
            for name, value in given.items()}


def say(console: Console, lines: list[str], *, green: tuple[str, ...] = ("done",)) -> None:
    """Each line as plain text (no markup read from a path or a name); a leading `done:` (or another of `green`)
    in green."""
    for line in lines:
        head, colon, rest = line.partition(": ")
        if colon and head in green:
            console.print(Text.assemble((head, "green"), colon + rest))
        else:
            console.print(line, markup=False, highlight=False)


def print_table(console: Console, table, *, marked_style: Optional[str] = None, plain: bool = False) -> None:
    """A library's table (rlvrlab.eval.view.Table) drawn by rich; with `plain` and no terminal (logs, pipes, tests),
    its title and aligned columns as plain text."""
    if plain and not console.is_terminal:
        widths = [max(len(cell) for cell in column) for column in zip(table.columns, *table.rows)]
        say(console, [f"{table.title}:", *("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                                              .rstrip() for row in [table.columns, *table.rows])])
        return
    from rich.table import Table

    drawn = Table(title=table.title, caption=table.caption)
    for index, column in enumerate(table.columns):
        drawn.add_column(column, justify="right" if index in table.right else "left", no_wrap=index in table.nowrap)
    for index, row in enumerate(table.rows):
        drawn.add_row(*row, style=marked_style if index in table.marked else None)
    console.print(drawn)


def split_experiment(experiment: Optional[str], overrides: Optional[list[str]]) -> tuple[Optional[str], list[str]]:
    """click fills the optional EXPERIMENT first, so `rlvrlab train algorithm=ucpo` puts an override there."""
    overrides = overrides or []
    if experiment is not None and "=" in experiment:
        return None, [experiment, *overrides]
    return experiment, overrides
