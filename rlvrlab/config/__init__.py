"""Typed run configuration: the schema, its composition from experiments/ YAML, and its validation."""

from rlvrlab.config.compose import (
    FileCheck,
    check_files,
    compose,
    config_hash,
    experiments_dir,
    legacy_overrides,
    to_yaml,
    warm_start_seed,
)
from rlvrlab.config.schema import RunConfig

__all__ = ["FileCheck", "RunConfig", "check_files", "compose", "config_hash", "experiments_dir", "legacy_overrides",
           "to_yaml", "warm_start_seed"]
