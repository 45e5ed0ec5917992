"""Where commands write, made safe before any work: output locations checked at once (one line naming the path and
the fix, not a traceback after minutes of retries), and file locks: one process trains a run at a time
(`<run_dir>/.lock` names it), and a fresh store is created by one process while the others wait.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlvrlab.errors import RlvrlabError, StorageError


def check_dir(path: str | Path, what: str) -> Path:
    """Check that `path` is (or can be created as) a folder this process can write in; returns it resolved.
    what: how the user gave it, for the message (e.g. 'output_dir=runs')."""
    folder = Path(path).expanduser()
    try:
        folder = folder.resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop
        raise RlvrlabError(f"{what}: {folder} cannot be resolved ({error}); give another folder") from None
    too_long = _too_long(folder)
    if too_long:
        raise RlvrlabError(f"{what}: {too_long}; give a shorter path")
    probe = folder
    while not probe.exists():
        if probe.is_symlink():  # a dangling link
            raise RlvrlabError(f"{what}: {probe} is a broken symbolic link; remove it or give another folder")
        probe = probe.parent
    if not probe.is_dir():
        where = "is a file" if probe == folder else f"is under {probe}, which is a file"
        raise RlvrlabError(f"{what}: {folder} {where}, not a folder; give a folder path instead")
    which = "folder" if probe == folder else f"nearest existing parent {probe}"
    if not os.access(probe, os.W_OK | os.X_OK) or read_only_fs(probe):
        raise RlvrlabError(f"{what}: cannot write in {folder} (the {which} is read-only or not yours); give a "
                           "folder you can write in, or fix its permissions")
    refused = _write_refused(probe)
    if refused is not None and full_or_held(refused) == "full":
        raise StorageError(f"{what}: cannot write in {folder}: no space left on its device; free space there, then "
                           "run the command again", what=f"no space left on the device of {folder}")
    if refused is not None:
        reason = refused.strerror or type(refused).__name__
        raise RlvrlabError(f"{what}: cannot write in {folder} (a file cannot be created in the {which}: {reason}); "
                           "give a folder you can write in")
    return folder


GITIGNORE = ".gitignore"
# what a default output folder rlvrlab makes gets in it: `*` ignores the folder's every file, the .gitignore included
GITIGNORE_TEXT = ("# written by rlvrlab when it created this output folder (output_dir's default): runs, checkpoints\n"
                  "# and MLflow stores are not source; delete this file to put the folder under git\n*\n")


def make_output_dir(folder: Path, *, default: bool) -> Path:
    """`mkdir -p folder`; when this call creates `folder` itself and it is the default output folder (`default`:
    output_dir was not given another value; `runs` of the working directory, often a git checkout), a `.gitignore`
    of `*` goes in it, so that `git add -A` does not take in checkpoints and a growing mlflow.db (which, once
    tracked, makes every later run from that checkout record git_dirty=true). A folder that already exists is left
    as it is, its files untouched; so is one another process created first. Returns `folder`."""
    folder = Path(folder)
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir()
    except FileExistsError:  # another process (a rank, a sweep worker) made it between the look and the mkdir
        return folder
    if default:
        try:
            with open(folder / GITIGNORE, "x", encoding="utf-8") as f:
                f.write(GITIGNORE_TEXT)
        except OSError:  # a marker, not a result: a folder that refuses it is still an output folder
            pass
    return folder


def _write_refused(folder: Path) -> OSError | None:
    """Why a file cannot be created and written in the existing `folder`, tried for real (os.access says yes to root
    in /proc, where a folder or file can never be made); None when it can. The probe is a file of a new unique name
    that only this call removes; nothing else is created, so nothing is left behind or taken from another process."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".rlvrlab-probe-", dir=folder)
    except OSError as error:
        return error
    try:
        os.write(fd, b"\n")
        os.fsync(fd)
    except OSError as error:
        return error
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass
    return None


# What rlvrlab writes below a folder it is given, at most: a run's checkpoint files
# (<run id>/checkpoints/.tmp_step_000010/model/model.safetensors, ~80 bytes) and MLflow's artifacts
# (mlartifacts/<experiment id>/<run id>/artifacts/params/<param>.txt, ~140 bytes), with room to spare.
BELOW_BYTES = 256


