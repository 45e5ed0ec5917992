"""Process-group plumbing for one process or many (torchrun / the deepspeed launcher set the env).

The order for several ranks, as TRL's colocate mode and verl do it: this rank's device from LOCAL_RANK, then the
full process group, then the engines (vLLM joins the group through its external launcher, DeepSpeed finds it),
then a barrier before the first step (setup_distributed, barrier). Without it every rank's vLLM lands on cuda:0
and vLLM's one-process executor creates a group of world size 1 that DeepSpeed then joins.
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import hashlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlvrlab.config.schema import TrainerConfig
from rlvrlab.errors import RlvrlabError

# trainer.dist_timeout_minutes' default, for a group created without a config (one process: no collective waits)
DEFAULT_TIMEOUT = timedelta(minutes=TrainerConfig.dist_timeout_minutes)
_timeout: timedelta | None = None  # the timeout of the process group rlvrlab created (None: none created)


def world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) for a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@dataclass(frozen=True)
class Placement:
    """Where this process runs: its rank, its local rank on the node, the world size and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def setup_distributed(timeout: timedelta = DEFAULT_TIMEOUT, device: str = "auto",
                      rollout_engine: str = "hf") -> Placement:
    """Before any engine: this rank's device (cuda:LOCAL_RANK) made current, and with several ranks the full
    process group initialised, so that the engines built next all see the launch's world. timeout: how long a
    collective waits for the other ranks (trainer.dist_timeout_minutes), for this group and every one created
    after it. device: trainer.device, rollout_engine: rollout.engine (rlvrlab.update.device.choose: a run that
    asked for a GPU, or samples with vLLM's CUDA build, and has none stops here in one line; cpu keeps the ranks,
    DeepSpeed's accelerator and the rollout engine on the CPU even where a GPU is visible)."""
    from rlvrlab.update.device import choose, gather

    rank, world_size = world()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if choose(device, gather(rollout_engine), local_rank) == "cuda":
        torch.cuda.set_device(local_rank)
        here = torch.device("cuda", local_rank)
    else:
        os.environ["DS_ACCELERATOR"] = "cpu"  # DeepSpeed's accelerator follows the placement, also beside a GPU
        here = torch.device("cpu")
    if world_size > 1:
        init_process_group(timeout)
        if dist.get_world_size() != world_size:  # e.g. an engine initialised a group of its own first
            raise RuntimeError(f"the process group has world size {dist.get_world_size()}, the launch "
                               f"{world_size}: something initialised torch.distributed before rlvrlab")
    return Placement(rank, local_rank, world_size, here)


def barrier(what: str = "a barrier") -> None:
    """Wait for every rank (no-op for one process): the first step starts when all engines are built."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        with waiting(what):
            dist.barrier()


def all_gather_objects(value: Any, what: str = "a gather") -> list[Any]:
    """Every rank's picklable `value`, in rank order, on every rank ([value] for one process)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    with waiting(what):
        dist.all_gather_object(out, value)
    return out


@contextmanager
def waiting(what: str) -> Iterator[None]:
    """A collective of rlvrlab's own that timed out on gloo (a RuntimeError "Timed out waiting <ms>ms") raised as one
    line naming the knob. NCCL does not raise here: its watchdog ends the process ("Watchdog caught collective
    operation timeout", with the Timeout(ms) it waited)."""
    try:
        yield
    except RuntimeError as error:
        if "Timed out" not in str(error):
            raise
        limit = f"{_timeout.total_seconds() / 60:g} min, " if _timeout is not None else ""
        raise RlvrlabError(f"rank {dist.get_rank()} waited for the other ranks at {what} longer than the collective "
                           f"timeout ({limit}trainer.dist_timeout_minutes): another rank is stuck or has failed (see "
                           "its output), or its work there takes longer (raise trainer.dist_timeout_minutes)"
                           ) from error


PORT_TRIES = 5  # one process's group: ports tried when the one found free is taken before the store binds it


def init_process_group(timeout: timedelta = DEFAULT_TIMEOUT) -> None:
    """DeepSpeed needs a process group even for one process; set the env a launcher would have set. timeout: how
    long a collective waits for the other ranks (DeepSpeed's default is 10 minutes), given to the group and, as the
    default of torch.distributed.new_group, to the groups DeepSpeed and vLLM create after it (their data-parallel
    and model-parallel groups, which take no timeout argument).

    An in-process vLLM engine may have created the (one-process) group already; DeepSpeed joins it, but still
    reads LOCAL_RANK from the environment.
    """
    own_port = "RANK" not in os.environ and "MASTER_PORT" not in os.environ
    if "RANK" not in os.environ:
        for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1").items():
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    quiet_deepspeed()
    cpu = os.environ.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available()
    if cpu:  # before DeepSpeed's first init_distributed, also the one it makes itself in a group vLLM created
        build_cpu_comm_op()
    if dist.is_initialized():
        return
    global _timeout
    import deepspeed

    _new_groups_wait(timeout)
    backend = "gloo" if cpu else "nccl"
    # NCCL binds to the device set_device made current
    for attempt in range(PORT_TRIES):
        try:
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
            break
        except dist.DistNetworkError as error:
            # the port _free_port found was free, then taken before the store bound it (any process's outgoing
            # connection may take a free port; seen in CI beside other tests): a port of our own choice is chosen
            # again, one a launcher gave is not
            if not own_port or "EADDRINUSE" not in str(error) or attempt == PORT_TRIES - 1:
                raise
            os.environ["MASTER_PORT"] = str(_free_port())
    _timeout = timeout
    atexit.register(_destroy_process_group)


