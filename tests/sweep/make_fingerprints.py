"""Writes tests/sweep/fingerprints.json: the fingerprint of every sweep in sweeps/ and in
tests/sweep/fingerprint_sweeps/, as the code computes it now. Studies in storage carry these values, so they were
computed once, with the code before fingerprints were built from rlvrlab/sweep/fingerprint.py (issue 47, item 5),
and test_fingerprint.py asserts that the code still gives them. Rerun only to add a new sweep file; a changed value
is a study that no longer resumes.
Run: .venv/bin/python tests/sweep/make_fingerprints.py"""

from __future__ import annotations

import json
from pathlib import Path

from rlvrlab.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (ROOT / "sweeps", ROOT / "tests" / "sweep" / "fingerprint_sweeps")
STORED = Path(__file__).with_name("fingerprints.json")


def sweep_files() -> list[Path]:
    """Every sweep file whose fingerprint is kept, in a stable order."""
    return sorted(path for folder in FOLDERS for path in folder.rglob("*.yaml"))


def fingerprints() -> dict[str, str]:
    """Each sweep file (relative to the checkout) -> its fingerprint now."""
    return {path.relative_to(ROOT).as_posix(): load_sweep(str(path)).fingerprint() for path in sweep_files()}


if __name__ == "__main__":
    STORED.write_text(json.dumps(fingerprints(), indent=1) + "\n")
    print(f"wrote {STORED}")
