"""`rlvrlab config show|validate`: look at the composed configuration before anything runs."""

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from rlvrlab.cli.options import ExperimentArg, OverridesArg, split_experiment
from rlvrlab.config import check_files, compose, config_hash, experiments_dir, to_yaml

config_app = typer.Typer(help="Compose, show and check experiment configurations.", no_args_is_help=True)

@config_app.command()
def show(experiment: ExperimentArg = None, overrides: OverridesArg = None,
         memory: Annotated[bool, typer.Option("--memory", help="Also print the per-GPU memory estimate of "
                                              "trainer.world_size GPUs of trainer.device_memory_gib.")] = False
         ) -> None:
    """Print the resolved configuration as YAML, ending with its hash (and with --memory, its per-GPU memory).

    [dim]rlvrlab config show algorithm=up_dapo
    rlvrlab config show experiments/toy.yaml algorithm=ucpo algorithm.tau=0.3 seed=3
    rlvrlab config show up_grpo_qwen3_8b --memory[/dim]
    """
    experiment, overrides = split_experiment(experiment, overrides or [])
    cfg = compose(experiment, overrides)
    text = f"{to_yaml(cfg)}# config hash (without seed): {config_hash(cfg)}\n"
    if memory:
        from rlvrlab.config.memory import comment_lines

        text += comment_lines(cfg)
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
