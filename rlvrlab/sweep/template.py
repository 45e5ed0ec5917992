"""A command sweep's template: `command:` of a sweep file, a shell command with `{name}` placeholders that each seed
run fills with its trial's values and its seed (rlvrlab.sweep.command runs it).

- A placeholder is `{name}` with name a letter or _ then letters, digits, _ or dots; `${VAR}` is the shell's and is
  left alone, as is any other brace (`{a,b}`, `awk '{print $1}'`, `find -exec {} ;`). `{{name}}` is the text
  `{name}` (a Python f-string in `python -c '...'`).
- Every substituted value is shell-quoted (shlex.quote): a value is one word of the command whatever it holds
  (spaces, quotes, `;`), never shell syntax.
- The configuration hash of a seed run is over the template and the trial's values, not its seed, so the seeds
  of one configuration share it, as rlvrlab's own seed runs share config_hash (rlvrlab.config.config_hash).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Optional

# group 1: an escaped {{name}}; group 2: a placeholder's name
PLACEHOLDER = re.compile(r"(?<!\$)\{\{([A-Za-z_][A-Za-z0-9_.]*)\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_.]*)\}")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
SEED = "seed"
STUDY = "study"
NOT_HASHED = (SEED, STUDY)  # a seed run's seed, and the study's name: not what the configuration is


def placeholders(template: str) -> list[str]:
    """The names of the template's placeholders, in order of first use."""
    return list(dict.fromkeys(name for escaped, name in PLACEHOLDER.findall(template) if not escaped))


def render(template: str, values: Mapping[str, str]) -> str:
    """The template with each placeholder replaced by its value, shell-quoted. KeyError: a placeholder without one."""
    return PLACEHOLDER.sub(lambda match: "{" + match.group(1) + "}" if match.group(1) else shlex.quote(
        values[match.group(2)]), template)


def command_hash(template: str, values: Mapping[str, str]) -> str:
    """12 hex digits of sha256 over the template and the values (seed and study left out), as config_hash."""
    science = {"command": template, "values": {k: v for k, v in values.items() if k not in NOT_HASHED}}
    return hashlib.sha256(json.dumps(science, sort_keys=True).encode()).hexdigest()[:12]


def variant_values(overrides: tuple[str, ...] | list[str]) -> dict[str, str]:
    """A command sweep's variant: its `name=value` entries as placeholder values."""
    return {key.strip(): value.strip() for key, _, value in (o.partition("=") for o in overrides)}


def check_template(template: str, space_keys: list[str], variants: Mapping[str, tuple[str, ...]], where: str) -> None:
    """Every placeholder has a value at every point, and every searched name reaches the command (one-line
    ConfigErrors, when the sweep file is read)."""
    from rlvrlab.errors import ConfigError
    from rlvrlab.sweep.space import VARIANT

    used = placeholders(template)
    for key in space_keys:
        if not NAME.match(key) or key == STUDY:
            raise ConfigError(f"space key {key!r} in {where}: a command sweep's keys are placeholder names (a letter, "
                              "then letters, digits, _ or dots; not seed or study), e.g. lr for {lr} in the command")
    given = {name: variant_values(overrides) for name, overrides in variants.items()}
    for name, values in given.items():
        for key in values:
            if not NAME.match(key) or key in (SEED, STUDY, VARIANT) or key in space_keys:
                why = "space: searches it too" if key in space_keys else "a placeholder name (a letter, then " \
                    "letters, digits, _ or dots; not seed, study or variant)"
                raise ConfigError(f"variants.{name} in {where} sets {key!r}, which must be {why}; e.g. "
                                  "variants: {grpo: [estimator=grpo]} for {estimator} in the command")
    by_variants = {key for values in given.values() for key in values}
    known = {SEED, STUDY, *space_keys, *by_variants, *([VARIANT] if variants else [])}
    for name in used:
        if name not in known:
            shown = ", ".join("{" + k + "}" for k in sorted(known))
            raise ConfigError(f"command in {where}: unknown placeholder {{{name}}}; this sweep gives {shown} (space: "
                              "keys, variants: name=value entries, seed, study); write a shell variable as ${VAR}")
    if SEED not in used:
        raise ConfigError(f"command in {where} has no {{seed}}: every seed run would run the same command; pass it to "
                          "the command's seed option, e.g. --seed {seed}")
    for key in space_keys:
        if key not in used:
            raise ConfigError(f"space key {key} in {where} is not in the command; add {{{key}}} to it or drop the key")
    for name, values in given.items():
        missing = [key for key in used if key in by_variants and key not in values]
        if missing:
            raise ConfigError(f"variants.{name} in {where} gives no value for {{{missing[0]}}}, which the command "
                              f"uses and other variants set; add {missing[0]}=VALUE to it")


def parse_command(body: dict, overrides: Sequence[str], where: str) -> Optional[str]:
    """`command:` (instead of `experiment:`); its sweep's overrides may only say where the records go."""
    from rlvrlab.errors import ConfigError
    from rlvrlab.sweep.space import NOT_SCIENCE

    command = body.get("command")
    if command is None:
        return None
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"command in {where} must be a shell command, e.g. command: python train.py --lr {{lr}} "
                          "--seed {seed}")
    if body.get("experiment") is not None:
        raise ConfigError(f"{where} gives both experiment and command; a sweep runs one of them: drop one")
    for text in overrides:
        if not text.startswith(NOT_SCIENCE):
            raise ConfigError(f"override {text!r} in {where}: a command sweep's overrides say only where its records "
                              "go (output_dir=, tracking.uri=); put the command's options in the command")
    return command
