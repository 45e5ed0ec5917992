"""A protocol's test bed: the initial model its runs must start from (`--protocol FILE` of `rlvrlab train`,
`rlvrlab sweep` and `rlvrlab eval pass-at-k`), fixed by a ```testbed block holding `initial_model_sha256: <64 hex
digits>` (rlvrlab.tracking.identity.state_digest of the initial weights; `rlvrlab model digest EXPERIMENT` prints
it). A run whose initial model has another digest stops before it trains or evaluates, unless
`--allow-initial-model-change`, which it records (INITIAL_MODEL_OVERRIDE, INITIAL_MODEL_EXPECTED); docs/
reproducibility.md, "Fixing a protocol's test bed"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.tracking import tags as T

FENCE = re.compile(r"^\s*```testbed\s*$")
KEY = "initial_model_sha256"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
ALLOW_FLAG = "--allow-initial-model-change"


@dataclass(frozen=True)
class Testbed:
    """A protocol's fixed initial model (sha256 None: the protocol fixes none) and whether a run may differ."""

    __test__ = False  # not a pytest test class, whatever its name

    protocol: Path
    sha256: Optional[str]
    allow_change: bool = False

    def options(self) -> list[str]:
        """The `rlvrlab train` options that pass this check on to a child run (a sweep's process launcher)."""
        return ["--protocol", str(self.protocol), *([ALLOW_FLAG] if self.allow_change else [])]

    def check(self, digest: str, what: str = "the initial model") -> dict[str, str]:
        """The tags recording an allowed change ({} when `digest` is the protocol's, or it fixes none); a one-line
        RlvrlabError when it differs and no change is allowed. what: the weights compared (for the message)."""
        if self.sha256 is None or digest == self.sha256:
            return {}
        if self.allow_change:
            return {T.INITIAL_MODEL_OVERRIDE: "true", T.INITIAL_MODEL_EXPECTED: self.sha256}
        raise RlvrlabError(f"{what} has digest {digest[:12]}, but protocol {self.protocol} fixes its test bed at "
                           f"{self.sha256[:12]}; start from the protocol's model (rlvrlab model digest shows a "
                           f"config's), or pass {ALLOW_FLAG} to run anyway (recorded on the run)")


def load(path: Path, *, allow_change: bool = False) -> Testbed:
    """The protocol file's testbed block; a protocol without one fixes no digest. One-line RlvrlabError for a
    missing file, an unclosed or second block, or a block that is not `initial_model_sha256: <64 hex>`."""
    path = Path(path)
    where = f"--protocol {path}"
    try:
        text = path.read_text()
    except OSError as error:
        raise RlvrlabError(f"{where} cannot be read ({error.strerror or error}); give the study's protocol file, "
                           "e.g. results/protocols/NAME.md") from None
    blocks: list[list[str]] = []
    current: Optional[list[str]] = None
    for line in text.splitlines():
        if current is None and FENCE.match(line):
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        raise RlvrlabError(f"{where}: its ```testbed block is not closed; end it with a line ```")
    if len(blocks) > 1:
        raise RlvrlabError(f"{where} has {len(blocks)} ```testbed blocks; keep one (one initial model per protocol)")
    if not blocks:
        return Testbed(path, None, allow_change)
    example = f"write it as `{KEY}: <64 hex digits>` (rlvrlab model digest prints a config's)"
    # read by hand, not as YAML: YAML would turn a digest of digits and one "e" into a float
    lines = [line.split("#", 1)[0].strip() for line in blocks[0]]
    entries = [line.partition(":") for line in lines if line]
    if len(entries) != 1 or entries[0][0].strip() != KEY or not entries[0][1]:
        raise RlvrlabError(f"{where}: its ```testbed block must hold {KEY} alone; {example}")
    value = entries[0][2].strip()
    digest = value.strip("'\"").lower()
    if not HEX64.match(digest):
        raise RlvrlabError(f"{where}: {KEY} {value[:70]!r} is not 64 hex digits; {example}")
    return Testbed(path, digest, allow_change)


def optional(path: Optional[Path], allow_change: bool) -> Optional[Testbed]:
    """load() of a command's --protocol, or None without one (then --allow-initial-model-change changes nothing)."""
    return load(path, allow_change=allow_change) if path is not None else None
