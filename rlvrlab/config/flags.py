"""A request field's command-line form, defined once for every command: each field of a request dataclass
(ReportRequest, EvalRequest, SweepRequest) that carries `option(...)` metadata is one flag, and rlvrlab.cli.options
builds the typer command from those fields, so that an option's flag, help and default exist in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Option:
    """A field's command-line form: `flag` ("--x", or "--x/--no-x" for a switch), its help, whether --help shows
    its default, the typer `min`."""

    flag: str
    help: str
    show_default: bool = False
    min: Optional[float] = None

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(self.flag.split("/"))


def option(default: Any, flag: str, text: str, *, shown: bool = False, minimum: Optional[float] = None) -> Any:
    """A dataclass field with `default` that is the command-line option `flag` with help `text`."""
    return field(default=default, metadata={"cli": Option(flag, text, shown, minimum)})
