"""Process-group plumbing for one process or many (torchrun / the deepspeed launcher set the env)."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) for a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def init_process_group() -> None:
    """DeepSpeed needs a process group even for one process; set the env a launcher would have set.

    An in-process vLLM engine may have created the (one-process) group already; DeepSpeed joins it, but still
    reads LOCAL_RANK from the environment.
    """
    if "RANK" not in os.environ:
        for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1").items():
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    quiet_deepspeed()
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)


def quiet_deepspeed() -> None:
    """Name the accelerator on CPU-only machines (else DeepSpeed warns it could not find a GPU) and keep its
    INFO lines out of the progress bar."""
    import logging

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (identity for one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
