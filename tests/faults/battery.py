"""What every module of the fault battery asserts with (issue 44): the CLI in a subprocess, its one-line error, and
a snapshot of every file under a folder to compare before and after."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

TIMEOUT = 600  # against hangs of the subprocess only; nothing is timed by it


def rlvrlab(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI in a subprocess. A str argument holding surrogateescape'd characters reaches it as raw bytes
    (subprocess encodes arguments with os.fsencode); output that is not UTF-8 is read with backslash escapes."""
    return subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", *args], capture_output=True, text=True,
                          errors="backslashreplace", cwd=cwd, timeout=TIMEOUT,
                          env={**os.environ, "RLVRLAB_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "300",
                               **(env or {})})


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit status 1, no traceback, exactly one `error: ` line on stderr holding every fragment; returns it."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file, folder and link under `folder`: a file's sha256, "dir", or a link's target. Lock files are left
    out: a sweep takes its journal's start lock (`optuna.journal.start.lock`, empty by design) before it reads."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.name.endswith(".lock"):
            continue
        key = str(path.relative_to(folder))
        if path.is_symlink():
            found[key] = "link " + os.readlink(path)
        else:
            found[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found
