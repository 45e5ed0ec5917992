"""Where runs are recorded: the MLflow tracking URI and artifact root for an output folder.

Default: `sqlite:///<output_dir>/mlflow.db` with artifacts in `<output_dir>/mlartifacts`. With a tracking URI
(a shared `mlflow server`, `http://host:5000`) the server decides where artifacts go.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Store:
    uri: str
    artifact_root: Path | None  # None: the server's own artifact root


def default_uri(output_dir: Path) -> str:
    return f"sqlite:///{Path(output_dir).expanduser().resolve() / 'mlflow.db'}"


def store(output_dir: str | Path, uri: str | None = None) -> Store:
    """The store of runs under `output_dir`, or the one at `uri` when given."""
    if uri:
        return Store(uri, None)
    folder = Path(output_dir).expanduser().resolve()
    return Store(default_uri(folder), folder / "mlartifacts")
