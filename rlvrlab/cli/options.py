"""Arguments shared by the commands (one definition, one help text)."""

from typing import Annotated, Optional

import typer

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


def split_experiment(experiment: Optional[str], overrides: Optional[list[str]]) -> tuple[Optional[str], list[str]]:
    """click fills the optional EXPERIMENT first, so `rlvrlab train algorithm=ucpo` puts an override there."""
    overrides = overrides or []
    if experiment is not None and "=" in experiment:
        return None, [experiment, *overrides]
    return experiment, overrides


def check_arguments(argv: list[str]) -> None:
    """Every command-line argument is UTF-8 text, or one line naming it: Python turns a byte of argv that is not
    UTF-8 (Latin-1 from another terminal's encoding) into a lone surrogate, which no message, log, YAML file or
    MLflow store can hold (`rlvrlab config show` failed with a UnicodeEncodeError traceback). Checked once for every
    command, before any of them reads its arguments; composition checks the config's text again (files included)."""
    from rlvrlab.config.rules import not_utf8
    from rlvrlab.errors import RlvrlabError

    for index, arg in enumerate(argv):
        problem = not_utf8(arg)
        if problem is None:
            continue
        name, equals, value = arg.partition("=")
        before = argv[index - 1] if index > 0 else ""
        if before.startswith("-") and "=" not in before and not not_utf8(before):
            what = f"the value of {before}"  # --option VALUE
        elif equals and not not_utf8(name):
            what, problem = f"the value of {name}", not_utf8(value)  # an override KEY=VALUE or --option=VALUE
        else:
            what = f"argument {index + 1}"
        raise RlvrlabError(f"{what}: {problem}, as from a terminal or file in another encoding (Latin-1); retype it "
                           "in UTF-8")
