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
