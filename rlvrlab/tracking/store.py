"""Where runs are recorded: the MLflow tracking URI and artifact root for an output folder, and the one look at a
store before a command uses it (`check_reachable`).

Default: `sqlite:///<output_dir>/mlflow.db` with artifacts in `<output_dir>/mlartifacts`. With a tracking URI
(a shared `mlflow server`, `http://host:5000`) the server decides where artifacts go.
"""

from __future__ import annotations

import os
import shlex
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError, StorageError


@dataclass(frozen=True)
class Store:
    uri: str
    artifact_root: Path | None  # None: the server's own artifact root


# sqlite's unix file layer opens paths of fewer than 512 bytes, its journal's ("-journal") included: the longest
# store path that opened here (sqlite 3.40) was 504 bytes, 505 failed with "unable to open database file".
SQLITE_PATH_BYTES = 504


def default_uri(output_dir: Path) -> str:
    return f"sqlite:///{Path(output_dir).expanduser().resolve() / 'mlflow.db'}"


def store(output_dir: str | Path, uri: str | None = None) -> Store:
    """The store of runs under `output_dir`, or the one at `uri` when given. RlvrlabError for an output_dir too
    long for sqlite to open its store in."""
    if uri:
        return Store(uri, None)
    folder = Path(output_dir).expanduser().resolve()
    database = len(os.fsencode(str(folder / "mlflow.db")))
    if database > SQLITE_PATH_BYTES:
        raise RlvrlabError(f"output_dir {folder}: the MLflow store {folder / 'mlflow.db'} would be {database} bytes "
                           f"long, and sqlite opens at most {SQLITE_PATH_BYTES}; give a shorter output_dir (or "
                           "tracking.uri= of an MLflow server)")
    return Store(default_uri(folder), folder / "mlartifacts")


# How long one look at an MLflow server (or a database server's port) may take before a command gives up on it.
# MLflow's own client retries an unreachable server 7 times with backoff (MLFLOW_HTTP_REQUEST_MAX_RETRIES), each try
# up to 120 s: a train run pointed at a closed port sat silent for 4 min 24 s here before a traceback; its database
# stores retry creating their engine 10 times (mlflow.store.db.utils.create_sqlalchemy_engine_with_retry), 112 s.
REACH_SECONDS = 5.0
_reached: set[str] = set()  # server URIs that answered in this process: each is looked at once

SERVER_SCHEMES = ("http", "https")
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}  # the servers' default ports
PASSED_SCHEMES = ("databricks", "databricks-uc", "uc")  # MLflow's hosted stores: MLflow's client answers for them
SUPPORTED = ("sqlite:///PATH", "postgresql://", "mysql://", "mssql://", "http://", "https://")
SQLITE_HEADER = b"SQLite format 3\x00"
MLFLOW_TABLES = {"experiments", "alembic_version"}  # what every MLflow database has, whatever its schema version
MIGRATE = "https://mlflow.org/docs/latest/self-hosting/migrate-from-file-store"


class StoreLost(StorageError):
    """The sqlite store a process was writing was deleted or replaced under it: what it held is gone with it."""

    def __init__(self, path: str):
        what = (f"the MLflow store {path} was deleted or replaced while in use: the records it held, the run's among "
                "them, are lost with it")
        super().__init__(f"{what}; restore it from a backup, or record in a new one", what=what)
        self.path = path