def extensions_root() -> Path:
    """rlvrlab's folder for torch's JIT-built extensions in this environment: one per (sys.prefix, torch, DeepSpeed),
    so that two environments do not rebuild each other's op (each build names its own sources' paths)."""
    import deepspeed

    tag = hashlib.sha256(f"{sys.prefix}|{torch.__version__}|{deepspeed.__version__}".encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rlvrlab" / "torch_extensions" / tag


def build_cpu_comm_op() -> None:
    """DeepSpeed's CPU accelerator JIT-builds its shared-memory op (deepspeed_shm_comm) in init_distributed, under
    torch's lock file (torch.utils.file_baton), which a process killed during the build leaves behind: every later
    start then waits on that file forever, printing nothing (seen here after a run stopped in its first build).
    Unless TORCH_EXTENSIONS_DIR names a folder of the user's own, rlvrlab builds the op first, in extensions_root(),
    under an OS lock that is released when its holder dies: a torch lock file found while holding it was left by a
    dead build and is removed. Ranks take the OS lock in turn; the first builds, the others load."""
    root = extensions_root()
    if os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(root)) != str(root):
        return  # the user's folder: torch's own locking
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not builder.is_compatible(verbose=False):
        return  # DeepSpeed builds nothing either
    folder = root / builder.name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "rlvrlab.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when this block ends or this process dies
        (folder / "lock").unlink(missing_ok=True)
        builder.load(verbose=False)


def _new_groups_wait(timeout: timedelta) -> None:
    """torch.distributed.new_group(timeout=None) takes torch's default (30 minutes for gloo, 10 for NCCL), read at
    each call from distributed_c10d's module globals: DeepSpeed (deepspeed.comm.new_group) and vLLM create their
    groups that way. Set for this process, so that every group of the run waits as long as the world group."""
    from torch.distributed import distributed_c10d as c10d

    c10d.default_pg_timeout = timeout
    if getattr(c10d, "default_pg_nccl_timeout", None) is not None:  # None in a build without NCCL
        c10d.default_pg_nccl_timeout = timeout


def _destroy_process_group() -> None:
    """At exit, while the interpreter is still whole: the process groups destroyed and no gloo worker left holding
    a collective's tensors. A gloo worker thread can hold the last reference to a finished collective's tensors a
    moment after the caller's wait returned; releasing them takes the GIL, which a finalizing interpreter refuses,
    and the process aborts after its run has finished ("terminate called without an active exception", SIGABRT;
    pytorch/pytorch#190489; seen in CI on a 2-rank DeepSpeed ZeRO-2 check that exits right after an all_gather).
    A group's destructor joins its workers, but DeepSpeed's engines keep their groups alive (through autograd hooks
    the collector cannot see), so the workers outlive the groups: DeepSpeed's destroy_process_group releases what
    DeepSpeed's own module holds, a collection frees what is free, and then the exit waits, GIL released, until
    no gloo worker is runnable (tests/services/test_distributed.py repeats the exit)."""
    if not dist.is_initialized():
        return
    import deepspeed.comm

    deepspeed.comm.destroy_process_group()
    gc.collect()
    _until_gloo_workers_idle()


def _until_gloo_workers_idle(timeout: float = 2.0) -> None:
    """Sleep (the GIL released) until this process's gloo worker threads ("pt_gloo_runloop") are all asleep on
    two polls in a row, 1 ms apart, or `timeout` seconds passed: a worker that still has a work item to release is
    runnable, or waits for the GIL, which the sleep hands it. Without /proc (not Linux), 50 ms."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        time.sleep(0.05)
        return
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
        quiet = quiet + 1 if not any(_runnable_gloo_worker(task) for task in tasks.iterdir()) else 0


def _runnable_gloo_worker(task: Path) -> bool:
    try:
        if not (task / "comm").read_text().startswith("pt_gloo"):
            return False
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"  # field 3, after "(comm)"
    except (OSError, IndexError):  # the thread ended between the listing and the read
        return False


def quiet_deepspeed() -> None:
    """Name the accelerator on CPU-only machines (else DeepSpeed warns it could not find a GPU) and keep its
    INFO lines out of the progress bar."""
    import logging

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def _reduced(values: torch.Tensor, op: dist.ReduceOp.RedOpType, what: str) -> torch.Tensor:
    """all_reduce of a copy, on the device the group's backend takes: NCCL (the GPU launch) reduces CUDA tensors
    only, and the loop's counts are small CPU tensors."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else values.device
    reduced = values.to(device, copy=True)
    with waiting(what):
        dist.all_reduce(reduced, op=op)
    return reduced.to(values.device)


def all_max(value: int, what: str = "an all-reduce") -> int:
    """The largest of an integer over ranks (itself for one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        return int(_reduced(torch.tensor([value], dtype=torch.long), dist.ReduceOp.MAX, what).item())
    return value


def all_sum(values: torch.Tensor, what: str = "an all-reduce") -> torch.Tensor:
    """Sum a tensor over ranks (identity for one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        return _reduced(values, dist.ReduceOp.SUM, what)
    return values


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
