"""What a study's fingerprint hashes: an explicit, versioned description of what changes a sweep's results, so that
a new field of a sweep's dataclasses never silently refuses the studies in storage (rlvrlab.sweep.study compares
the fingerprint stored on a study with the sweep's; rlvrlab.sweep.mismatch says what differs).

- Each part of a sweep (the spec, its objective, a space key, the pruner, adaptive seeds) is a `Part` in PARTS that
  names every field of its dataclass once: `fields` are written always (those of version 1, as the studies in
  storage hashed them), `added` only when they differ from the field's default (so a new optional field, at its
  default, leaves every fingerprint as it was), and `ignored` with why they do not change results (how seeds run,
  not what they train). tests/sweep/test_fingerprint.py checks that every field is named, and that every sweep in
  sweeps/ keeps the fingerprint it had before this module (tests/sweep/fingerprints.json).
- FINGERPRINT_VERSION is written only once it is not 1: a change to how a part is written (not an added field)
  raises it, which starts every study afresh.
- The document is hashed as json (sorted keys; str() for a value json has no form for), sha256, 12 hex digits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from rlvrlab.sweep.space import NOT_SCIENCE

FINGERPRINT_VERSION = 1
VERSION_KEY = "fingerprint_version"  # written when FINGERPRINT_VERSION is not 1


def _science(overrides: Any) -> list[str]:
    """Overrides that change results: not those that only move records (output_dir=, tracking.*)."""
    return [o for o in overrides if not o.startswith(NOT_SCIENCE)]


@dataclasses.dataclass(frozen=True)
class Part:
    """One dataclass of a sweep as the fingerprint writes it. key: a field's name in the document, where it is not
    the field's; write: how a field's value is written (as is, where absent)."""

    name: str  # the dataclass's name
    fields: tuple[str, ...]  # written always (version 1)
    added: tuple[str, ...] = ()  # written only when not the field's default
    ignored: Mapping[str, str] = dataclasses.field(default_factory=dict)  # field -> why it does not change results
    key: Mapping[str, str] = dataclasses.field(default_factory=dict)
    write: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)

    def document(self, value: Any) -> dict[str, Any]:
        """The fields of `value` (an instance of this part's dataclass) that change results."""
        defaults = _defaults(value)
        named = [*self.fields, *(f for f in self.added if getattr(value, f) != defaults.get(f, dataclasses.MISSING))]
        return {self.key.get(f, f): self.write.get(f, _as_is)(getattr(value, f)) for f in named}


def _as_is(value: Any) -> Any:
    return value


def _defaults(value: Any) -> dict[str, Any]:
    """Each field of a dataclass instance that has a default -> that default."""
    found = {}
    for field in dataclasses.fields(value):
        if field.default is not dataclasses.MISSING:
            found[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            found[field.name] = field.default_factory()
    return found


OBJECTIVE = Part("Objective", ("metric", "direction", "window", "aggregate"))
PARAM = Part("Param", ("key", "values", "low", "high", "log", "step"))
PRUNER = Part("Pruner", ("type", "warmup_steps", "startup_trials"), added=("delta", "n_min"))
ADAPTIVE = Part("AdaptiveSeeds", ("initial", "max", "halfwidth", "rule"))
SPEC = Part(
    "SweepSpec",
    fields=("experiment", "sampler", "overrides", "sampler_seed", "seeds", "objective", "space", "pruner"),
    added=("variants", "adaptive", "command"),
    ignored={"name": "the study's name (--name starts another study)", "file": "where the file is",
             "trials": "more trials continue the same study", "timeout": "more time continues the same study",
             "launcher": "how seed runs run (and their limits), not what they train",
             "testbed": "a check of each seed run's initial model (--protocol)",
             "confirm": "two cells re-run on fresh seeds after the search; the search's runs are the same"},
    key={"adaptive": "adaptive_seeds"},
    write={"overrides": _science, "seeds": list, "objective": OBJECTIVE.document,
           "space": lambda space: [PARAM.document(p) for p in space], "pruner": PRUNER.document,
           "variants": lambda variants: {name: list(o) for name, o in variants.items()},
           "adaptive": ADAPTIVE.document},
)
PARTS = (SPEC, OBJECTIVE, PARAM, PRUNER, ADAPTIVE)


def document(spec: Any) -> dict[str, Any]:
    """What the fingerprint of a sweep (a rlvrlab.sweep.spec.SweepSpec) hashes."""
    found = SPEC.document(spec)
    return found if FINGERPRINT_VERSION == 1 else {**found, VERSION_KEY: FINGERPRINT_VERSION}


def fingerprint(spec: Any) -> str:
    """12 hex digits of sha256 over `document(spec)`: what makes two invocations the same study."""
    return hashlib.sha256(json.dumps(document(spec), sort_keys=True, default=str).encode()).hexdigest()[:12]