def check_reachable(uri: str, timeout: float = REACH_SECONDS, *, write: bool = True) -> None:
    """One look at a tracking URI before any work, so that a store that cannot be used is one line in seconds, not
    minutes of MLflow's retries and then a traceback: an http(s) server answers GET /health (`_check_server`); a
    database server's port (postgresql, mysql, mssql) accepts a TCP connection within `timeout` seconds; a sqlite
    file is a usable MLflow database or absent (`check_sqlite`; write=False for commands that only read it); a
    folder (`./mlruns`, `file://`) and an unknown scheme are refused. Else a one-line RlvrlabError."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme == "sqlite":
        check_sqlite(uri, write=write)
    elif uri in _reached or scheme in PASSED_SCHEMES or uri.lower() in PASSED_SCHEMES:
        return
    elif scheme in SERVER_SCHEMES:
        _check_server(uri, timeout)
    elif scheme in DATABASE_PORTS:
        _check_port(uri, scheme, timeout)
    elif scheme in ("", "file"):
        folder = uri.removeprefix("file://") if scheme else uri
        raise RlvrlabError(f"tracking.uri {uri}: MLflow's file store (a folder of runs) is in maintenance mode and "
                           "rlvrlab does not record in it; use a sqlite store, tracking.uri=sqlite:///PATH/mlflow.db, "
                           "or leave tracking.uri out for output_dir's own; runs already in the folder move over "
                           f"with `mlflow migrate-filestore --source {folder} --target sqlite:///PATH/mlflow.db` "
                           f"(MLflow >= 3.10, {MIGRATE})")
    else:
        raise RlvrlabError(f"tracking.uri {masked(uri)}: unknown scheme {scheme + '://'!r}; MLflow stores rlvrlab "
                           f"records in: {', '.join(SUPPORTED)} (or leave tracking.uri out for output_dir's own "
                           "sqlite store)")


def masked(uri: str) -> str:
    """`uri` with the password of its user:password@ part, if any, as ***."""
    password = _password(uri)
    return uri if password is None else uri.replace(f":{password}@", ":***@", 1)


def _check_server(uri: str, timeout: float) -> None:
    """An MLflow server's GET /health answers within `timeout` seconds (401/403: a server behind authentication,
    which MLflow's client handles)."""
    import urllib.error
    import urllib.request

    health = uri.rstrip("/") + "/health"
    fix = ("start the server (mlflow server --host HOST --port PORT), fix tracking.uri, or leave tracking.uri out to "
           "record in output_dir's own sqlite store")
    try:
        with urllib.request.urlopen(health, timeout=timeout, context=_tls(uri)) as answer:
            answer.read(64)
    except urllib.error.HTTPError as error:
        if error.code not in (401, 403):
            raise RlvrlabError(f"tracking.uri {masked(uri)}: GET {masked(health)} answered HTTP {error.code}, not an "
                               f"MLflow server's OK; {fix}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise RlvrlabError(f"tracking.uri {masked(uri)}: no MLflow server answered within {timeout:g} s ({reason}); "
                           f"{fix}") from None
    _reached.add(uri)


def _check_port(uri: str, scheme: str, timeout: float) -> None:
    """A database server's host:port (the scheme's default port when none is given) accepts a TCP connection within
    `timeout` seconds. A URI without a host (a local socket, a host in the query) is left to the driver."""
    import socket
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(uri)
        host, port = parts.hostname, parts.port or DATABASE_PORTS[scheme]
    except ValueError as error:  # a port that is not a number
        raise RlvrlabError(f"tracking.uri {masked(uri)}: {error}; give {scheme}://USER@HOST:PORT/DATABASE") from None
    if not host:
        return
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise RlvrlabError(f"tracking.uri {masked(uri)}: no {scheme} server answered at {host}:{port} within "
                           f"{timeout:g} s ({reason}); start the database server, fix tracking.uri, or leave "
                           "tracking.uri out to record in output_dir's own sqlite store") from None
    _check_login(uri, scheme, f"{host}:{port}", timeout)
    _reached.add(uri)


DRIVERS = {"postgresql": "pip install 'rlvrlab[postgres]'", "mysql": "pip install pymysql (and mysql+pymysql://)",
           "mssql": "pip install pyodbc"}


def _check_login(uri: str, scheme: str, where: str, timeout: float) -> None:
    """The database server at `where` takes the URI's user, password and database: one connection through
    SQLAlchemy, as MLflow's store makes it, within `timeout` seconds. A refused login (no such role or database, a
    wrong password) otherwise went through MLflow's ~112 s of engine retries before its traceback."""
    import threading

    outcome: dict[str, BaseException] = {}

    def connect() -> None:
        try:
            import sqlalchemy
            from sqlalchemy.pool import NullPool

            engine = sqlalchemy.create_engine(uri, poolclass=NullPool)
            try:
                with engine.connect():
                    pass
            finally:
                engine.dispose()
        except Exception as error:  # noqa: BLE001 - worded below, whatever the driver raised
            outcome["error"] = error

    thread = threading.Thread(target=connect, name="rlvrlab-store-login", daemon=True)
    thread.start()
    thread.join(timeout)
    fix = "fix the user, password or database in tracking.uri, or leave tracking.uri out to record in output_dir's "
    fix += "own sqlite store"
    if thread.is_alive():
        raise RlvrlabError(f"tracking.uri {masked(uri)}: the {scheme} server at {where} took the connection but did "
                           f"not let a session in within {timeout:g} s; check the server, or {fix}")
    error = outcome.get("error")
    if error is None:
        return
    if isinstance(error, ImportError) or type(error).__name__ == "NoSuchModuleError":
        raise RlvrlabError(f"tracking.uri {masked(uri)}: no driver for it here ({error}); "
                           f"{DRIVERS.get(scheme, 'install the driver the URI names')}") from None
    cause = getattr(error, "orig", None) or error  # SQLAlchemy wraps the driver's own error
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    reason = lines[0] if lines else type(cause).__name__
    password = _password(uri)
    if password:
        reason = reason.replace(password, "***")
    raise RlvrlabError(f"tracking.uri {masked(uri)}: the {scheme} server at {where} refused the session "
                       f"({reason}); {fix}") from None


def _password(uri: str) -> str | None:
    from urllib.parse import urlsplit

    try:
        return urlsplit(uri).password
    except ValueError:
        return None


