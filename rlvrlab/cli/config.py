"""`rlvrlab config show|validate`: look at the composed configuration before anything runs."""

import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from rlvrlab.config import check_files, compose, config_hash, experiments_dir, to_yaml

config_app = typer.Typer(help="Compose, show and check experiment configurations.", no_args_is_help=True)

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


@config_app.command()
def show(experiment: ExperimentArg = None, overrides: OverridesArg = None) -> None:
    """Print the resolved configuration as YAML, ending with its hash.

    [dim]rlvrlab config show algorithm=up_dapo
    rlvrlab config show experiments/toy.yaml algorithm=ucpo algorithm.tau=0.3 seed=3[/dim]
    """
    experiment, overrides = _split_experiment(experiment, overrides or [])
    cfg = compose(experiment, overrides)
    text = f"{to_yaml(cfg)}# config hash (without seed): {config_hash(cfg)}\n"
    console = Console()
    if console.is_terminal:
        console.print(Syntax(text.rstrip("\n"), "yaml", background_color="default"))
    else:
        sys.stdout.write(text)


@config_app.command()
def validate() -> None:
    """Compose every experiment file, and every group file with the default experiment; exit 1 if any fails."""
    folder = experiments_dir()
    checks = check_files()
    table = Table("file", "status", title=f"experiment files in {folder}")
    for check in checks:
        table.add_row(str(check.file.relative_to(folder)), "[red]failed" if check.error else "[green]ok")
    console = Console()
    console.print(table)
    failures = [check for check in checks if check.error]
    for check in failures:
        console.print(f"{check.file.relative_to(folder)}: {check.error}", style="red", markup=False, soft_wrap=True)
    if failures:
        raise typer.Exit(1)


def _split_experiment(experiment: Optional[str], overrides: list[str]) -> tuple[Optional[str], list[str]]:
    # click fills the optional EXPERIMENT first, so `config show algorithm=ucpo` puts an override there
    if experiment is not None and "=" in experiment:
        return None, [experiment, *overrides]
    return experiment, overrides
