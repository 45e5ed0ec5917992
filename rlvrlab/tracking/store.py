"""Where runs are recorded: the MLflow tracking URI and artifact root for an output folder.

Default: `sqlite:///<output_dir>/mlflow.db` with artifacts in `<output_dir>/mlartifacts`. With a tracking URI
(a shared `mlflow server`, `http://host:5000`) the server decides where artifacts go.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rlvrlab.errors import RlvrlabError


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


# How long one look at an MLflow server may take before a command gives up on it. MLflow's own client retries an
# unreachable server 7 times with backoff (MLFLOW_HTTP_REQUEST_MAX_RETRIES), each try up to 120 s: a train run
# pointed at a closed port sat silent for 4 min 24 s here before a traceback.
REACH_SECONDS = 5.0
_reached: set[str] = set()  # URIs that answered in this process: each is looked at once


def check_reachable(uri: str, timeout: float = REACH_SECONDS) -> None:
    """An http(s) tracking URI answers an MLflow server's GET /health within `timeout` seconds (401/403: a server
    behind authentication, which MLflow's client handles); else a one-line RlvrlabError. Other URIs (sqlite, a
    local folder) pass."""
    if not uri.startswith(("http://", "https://")) or uri in _reached:
        return
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
            raise RlvrlabError(f"tracking.uri {uri}: GET {health} answered HTTP {error.code}, not an MLflow server's "
                               f"OK; {fix}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise RlvrlabError(f"tracking.uri {uri}: no MLflow server answered within {timeout:g} s ({reason}); "
                           f"{fix}") from None
    _reached.add(uri)


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