def sqlite_path(uri: str) -> str | None:
    """The file of a sqlite URI (relative to the working folder when it is), None for an in-memory database."""
    path = uri.split("://", 1)[1].removeprefix("/").split("?", 1)[0]
    return None if path in ("", ":memory:") else path


def check_sqlite(uri: str, *, write: bool = True) -> None:
    """A sqlite store is usable: absent or empty (MLflow creates it), or a regular file that sqlite opens, not cut
    short, holding MLflow's tables (or none yet), readable, and writable when `write` (its folder too: sqlite writes
    a journal beside it). Cheap: one stat, 100 bytes and sqlite's table list, read-only; the file is not changed.
    Else a one-line RlvrlabError naming the file and the fix."""
    path = sqlite_path(uri)
    if path is None:
        return
    where = Path(path).expanduser()
    aside = (f"move it aside (mv {shlex.quote(str(where))} {shlex.quote(str(where) + '.damaged')}) or point "
             "output_dir or tracking.uri elsewhere")
    if where.is_dir():
        raise RlvrlabError(f"the MLflow store {where} is a folder, not a sqlite database file; {aside}")
    if where.exists() and not where.is_file():
        raise RlvrlabError(f"the MLflow store {where} is not a regular file (a device, a pipe or a socket); {aside}")
    if not where.exists():  # MLflow creates it (and its folders): that folder must take files
        if write:
            outputs.check_dir(where.parent, f"the MLflow store {where}")
        return
    if not os.access(where, os.R_OK):
        raise RlvrlabError(f"the MLflow store {where} cannot be read (its permissions); make it readable (chmod u+r) "
                           "or point output_dir or tracking.uri elsewhere")
    problem = _not_mlflow(where)
    if problem:
        raise RlvrlabError(f"{where} is not an MLflow database ({problem}); {aside}")
    if write and (not os.access(where, os.R_OK | os.W_OK) or not os.access(where.parent, os.W_OK | os.X_OK)
                  or outputs.read_only_fs(where.parent)):
        raise RlvrlabError(f"the MLflow store {where} is read-only (the file, its folder or their mount); make it "
                           "writable (chmod u+w) or point output_dir or tracking.uri elsewhere")


def _not_mlflow(path: Path) -> str | None:
    """Why the non-empty file `path` is not an MLflow sqlite database, or None (an empty file or one with no tables
    yet is one MLflow will create its tables in)."""
    import sqlite3
    from urllib.parse import quote

    try:
        short = _cut_short(path)
    except OSError as error:
        return f"it cannot be read: {error.strerror or error}"
    if short in ("", "not sqlite"):
        return None if short == "" else "it does not start with sqlite's header"
    try:
        with closing(sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=1)) as db:
            db.execute("BEGIN")  # a read transaction: its shared lock waits for, and then holds off, any commit
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            # another process's commit (a sweep's workers share the store) writes the header's page count before
            # the pages that extend the file: a size looked at without the lock can be short for a moment
            short = _cut_short(path) if short else None
    except sqlite3.DatabaseError as error:
        text = str(error)
        if "locked" in text or "busy" in text:
            return None  # a writer holds it: MLflow's own open waits or says so
        if short:
            return short
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return f"sqlite: {text}"
        return None  # a journal to roll back: MLflow's own open does or says so
    if short:
        return short
    missing = MLFLOW_TABLES - tables
    if tables and missing:
        return f"a sqlite database without MLflow's tables {', '.join(sorted(missing))}"
    return None


def _cut_short(path: Path) -> str | None:
    """Why the file is shorter than its sqlite header says ("it is cut short: ..."); "" for an empty file, "not
    sqlite" without sqlite's header, None when its size agrees. The header is read before the size: a file only
    grows while a commit extends it."""
    with path.open("rb") as handle:
        header = handle.read(100)
    size = path.stat().st_size
    if size == 0:
        return ""
    if not header.startswith(SQLITE_HEADER):
        return "not sqlite"
    if len(header) < 100:
        return f"it is cut short: {size} bytes, less than sqlite's 100-byte header"
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big")
    valid = header[92:96] == header[24:28]  # the page count is trusted only when sqlite wrote it (3.7.0 and later)
    if valid and pages and size < page * pages and not Path(f"{path}-wal").exists():
        return f"it is cut short: {size} of its {page * pages} bytes"
    return None


def _tls(uri: str):
    """For https: the TLS settings MLflow's client takes from the environment (a private CA's certificate, a client
    certificate, verification off), so that the look sees the server as MLflow will."""
    if not uri.startswith("https://"):
        return None
    import ssl

    context = ssl.create_default_context(cafile=os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None)
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("true", "1"):  # as MLflow reads it
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        context.load_cert_chain(os.environ["MLFLOW_TRACKING_CLIENT_CERT_PATH"])
    return context

