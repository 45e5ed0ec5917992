"""What a run is, beyond its config: the weights it starts from and the software and hardware it runs on.

`state_digest` names a set of weights: the SHA-256 of a torch state dict, canonical (tensors in sorted key order,
each as its key, dtype, shape and its elements' bytes in C order on the CPU), so the same numbers give the same
digest whatever device the tensors are on, whether they are views or copies, and in whatever order the dict holds
them; one element changed, a dtype or a shape changes it. `environment` is what can change the numbers a run
computes from those weights (library versions, CPU kernels, threads, GPU and driver, deterministic settings),
recorded as tags on every run (rlvrlab.tracking.tags.ENV_PREFIX).

Heavy imports (torch) happen inside the functions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlvrlab.errors import RlvrlabError
from rlvrlab.tracking import tags as T


def state_digest(state_dict: Mapping[str, Any]) -> str:
    """The hex SHA-256 of a torch state dict (a module's state_dict(), or safetensors' load_file()).

    Per key, in sorted order: a JSON header [key, dtype, shape, byte count] and a newline, then the tensor's
    elements as bytes: detached, copied to the CPU, contiguous (C order) and reinterpreted as uint8
    (torch.Tensor.view(torch.uint8), public API; bf16 and bool included), in the machine's byte order (little-endian
    on every CPU torch ships for). So the digest does not depend on the device, on strides or on the dict's order.
    Two keys holding one tensor (tied embeddings) are both hashed, as state_dict() lists both. A value that is not
    a tensor (a module's extra state) contributes its repr."""
    import torch

    digest = hashlib.sha256()
    for key in sorted(state_dict):
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            digest.update(json.dumps([key, "object", repr(value)]).encode() + b"\n")
            continue
        flat = value.detach().to("cpu").contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy()  # hashed in place: no second copy of a large tensor
        header = [key, str(value.dtype).removeprefix("torch."), list(value.shape), int(data.nbytes)]
        digest.update(json.dumps(header).encode() + b"\n")
        digest.update(data.data)
    return digest.hexdigest()


def module_digest(module: Any) -> str:
    """state_digest of a torch module's state_dict()."""
    return state_digest(module.state_dict())


@dataclass(frozen=True)
class InitialModel:
    """The weights a run starts from (training: after any warm start or import; evaluation: the weights it
    evaluates): their state_digest and where they came from (rlvrlab.tracking.tags.INITIAL_MODEL_SOURCE)."""

    sha256: str
    source: str

    def tags(self) -> dict[str, str]:
        return {T.INITIAL_MODEL: self.sha256, T.INITIAL_MODEL_SOURCE: self.source}


def environment() -> dict[str, str]:
    """What can change the numbers of a run on the same code, config and weights, as short stable keys:
    python, torch, transformers, numpy (versions); machine (platform.machine()); device ("cpu" or the CUDA device's
    name); cpu_capability (torch.backends.cpu.get_cpu_capability(): the SIMD kernels torch dispatches to, e.g.
    AVX2, AVX512); threads (torch.get_num_threads() now); cuda (torch.version.cuda) and driver (nvidia-smi) when a
    CUDA device is in use; deterministic (torch.are_deterministic_algorithms_enabled() and cuDNN's deterministic and
    benchmark flags). Read when called: the thread count is the one in force (the toy tier trains on one)."""
    import numpy
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": _version("transformers"),
           "numpy": numpy.__version__, "machine": platform.machine() or "unknown",
           "cpu_capability": str(torch.backends.cpu.get_cpu_capability()), "threads": str(torch.get_num_threads())}
    cuda = torch.cuda.is_available()
    env["device"] = torch.cuda.get_device_name(torch.cuda.current_device()) if cuda else "cpu"
    if cuda and torch.version.cuda:
        env["cuda"] = str(torch.version.cuda)
        driver = _driver()
        if driver:
            env["driver"] = driver
    cudnn = torch.backends.cudnn
    env["deterministic"] = (f"algorithms={str(torch.are_deterministic_algorithms_enabled()).lower()},"
                            f"cudnn_deterministic={str(bool(cudnn.deterministic)).lower()},"
                            f"cudnn_benchmark={str(bool(cudnn.benchmark)).lower()}")
    return env


def environment_tags() -> dict[str, str]:
    """environment() as MLflow tags: rlvrlab.env.<key>."""
    return {T.ENV_PREFIX + key: value for key, value in environment().items()}


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=1)
def _driver() -> str:
    """The NVIDIA driver version (nvidia-smi, first GPU); "" when nvidia-smi is absent or fails (torch has no public
    API for it). Once per process."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0].strip() if out.strip() else ""


def wanted_digest(expect: str | None) -> str | None:
    """`rlvrlab model digest --expect` as lowercase hex (its first 12 to 64 digits), or a one-line error."""
    if expect is None:
        return None
    wanted = expect.strip().lower()
    if not (12 <= len(wanted) <= 64 and all(c in "0123456789abcdef" for c in wanted)):
        raise RlvrlabError(f"--expect {expect!r}: give the digest as hex, its first 12 to 64 digits")
    return wanted


def check_digest(sha256: str, wanted: str | None) -> None:
    """A one-line error when an initial model's digest is not the expected one (None: nothing expected)."""
    if wanted is not None and not sha256.startswith(wanted):
        raise RlvrlabError(f"the initial model has digest {sha256[:12]}, not the expected {wanted[:12]}; the config, "
                           "the code or the environment (library versions, CPU) differs from the one that built it")
