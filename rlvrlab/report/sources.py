"""The report's first stage, select: runs from a source become groups of seed runs (a Selection) and the values the
statistics are computed from, `data[(section, metric)][group label]` -> [S] (one reduced value per seed run) or
[S, P] (an evaluation's seeds x problems). Sources (registered in rlvrlab.report.command.SOURCES): MLflow
(rlvrlab.report.from_mlflow), a CSV of per-seed values and TensorBoard event folders (rlvrlab.report.files), and a
results folder's recorded values (rlvrlab.report.reanalyse)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np

from rlvrlab.report import collect
from rlvrlab.report.columns import Equivalence, MetricSpec, Pair
from rlvrlab.report.request import ReportRequest

Data = dict[tuple[str, str], dict[str, np.ndarray]]


@dataclass
class Selected:
    """What the analysis reads: the groups, the metric columns and their values, and what else a source knows."""

    selection: collect.Selection
    specs: list[MetricSpec]
    data: Data
    eval_stats: list[str] = field(default_factory=list)  # the columns of each evaluation section
    evals: Optional[collect.EvalRecords] = None
    # what the curves, events and a protocol's first run start read: an MLflow client, or the same reads of
    # TensorBoard runs' series (rlvrlab.report.tensorboard.Histories); None for a CSV (no series)
    client: Any = None
    stage_one: Optional[int] = None  # n0 of an adaptive-seed study (table.stage_one_of)
    notes: list[str] = field(default_factory=list)  # the source's own footer lines
    values_note: Optional[str] = None  # what a training value is, when not a reduction of a logged series

    def values_noted(self, notes: list[str]) -> list[str]:
        """The notes with the training-metric note saying what a value is when the source gives final values (a
        CSV's: no window of logged steps was reduced), else as they are."""
        head, tail = "training metrics, per run: ", "; intervals"
        if self.values_note is None:
            return notes
        shown = "; ".join(f"{m.label}: {self.values_note}" for m in self.specs)
        return [head + shown + note[note.index(tail):] if note.startswith(head) and tail in note else note
                for note in notes]


class Source(Protocol):
    """A select stage: the runs at `path` (None: MLflow, located by the request) with their values."""

    def __call__(self, path: Optional[Path], request: ReportRequest, pairs: Sequence[Pair],
                 equivalence: Optional[Equivalence], /) -> Selected: ...
