"""rlvrlab.rundir.newest_intact: the one newest-intact-checkpoint lookup, which `rlvrlab train --resume`
(rlvrlab.train.lifecycle.resume_point) and `rlvrlab eval pass-at-k --run` (rlvrlab.eval.pipeline) both use.

Run: .venv/bin/pytest -q -p no:randomly tests/train/test_checkpoint_lookup.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvrlab import rundir
from rlvrlab.errors import RlvrlabError


def _checkpoint(run_folder: Path, step: int) -> Path:
    folder = rundir.checkpoint_dir(run_folder, step)
    (folder / rundir.MODEL).mkdir(parents=True)
    (folder / rundir.MODEL / "model.safetensors").write_bytes(bytes([step]) * 64)
    rundir.write_complete(folder, step)
    return folder


def _resume(run_folder: Path, warn) -> Path:
    from rlvrlab.train.lifecycle import resume_point

    return resume_point(run_folder, "r1", warn)


def _evaluate(run_folder: Path, warn) -> Path:
    import contextlib
    import io

    from rlvrlab.eval.pipeline import _checkpoint as evaluated

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return evaluated(run_folder, "r1", None)
        finally:
            for line in err.getvalue().splitlines():
                warn(line.removeprefix("warning: "))


@pytest.mark.parametrize(("use", "purpose"), [(_resume, "resumed"), (_evaluate, "evaluated")],
                         ids=["resume", "eval"])
def test_resume_and_eval_take_the_same_newest_intact_checkpoint(tmp_path: Path, use, purpose: str) -> None:
    run_folder = tmp_path / "r1"
    with pytest.raises(RlvrlabError, match="run r1 has no complete checkpoint in .*checkpoint_every > 0"):
        use(run_folder, print)
    first, second = _checkpoint(run_folder, 2), _checkpoint(run_folder, 4)
    rundir.partial_checkpoint_dir(run_folder, 6).mkdir()  # a save cut short: never a candidate
    warnings: list[str] = []
    assert use(run_folder, warnings.append) == second and warnings == []
    (second / rundir.MODEL / "model.safetensors").write_bytes(b"damaged")
    assert use(run_folder, warnings.append) == first
    assert warnings == [f"run r1: checkpoint step_000004 (model/model.safetensors does not match its checksum) is "
                        f"damaged; the newest intact one, step_000002, is {purpose} instead"]
    assert use(run_folder, warnings.append) == rundir.newest_intact(run_folder, "r1", purpose=purpose, fix="",
                                                                    warn=warnings.append)
    (first / rundir.MODEL / "model.safetensors").unlink()
    with pytest.raises(RlvrlabError) as caught:
        use(run_folder, print)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"run r1 cannot be {purpose}: checkpoints step_000002 ")
    assert "model/model.safetensors is missing" in message and "no intact one is left" in message
