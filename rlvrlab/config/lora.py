"""The cross-field rules of model.lora (LoRA adapters through peft), called with rlvrlab.config.rules' own rules:
which tiers and settings adapters work with, refused in one line before any model is loaded. The ranges of its
numbers are rows of rlvrlab.config.ranges.RANGES.
"""

from __future__ import annotations

from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import ConfigError


def check_lora(cfg: RunConfig) -> None:
    """Raise ConfigError when model.lora asks for what the run cannot do; r = 0 (off) passes whatever the rest."""
    lora = cfg.model.lora
    if lora.r == 0:
        return
    if cfg.model.tier == "toy":
        raise ConfigError("model.lora.r > 0 needs linear layers to adapt, and the toy tier is one table; set "
                          "model.tier=tiny or real, or model.lora.r=0")
    if not lora.target_modules or not all(isinstance(name, str) and name for name in lora.target_modules):
        raise ConfigError(f"model.lora.target_modules={list(lora.target_modules)} must name at least one module; "
                          "e.g. model.lora.target_modules=[all-linear] or [q_proj,v_proj]")
    if lora.dropout > 0:
        # the trainer's forwards run in eval mode (behaviour and update log-probs of one set of weights agree), so
        # peft's dropout on the adapter input would never act: refused rather than silently ignored
        raise ConfigError(f"model.lora.dropout={lora.dropout} would never act: rlvrlab computes every log-prob in "
                          "eval mode (no dropout); set model.lora.dropout=0")
