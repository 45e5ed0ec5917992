"""A private, throwaway PostgreSQL cluster for tests: its own data folder, port and socket, trust auth, no fsync.

The server binaries (initdb, pg_ctl) come from Debian's postgresql package (`make test` installs it when missing);
the cluster the package itself creates is never touched. PostgreSQL refuses to run as root, so under root the
cluster is owned by, and run as, the `postgres` OS user (runuser), in a folder under /tmp that user can reach.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

USER = "postgres"  # the cluster's superuser (and, under root, the OS user that runs it)


def server_bindir() -> Optional[Path]:
    """The folder of the newest initdb and pg_ctl: Debian's /usr/lib/postgresql/VERSION/bin, else PATH."""
    def version(path: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", Path(path).parents[1].name))

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl", path=str(Path(initdb).parent)):
        return Path(initdb).parent
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """start() -> the URL postgresql://postgres@127.0.0.1:PORT/DATABASE; stop() ends the server and removes its files."""

    def __init__(self, bindir: Path, database: str = "rlvrlab"):
        self.bindir, self.database = bindir, database
        self.root: Optional[Path] = None
        self.port = 0
        self._as_root = os.geteuid() == 0

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def log(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", USER, "--"] if self._as_root else []
        # cwd: a folder the server's user can enter (pg_ctl and initdb look up their current directory)
        result = subprocess.run([*prefix, *command], cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:2])} failed (exit {result.returncode}): "
                               f"{(result.stdout + result.stderr).strip()[-2000:]}{self._log_tail()}")
        return result

    def _log_tail(self) -> str:
        try:
            return "\nserver log:\n" + self.log.read_text()[-2000:]
        except (OSError, AssertionError):
            return ""

    def start(self, timeout: float = 60) -> str:
        # not under pytest's tmp folders: /tmp/pytest-of-root is 0700 root, the postgres user could not enter it
        self.root = Path(tempfile.mkdtemp(prefix="rlvrlab-postgres-"))
        if self._as_root:
            import pwd

            try:
                owner = pwd.getpwnam(USER)
            except KeyError:
                raise RuntimeError(f"running as root, and there is no {USER!r} OS user to run PostgreSQL as "
                                   "(Debian's postgresql package creates it)") from None
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "--no-sync",
                  "--no-locale", "--encoding=UTF8")
        options = (f"-p {{port}} -k {shlex.quote(str(self.root))} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        for attempt in range(3):  # the free port may be taken between the check and the start
            self.port = free_port()
            try:
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t",
                          str(int(timeout)), "-o", options.format(port=self.port), "start", timeout=timeout + 30)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        self._run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                  self.database)
        return self.url

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop",
                          timeout=90)
        except (RuntimeError, subprocess.TimeoutExpired):
            self._kill()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _kill(self) -> None:
        """The postmaster's pid is the first line of postmaster.pid; SIGQUIT is PostgreSQL's immediate shutdown."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGQUIT)
            time.sleep(2)
        except (OSError, ValueError, IndexError):
            pass
