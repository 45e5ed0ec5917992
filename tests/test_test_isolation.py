"""The suite's own isolation (tests/conftest.py): a launcher variable that one test's in-process DeepSpeed run set
does not reach a later module's fixtures, whose subprocesses would otherwise bind that run's port (EADDRINUSE: the
three errors of tests/services/test_long_row_memory.py in CI, whose module fixture starts before any function
fixture of its module runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SETS = "import os\n\n\ndef test_sets():\n    os.environ['MASTER_PORT'] = '29999'\n"
SEES = """import os

import pytest


@pytest.fixture(scope="module")
def launch_env():
    return {k: v for k, v in os.environ.items() if k == "MASTER_PORT"}


def test_sees_none(launch_env):
    assert launch_env == {}
"""


def test_a_launch_variable_set_by_one_test_does_not_reach_the_next_modules_fixtures(tmp_path: Path) -> None:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_a_sets.py").write_text(SETS)
    (tmp_path / "test_b_sees.py").write_text(SEES)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k != "MASTER_PORT"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-2000:]
