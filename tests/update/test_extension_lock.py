"""DeepSpeed's CPU op build and torch's lock file (rlvrlab.update.dist.build_cpu_comm_op): a lock left by a build
that was killed no longer makes every later start wait forever; a TORCH_EXTENSIONS_DIR of the user's own is left to
torch's locking."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STALE = """
from rlvrlab.update import dist
folder = dist.extensions_root() / "deepspeed_shm_comm"
folder.mkdir(parents=True)
(folder / "lock").touch()  # what a build killed half way leaves
dist.init_process_group()
print("started", flush=True)
"""


@pytest.mark.slow
def test_a_start_after_a_killed_build_removes_its_lock_and_builds(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "TORCH_EXTENSIONS_DIR", "RANK",
                                                                      "WORLD_SIZE", "MASTER_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    # torch's FileBaton alone waits on that lock for ever: the bound turns such a hang into a failure
    proc = subprocess.run([sys.executable, "-c", STALE], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr[-3000:]
    (root,) = (tmp_path / "rlvrlab" / "torch_extensions").iterdir()
    folder = root / "deepspeed_shm_comm"
    assert not (folder / "lock").exists() and list(folder.glob("deepspeed_shm_comm*.so"))


def test_a_users_extensions_folder_is_left_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvrlab.update import dist

    lock = tmp_path / "mine" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # perhaps another program's build in progress: not rlvrlab's to remove
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dist.build_cpu_comm_op()
    assert lock.exists() and not (tmp_path / "cache").exists()
