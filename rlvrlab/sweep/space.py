"""What a study searches over: the `space:` of a sweep file (config keys with grid values, categorical choices or
numeric ranges) and its named `variants:` (override lists, searched as the key `variant`), checked into Params."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from rlvrlab.errors import ConfigError

VARIANT = "variant"  # the space key of `variants:`
FIXED_KEYS = ("seed", "experiment")  # set by the sweep: seeds from `seeds:`, the MLflow experiment from the name
NOT_SCIENCE = ("output_dir=", "tracking.")  # overrides that move records, not results (not in the fingerprint)


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config key: grid values/choices, or a numeric range."""

    key: str
    values: Optional[tuple] = None  # grid values (grid sampler) or categorical choices (tpe, random)
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None

    @property
    def is_int(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high, self.step)
                   if v is not None)

    def suggest(self, trial: Any) -> Any:
        """The trial's value (Optuna returns the enqueued value for grid points and retries)."""
        if self.values is not None:
            return trial.suggest_categorical(self.key, list(self.values))
        low, high = self.range
        if self.is_int:
            return trial.suggest_int(self.key, int(low), int(high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, low, high, step=self.step, log=self.log)

    @property
    def range(self) -> tuple[float, float]:
        """(low, high) of a ranged key; a listed key has none."""
        if self.low is None or self.high is None:
            raise ValueError(f"space key {self.key} lists values; it has no range")
        return self.low, self.high

    @property
    def listed(self) -> tuple:
        """The values of a listed key (every key of a grid: parse_space refuses ranges there)."""
        if self.values is None:
            raise ValueError(f"space key {self.key} is a range; it lists no values")
        return self.values

    def corners(self) -> list[Any]:
        """Values that validation composes: every listed value, or both ends of a range."""
        return list(self.values) if self.values is not None else list(self.range)


def format_value(value: Any) -> str:
    """A value as an override string that composes back to the same value (inf -> .inf)."""
    if isinstance(value, float) and math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def parse_variants(body: Any, where: str) -> dict[str, tuple[str, ...]]:
    """`variants:`: names mapped to lists of overrides ({} when the file has none)."""
    if body is None:
        return {}
    example = "variants: {grpo: [algorithm=grpo], ucpo tau=1: [algorithm=ucpo, algorithm.tau=1.0]}"
    if not isinstance(body, dict) or not body:
        raise ConfigError(f"variants in {where} must map names to lists of overrides, e.g. {example}")
    out = {}
    for name, overrides in body.items():
        if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
            raise ConfigError(f"variants.{name} in {where} must be a list of key=value overrides, e.g. {example}")
        for text in overrides:
            key = text.partition("=")[0].strip()
            if key in FIXED_KEYS or key.startswith(NOT_SCIENCE) or key == "output_dir":
                raise ConfigError(f"variants.{name} in {where}: {key} cannot be set per variant")
        out[str(name)] = tuple(overrides)
    return out


def parse_space(body: Any, sampler: str, where: str) -> tuple[Param, ...]:
    """`space:`: each key a list of values, {choices: [...]} or {low, high[, log][, step]} (not in a grid)."""
    if body == {}:
        return ()
    if not isinstance(body, dict) or not body:
        raise ConfigError(f"space in {where} must map config keys to values, e.g. space: {{algorithm.tau: [0.1, 0.5]}}")
    params = []
    for key, spec in body.items():
        key = str(key)
        if key in FIXED_KEYS or key.startswith(NOT_SCIENCE) or key == "output_dir":
            hint = "use seeds:" if key == "seed" else "it does not change what is trained"
            raise ConfigError(f"space key {key!r} in {where} cannot be searched; {hint}")
        if isinstance(spec, list):
            if not spec or len(set(map(repr, spec))) != len(spec):
                raise ConfigError(f"space.{key} in {where} must list distinct values")
            if not all(v is None or isinstance(v, (bool, int, float, str)) for v in spec):
                raise ConfigError(f"space.{key} in {where}: values must be numbers, strings, booleans or null")
            params.append(Param(key, values=tuple(spec)))
            continue
        if isinstance(spec, dict) and "choices" in spec:
            choices = spec["choices"]
            if set(spec) != {"choices"} or not isinstance(choices, list) or not choices:
                raise ConfigError(f"space.{key} in {where}: write {{choices: [a, b, ...]}} and nothing else")
            params.append(Param(key, values=tuple(choices)))
            continue
        if not isinstance(spec, dict) or not {"low", "high"} <= set(spec) or not set(spec) <= {"low", "high", "log",
                                                                                             "step"}:
            raise ConfigError(f"space.{key} in {where} must be a list of values, {{choices: [...]}} or "
                              "{low: L, high: H[, log: true][, step: S]}")
        low, high, step = spec["low"], spec["high"], spec.get("step")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) or not low < high:
            raise ConfigError(f"space.{key} in {where}: low and high must be numbers with low < high")
        log = bool(spec.get("log", False))
        if log and (low <= 0 or step is not None):
            raise ConfigError(f"space.{key} in {where}: log ranges need low > 0 and no step")
        if step is not None and (not isinstance(step, (int, float)) or step <= 0):
            raise ConfigError(f"space.{key} in {where}: step must be a positive number")
        params.append(Param(key, low=low, high=high, log=log, step=step))
    if sampler == "grid":
        ranged = [p.key for p in params if p.values is None]
        if ranged:
            raise ConfigError(f"space.{ranged[0]} in {where} is a range; the grid sampler needs a list of values "
                              "(or use sampler: tpe or random)")
    return tuple(params)
