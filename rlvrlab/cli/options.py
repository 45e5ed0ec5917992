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
