"""A seed's log: its process's stdout and stderr, as they come, in
`<output_dir>/sweep-logs/<study>/trial-<N>-seed-<S>[-attempt-<A>].log`, capped with bounded memory.

The pipes are read in fixed-size chunks (never whole lines: a 400 MB line without a newline is never held), and the
file keeps the first HEAD_BYTES and the last TAIL_BYTES of the output with a marker line between them that says how
many bytes were dropped. The file is written as the output comes (`tail -f` works); once it grows past HEAD_BYTES +
2 x TAIL_BYTES its middle is cut (the last TAIL_BYTES are copied after the head: at most TAIL_BYTES in memory),
and once more when it is closed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import BinaryIO, Optional

from rlvrlab.outputs import path_part

HEAD_BYTES = 1 << 20  # the first MiB of a seed's output
TAIL_BYTES = 4 << 20  # and its last 4 MiB
CHUNK = 64 << 10  # bytes read from a pipe at a time
STDERR_KEPT = 64 << 10  # the end of stderr kept in memory for a failure's reason (its last lines)
FOLDER = "sweep-logs"


def log_path(output_dir: Path, study: str, trial: int, seed: int) -> Path:
    """A new file for this attempt of the seed: `-attempt-2`, `-3`, ... where earlier attempts left theirs (a
    stopped trial's retry, a second invocation); created here, so that two workers never share one."""
    folder = Path(output_dir) / FOLDER / path_part(study)
    folder.mkdir(parents=True, exist_ok=True)
    attempt = 1
    while True:
        path = folder / (f"trial-{trial}-seed-{seed}" + (f"-attempt-{attempt}" if attempt > 1 else "") + ".log")
        try:
            with open(path, "xb"):
                return path
        except FileExistsError:
            attempt += 1


class CappedLog:
    """The log file, written by several reader threads (stdout, stderr) at once; see the module's text."""

    def __init__(self, path: Path, head: Optional[int] = None, tail: Optional[int] = None):
        self.path = Path(path)
        self.head = HEAD_BYTES if head is None else head
        self.tail = TAIL_BYTES if tail is None else tail
        self._file: BinaryIO = open(self.path, "w+b")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._size = 0  # bytes in the file
        self._tail_start: Optional[int] = None  # where the kept tail begins, once the middle was cut
        self.dropped = 0

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write(data)
            self._size += len(data)
            if self._size - (self._tail_start or self.head) > 2 * self.tail and self._size > self.head:
                self._cut()

    def _cut(self) -> None:
        start = self._tail_start or self.head
        keep_from = max(start, self._size - self.tail)
        if keep_from == start:
            return
        self.dropped += keep_from - start
        self._file.flush()
        self._file.seek(keep_from)
        kept = self._file.read(self._size - keep_from)
        marker = (f"\n[rlvrlab: {self.dropped} bytes of output dropped here; the log keeps the first {self.head} "
                  f"and the last {self.tail} bytes]\n").encode()
        self._file.seek(self.head)
        self._file.truncate()
        self._file.write(marker)
        self._tail_start = self.head + len(marker)
        self._file.write(kept)
        self._size = self._tail_start + len(kept)

    def close(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            if self._size > self.head and self._size - (self._tail_start or self.head) > self.tail:
                self._cut()
            self._file.close()


def pump(fd: int, log: Optional[CappedLog], kept: Optional[bytearray] = None) -> None:
    """Copy a pipe to the log chunk by chunk until its writers have all closed it; the last STDERR_KEPT bytes also
    to `kept` (stderr, for a failure's reason)."""
    try:
        while True:
            try:
                data = os.read(fd, CHUNK)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            if log is not None:
                try:
                    log.write(data)
                except OSError:  # a full disk: the seed goes on; its reason still has stderr's last lines
                    pass
            if kept is not None:
                kept += data
                del kept[:-STDERR_KEPT]
    finally:
        os.close(fd)


def last_lines(kept: bytes, count: int = 200) -> list[str]:
    """stderr's last `count` lines, from its kept end."""
    return kept.decode("utf-8", errors="replace").splitlines()[-count:]
