"""The `rlvrlab` command: wires the sub-apps, and shows a RlvrlabError as one red line instead of a traceback."""

import os
import sys

import typer
from rich.console import Console

from rlvrlab.cli.config import config_app
from rlvrlab.cli.eval import eval_app
from rlvrlab.cli.model import model_app
from rlvrlab.cli.plan import plan
from rlvrlab.cli.report import report
from rlvrlab.cli.reproduce import reproduce
from rlvrlab.cli.sweep import sweep
from rlvrlab.cli.train import train
from rlvrlab.config.compose import check_arguments
from rlvrlab.errors import RlvrlabError
from rlvrlab.outputs import full_or_held, storage_line
from rlvrlab.procs import ignore_further_signals, install_stop_handlers, stop_requested
from rlvrlab.sweep.exits import SweepExit

app = typer.Typer(
    name="rlvrlab",
    help="RL with verifiable rewards for LLM reasoning: GRPO, DAPO, GSPO, Dr.GRPO, RLOO, REINFORCE++, UCPO, UP.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,  # RLVRLAB_DEBUG=1 shows Python's own traceback, easy to paste
)
app.add_typer(config_app, name="config")
app.add_typer(eval_app, name="eval")
app.add_typer(model_app, name="model")
app.command()(train)
app.command()(sweep)
app.command()(report)
app.command()(reproduce)
app.command("plan")(plan)


def main() -> None:
    """The command; a user's mistake or a full disk ends in one line and exit code 1, an unexpected error with its
    traceback."""
    install_stop_handlers()  # `kill` stops a run as Ctrl-C does: MLflow run KILLED, checkpoints kept
    try:
        check_arguments(sys.argv[1:])  # every argument UTF-8 text, before any command quotes one
        app()
    except RlvrlabError as error:
        if stop_requested() is not None:  # a second Ctrl-C must not cut the message short
            ignore_further_signals()
        if os.environ.get("RLVRLAB_DEBUG") == "1" and not isinstance(error, SweepExit):
            raise
        # soft_wrap: the message stays one line however narrow the terminal
        Console(stderr=True).print(f"error: {error}", style="red", markup=False, highlight=False, soft_wrap=True)
        sys.exit(error.code if isinstance(error, SweepExit) else 1)  # a sweep's own codes (rlvrlab.sweep.exits)
    except Exception as error:  # a full disk or a held store the command did not word itself: one line too
        trouble = full_or_held(error)
        if trouble is None or os.environ.get("RLVRLAB_DEBUG") == "1":
            raise
        Console(stderr=True).print(f"error: {storage_line(error, trouble)}", style="red", markup=False,
                                   highlight=False, soft_wrap=True)
        sys.exit(1)
    finally:
        if stop_requested() is not None:  # on its way out after a stop: a late signal must not break the exit
            ignore_further_signals()


if __name__ == "__main__":
    main()
