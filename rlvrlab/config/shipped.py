"""Where the shipped YAML folders (`experiments/`, `sweeps/`) are found, whether rlvrlab runs from a checkout
(editable install) or from an installed wheel, which carries them as data files under
`<prefix>/share/rlvrlab/`. An environment variable overrides each."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from rlvrlab.errors import ConfigError

_CHECKOUT = Path(__file__).resolve().parents[2]  # the repository root, when rlvrlab runs from a checkout


def search_path(name: str) -> list[Path]:
    """Where folder `name` is looked for, in order: the checkout, then the installed data files."""
    prefixes = dict.fromkeys([sysconfig.get_path("data"), sys.prefix, sys.base_prefix])
    return [_CHECKOUT / name, *(Path(p) / "share" / "rlvrlab" / name for p in prefixes if p)]


def shipped_dir(name: str, env: str) -> Path:
    """$`env` when set, else the first existing folder of `search_path(name)`; a one-line error otherwise."""
    if os.environ.get(env):
        folder = Path(os.environ[env]).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"{env}={folder} is not a folder; set {env} to the folder of your {name} files, "
                              "or unset it")
        return folder
    candidates = search_path(name)
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise ConfigError(f"no {name}/ folder found (searched {', '.join(map(str, candidates))}); set {env} to the "
                      f"folder of your {name} files")
