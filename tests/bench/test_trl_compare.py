"""bench/trl_compare.py's pure parts: each side's rlvrlab overrides compose into the run it names, both LoRA sides
train the same adapter (rlvrlab's model.lora and peft's LoraConfig), TRL's vLLM settings are GRPOConfig fields, and
every rlvrlab side is compared with the TRL sides that train the same thing. The timings themselves are the
benchmark's (bench/README.md), not a test's."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "trl_compare.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("trl_compare", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_each_rlvrlab_side_composes_into_the_run_it_names(bench) -> None:
    from rlvrlab.config import compose

    for name, side in bench.SIDES.items():
        if side.tool != "rlvrlab":
            continue
        cfg = compose(None, bench.overrides(side.update, 3, "unused", tuple(bench.side_overrides(side))))
        assert cfg.trainer.engine == side.update and cfg.algorithm.kl_coef == 0, name
        assert cfg.rollout.engine == side.rollout, name
        assert (cfg.model.lora.r > 0) == side.lora, name
        if side.lora:
            assert cfg.model.lora.r == bench.LORA["r"] and cfg.model.lora.alpha == bench.LORA["alpha"]
            assert cfg.model.lora.dropout == bench.LORA["dropout"]
            assert list(cfg.model.lora.target_modules) == list(bench.LORA["target_modules"])
    assert bench.side_overrides(bench.SIDES["rlvrlab-deepspeed-rows"]) == ["trainer.pack_by_length=false"]


def test_the_trl_lora_sides_train_rlvrlab_s_adapter(bench) -> None:
    pytest.importorskip("peft")
    from rlvrlab.config import compose

    lora = compose(None, bench.side_overrides(bench.SIDES["rlvrlab-lora"])).model.lora
    config = bench.peft_config(bench.SIDES["trl-lora"])
    assert (config.r, config.lora_alpha, config.lora_dropout) == (lora.r, lora.alpha, lora.dropout)
    assert config.target_modules == set(lora.target_modules)
    assert bench.peft_config(bench.SIDES["trl"]) is None


def test_trl_s_vllm_settings_are_grpo_config_fields(bench) -> None:
    trl = pytest.importorskip("trl")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    settings = bench.trl_vllm_args(bench.SIDES["trl-vllm-lora"])
    assert settings["use_vllm"] and settings["vllm_mode"] == "colocate" and set(settings) <= fields
    assert bench.trl_vllm_args(bench.SIDES["trl-lora"]) == {}


def test_sides_are_paired_with_the_trl_sides_that_train_the_same_thing(bench) -> None:
    sides = ["rlvrlab-vllm", "trl-vllm", "trl", "rlvrlab-vllm-lora", "trl-vllm-lora"]
    assert bench.references(sides) == {"rlvrlab-vllm": ["trl-vllm", "trl"], "rlvrlab-vllm-lora": ["trl-vllm-lora"]}
    assert bench.round_order(sides, 0) == sides and bench.round_order(sides, 1) == sides[::-1]
    assert bench.parse_sides("rlvrlab-lora, trl-lora") == ["rlvrlab-lora", "trl-lora"]
    for bad in ("rlvrlab-vllm,trl-vllm-lora", "rlvrlab-vllm,rlvrlab-vllm,trl", "rlvrlab-vllm,trl-fast"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_sides(bad)


def test_the_vllm_sides_run_in_the_vllm_environment(bench) -> None:
    assert bench.python_for(bench.SIDES["trl-vllm"]) == str(bench.VLLM_PYTHON)
    assert bench.python_for(bench.SIDES["rlvrlab-vllm-lora"]) == str(bench.VLLM_PYTHON)
    assert bench.python_for(bench.SIDES["rlvrlab-lora"]) == sys.executable
