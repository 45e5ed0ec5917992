"""Issue 44, item 1: rlvrlab removes only what it wrote, and only inside the folder it wrote it in. A forced model
import removes an earlier import's files by the names its marker lists, so every name is checked to be a plain file
name before anything moves (a marker is a file anybody can edit, or a model folder copied from someone else), and a
failure during the replace keeps the old model; checkpoint pruning never follows a link named like a checkpoint.
Each case checks every file under the test's folder (links by their targets) before and after."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from battery import one_line_error, rlvrlab, snapshot

from rlvrlab import rundir
from rlvrlab.errors import RlvrlabError
from rlvrlab.policy.gguf_import import MARKER, import_model


def _earlier_import(folder: Path, files: list, written: tuple[str, ...] = ("config.json", "model.safetensors")) -> None:
    """A folder as an earlier import leaves it: its files and a marker listing `files` (whatever they are)."""
    folder.mkdir(parents=True)
    for name in written:
        (folder / name).write_text(f"old {name}\n")
    (folder / MARKER).write_text(json.dumps({"source": "old.gguf", "sha256": "0" * 64, "dtype": "float32",
                                             "files": files}))


HOSTILE_NAMES = ["../victim.txt", "ABSOLUTE", ".", "..", "", "sub/config.json", "con\0fig.json", 7, None]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_a_forced_import_refuses_a_marker_naming_anything_but_a_plain_file_in_its_folder(tmp_path: Path,
                                                                                          name: object) -> None:
    """Issue 44: a marker is a file anybody can write (a model folder copied from someone else); a forced re-import
    whose marker lists `../victim.txt`, an absolute path, `.`, a path with a folder part or a non-name refuses in one
    line before anything moves, and every file (the victim beside the folder, the old model) is as it was."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    name = str(victim) if name == "ABSOLUTE" else name
    out = tmp_path / "models" / "m"
    _earlier_import(out, ["config.json", "model.safetensors", name])
    gguf_file = tmp_path / "new.gguf"
    gguf_file.write_bytes(b"hashed, never converted: the marker is refused first")
    before = snapshot(tmp_path)
    if isinstance(name, str) and "\0" not in name:  # argv cannot carry a NUL or a non-string; the library call can
        one_line_error(rlvrlab("model", "import", str(gguf_file), "--out", str(out), "--force", cwd=tmp_path),
                        "not a plain file name", "will not remove or replace anything")
    with pytest.raises(RlvrlabError, match="not a plain file name in the folder"):
        import_model(str(gguf_file), out, dtype="float32", downloads=tmp_path / "downloads", stage=print,
                     force=True)
    assert snapshot(tmp_path) == before


def test_a_forced_import_refuses_a_folder_whose_listed_file_is_a_link(tmp_path: Path) -> None:
    """A listed name that is a symbolic link (to a file outside) is not the import's own file: refused, the link
    and its target kept."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    out = tmp_path / "m"
    _earlier_import(out, ["config.json", "model.safetensors", "tokenizer.json"])
    (out / "tokenizer.json").symlink_to(victim)
    gguf_file = tmp_path / "new.gguf"
    gguf_file.write_bytes(b"x")
    before = snapshot(tmp_path)
    one_line_error(rlvrlab("model", "import", str(gguf_file), "--out", str(out), "--force", cwd=tmp_path),
                    "holds tokenizer.json, which the earlier import did not write")
    assert snapshot(tmp_path) == before


def _fake_convert(gguf: Path, into: Path, *, dtype: str, stage) -> dict:
    """What convert leaves, without a model: two files and the record."""
    (into / "config.json").write_text("new\n")
    (into / "model.safetensors").write_text("new weights\n")
    return {"source": str(gguf), "sha256": "", "dtype": dtype}


def test_a_forced_import_replaces_only_the_listed_files_and_leaves_nothing_beside(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """The success path of a replace (conversion stubbed: the real one runs in the slow test above): the old files
    are removed by name from the folder set aside, the new ones are in place, and nothing is left beside it."""
    import rlvrlab.policy.gguf_import as gi

    monkeypatch.setattr(gi, "convert", _fake_convert)
    out = tmp_path / "models" / "m"
    _earlier_import(out, ["config.json", "model.safetensors", "gone.bin"])  # a listed file already removed: fine
    (tmp_path / "keep.txt").write_text("beside\n")
    gguf_file = tmp_path / "new.gguf"
    gguf_file.write_bytes(b"x")
    assert import_model(str(gguf_file), out, dtype="bfloat16", downloads=tmp_path / "d", stage=print,
                        force=True) == (out, True)
    assert (out / "config.json").read_text() == "new\n" and json.loads((out / MARKER).read_text())["dtype"] == \
        "bfloat16"
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]
    assert (tmp_path / "keep.txt").read_text() == "beside\n"


@pytest.mark.parametrize("fail_at", ["convert", "rename"])
def test_a_failure_mid_replace_keeps_the_old_model(tmp_path: Path, monkeypatch, fail_at: str) -> None:
    """A conversion that fails, or a rename of the new folder into place that fails, leaves the old model as it
    was and no partial or `.replaced-*` folder beside it."""
    import rlvrlab.policy.gguf_import as gi

    out = tmp_path / "models" / "m"
    _earlier_import(out, ["config.json", "model.safetensors"])
    gguf_file = tmp_path / "new.gguf"
    gguf_file.write_bytes(b"x")
    before = snapshot(tmp_path)
    if fail_at == "convert":
        def broken(gguf: Path, into: Path, **_) -> dict:
            (into / "config.json").write_text("half\n")
            raise RlvrlabError("conversion failed")
        monkeypatch.setattr(gi, "convert", broken)
    else:
        monkeypatch.setattr(gi, "convert", _fake_convert)
        real_replace = os.replace

        def replace(src, dst) -> None:
            if Path(src).name.startswith(".m.import-"):
                raise OSError(5, "Input/output error")
            real_replace(src, dst)
        monkeypatch.setattr(gi.os, "replace", replace)
    with pytest.raises((RlvrlabError, OSError)):
        import_model(str(gguf_file), out, dtype="bfloat16", downloads=tmp_path / "d", stage=print, force=True)
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]


def test_checkpoint_pruning_never_follows_a_link_named_like_a_checkpoint(tmp_path: Path) -> None:
    """A link `step_000001` to a folder outside (with a COMPLETE file in it) is not one of the run's checkpoints:
    not listed, so neither loaded on resume nor removed when older checkpoints are pruned."""
    run = tmp_path / "run"
    for step in (2, 4):
        folder = rundir.checkpoint_dir(run, step)
        folder.mkdir(parents=True)
        rundir.write_complete(folder, step)
    outside = tmp_path / "mine"
    outside.mkdir()
    rundir.write_complete(outside, 1)
    rundir.checkpoint_dir(run, 1).symlink_to(outside, target_is_directory=True)
    assert [rundir.step_of(p) for p in rundir.complete(run)] == [2, 4]