def _too_long(folder: Path) -> str | None:
    """Why the file system cannot hold `folder` and what is written below it (a name longer than NAME_MAX, a path
    longer than PATH_MAX less BELOW_BYTES), or None."""
    try:
        name_max, path_max = os.pathconf(folder.anchor, "PC_NAME_MAX"), os.pathconf(folder.anchor, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in folder.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            return (f"its folder name {part[:24]}... is {len(os.fsencode(part))} bytes long, more than the "
                    f"{name_max} a name may have on this file system")
    length = len(os.fsencode(str(folder)))
    if length + BELOW_BYTES > path_max:
        return (f"{str(folder)[:40]}... is {length} bytes long; with the {BELOW_BYTES} bytes of what is written below "
                f"it that is more than the {path_max} a path may have on this file system")
    return None


def check_file_target(path: str | Path, what: str) -> Path:
    """Check that a file can be written at `path` (its folder writable, the path not a folder)."""
    target = Path(path).expanduser().resolve()
    if target.is_dir():
        raise RlvrlabError(f"{what}: {target} is a folder, not a file; give a file path")
    check_dir(target.parent, what)
    if target.exists() and not os.access(target, os.W_OK):
        raise RlvrlabError(f"{what}: {target} is read-only; fix its permissions or give another path")
    return target


def read_only_fs(folder: Path) -> bool:
    """True on a read-only mount (os.access says yes to root on one only sometimes)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


# ------------------------------------------------------------------------------------- full disks, held stores
def full_or_held(error: BaseException | None) -> str | None:
    """"full" when `error` (or an error that caused it: MLflow and SQLAlchemy wrap sqlite's) is a full disk (ENOSPC,
    EDQUOT, sqlite's "database or disk is full"), "held" when it is a sqlite database another process holds locked
    ("database is locked"), else None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return "full"
        text = str(error)
        if "database or disk is full" in text or "No space left on device" in text:
            return "full"
        if "database is locked" in text:
            return "held"
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` for the block to write, renamed over `path` once the block succeeds and
    removed when it fails: a write cut short (a full disk, a kill) leaves `path` as it was, never empty or partial.
    A full disk is a one-line StorageError naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if full_or_held(error) == "full":
            raise StorageError(f"cannot write {path}: no space left on its device; free space there, then run the "
                               "command again (files written before are unchanged)",
                               what=f"no space left on the device of {path}") from None
        raise


def write_replacing(path: Path, text: str) -> None:
    """`path.write_text(text)` through `replacing`: the file is whole or as it was."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


# ------------------------------------------------------------------------------------------------------ locks
@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing) for the duration of the block; waits for other holders.
    flock(2) locks: released by the kernel when the holder dies (and not by its closing another descriptor of
    the file, as POSIX fcntl locks would be)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def shared_file_lock(path: Path) -> Iterator[None]:
    """A shared lock on `path` for the duration of the block: waits while a `file_lock` holder works, writes nothing
    (a missing file is not created: no lock then)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


class RunLock:
    """One writer per run: `<run_dir>/.lock` holds the pid, host and start time of the process training the run,
    under an flock(2) lock the kernel releases when that process dies. A lock file left by a dead process on this
    host is taken over; one held by a live process (or written on another host, whose processes this one cannot
    see) is refused in one line naming the holder."""

    NAME = ".lock"

    def __init__(self, run_folder: Path, run_id: str):
        self.path = run_folder / self.NAME
        self.run_id = run_id
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            raise RlvrlabError(f"run {self.run_id} is being trained by {self._holder()} ({self.path}); wait for "
                               "it to end or stop it, then resume") from None
        held = _read(self.path)
        if held and held.get("host") != socket.gethostname() and _alive_elsewhere(held):
            os.close(fd)
            raise RlvrlabError(f"run {self.run_id} is being trained by {self._holder()} ({self.path}), which this "
                               "host cannot check; if that process has ended, delete the lock file and resume")
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty lock file: nobody trains the run
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _holder(self) -> str:
        held = _read(self.path)
        if not held:
            return "another process"
        return f"pid {held.get('pid')} on {held.get('host')} since {held.get('started')}"


def _read(path: Path) -> dict | None:
    try:
        text = path.read_text()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None


def _alive_elsewhere(held: dict) -> bool:
    """A lock file written on another host (a shared file system): its process may be alive; flock locks do not
    always cross hosts, so it is trusted while it names a host, pid and start time."""
    return bool(held.get("pid") and held.get("host") and held.get("started"))


def path_part(name: str) -> str:
    """A name (an MLflow experiment, a study, a run label) as one safe part of a path: separators and other
    characters outside letters, digits and `._-+=@` become `_`, and a leading dot gets a `_` before it, so that
    `../../x` stays a folder inside the one it is joined to."""
    import re

    part = re.sub(r"[^\w.+=@-]", "_", name, flags=re.ASCII) or "_"
    return "_" + part if part.startswith(".") else part


def storage_line(error: BaseException, trouble: str) -> str:
    """The one line a command shows for a full disk or a held store it did not word itself (full_or_held)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if trouble == "full":
        return (f"no space left on the device ({type(error).__name__}: {first}); free space there, then run the "
                "command again")
    return (f"a sqlite database is locked by another process ({type(error).__name__}: {first}); wait for the process "
            "writing it to end, then run the command again")
