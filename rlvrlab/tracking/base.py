"""The tracker seam. Rank 0 gets MLflow; other ranks get NullTracker, so the loop never asks `if tracker`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol


class Tracker(Protocol):
    run_id: str

    def log_params(self, params: Mapping[str, object]) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Buffered: cheap to call every step; written by flush()."""
        ...

    def log_texts(self, files: Mapping[str, str]) -> None:
        """Text artifacts {path in the run's artifacts: text}, in one call."""
        ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def flush(self, wait: bool = True) -> None:
        """Write buffered metrics; wait=False may return before they are stored."""
        ...

    def finish(self, status: str) -> None:
        """status: FINISHED | FAILED | KILLED."""
        ...


class NullTracker:
    def __init__(self, run_id: str):
        self.run_id = run_id

    def log_params(self, params: Mapping[str, object]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def log_texts(self, files: Mapping[str, str]) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def flush(self, wait: bool = True) -> None:
        pass

    def finish(self, status: str) -> None:
        pass
