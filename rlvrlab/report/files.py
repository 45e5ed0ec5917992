"""Select from files (`rlvrlab report --source csv:FILE` or `--source tensorboard:DIR`): seed runs from a CSV of
per-seed values or from TensorBoard event folders (rlvrlab.report.tensorboard), grouped into a Selection with the
values the statistics read, as rlvrlab.report.sources gives them for MLflow runs (docs/report.md, "Sources").

The rule, for both: a run has params (CSV: its row's other columns; TensorBoard: its hparams or folder-name
`key=value` parts), a seed and a value per metric. Runs are grouped by the --group-by keys, by default every param
whose value differs between runs (never the seed), and labelled `key=value key=value` in numeric order of the
values, as rlvrlab.report.external labels MLflow runs grouped by params. A CSV value is the run's final value as
given; a TensorBoard series is reduced as an MLflow history is (--metric NAME:REDUCE:LAST, columns.reduce_series)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.collect import Group, SeedRun, Selection
from rlvrlab.report.columns import Equivalence, MetricSpec, Pair, parse_metrics, reduce_series
from rlvrlab.report.external import group_hash, group_order
from rlvrlab.report.provenance import UNKNOWN
from rlvrlab.report.request import ReportRequest
from rlvrlab.report.sources import Selected
from rlvrlab.report.table import check_columns

SEED = "seed"
CSV_RUN, CSV_COMMIT = "run", "commit"  # optional CSV columns: a run's name, the git commit that trained it


@dataclass(frozen=True)
class FileRun:
    """One seed run read from a file: its name, params, seed and, per metric label, its value."""

    name: str
    params: dict[str, str]
    seed: int
    values: dict[str, float]
    commit: str = UNKNOWN


def from_csv(path: Optional[Path], request: ReportRequest, pairs: Sequence[Pair],
             equivalence: Optional[Equivalence]) -> Selected:
    """One row per seed run: the group-key columns, `seed`, one column per metric (its final value), optionally
    `run` and `commit`. --metric names the metric columns (the rest are params); without it, --group-by names the
    keys and the other columns are the metrics."""
    assert path is not None  # request.source_kind gives csv a path
    if not Path(path).is_file():
        raise RlvrlabError(f"--source csv:{path}: no such file; give a CSV with one row per seed run")
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0]) if rows else []
    if SEED not in header:
        raise RlvrlabError(f"--source csv:{path}: no '{SEED}' column (columns: {', '.join(header) or 'none'}); "
                           "give one row per seed run with its seed")
    keys = _keys(request.group_by)
    others = [c for c in header if c not in (SEED, CSV_RUN, CSV_COMMIT)]
    if request.metric:
        specs = parse_metrics(list(request.metric), reduce=request.reduce, last=request.last or 10)
    elif keys:
        specs = parse_metrics([c for c in others if c not in keys], reduce=request.reduce, last=request.last or 10)
    else:
        raise RlvrlabError(f"--source csv:{path}: say which columns are metrics (--metric NAME,...) or group keys "
                           f"(--group-by KEY,...); columns: {', '.join(header)}")
    missing = [c for c in [*keys, *(s.name for s in specs)] if c not in header]
    if missing:
        from rlvrlab.config.rules import unknown

        raise unknown("column", missing[0], header, where=f"--source csv:{path}")
    metrics = {s.name for s in specs}
    runs = [FileRun(row.get(CSV_RUN) or f"{Path(path).name}:{i + 2}",
                    {c: row[c] for c in others if c not in metrics}, _seed(row[SEED], f"{path} line {i + 2}"),
                    {s.label: _number(row[s.name], f"{path} line {i + 2}, column {s.name}") for s in specs},
                    row.get(CSV_COMMIT) or UNKNOWN) for i, row in enumerate(rows)]
    return grouped(runs, keys, specs, f"csv:{path}", request, pairs, equivalence,
                   values_note=f"the value in {Path(path).name}")  # as reanalyse.select_folder


def from_tensorboard(folder: Optional[Path], request: ReportRequest, pairs: Sequence[Pair],
                     equivalence: Optional[Equivalence]) -> Selected:
    """Every run folder under FOLDER (rlvrlab.report.tensorboard.read_runs), each metric's scalar series reduced
    over its last steps (--metric NAME:REDUCE:LAST, --reduce, --last) as an MLflow history is."""
    from rlvrlab.report.tensorboard import Histories, read_runs

    assert folder is not None  # request.source_kind gives tensorboard a folder
    found = read_runs(Path(folder))  # one-line errors: no such folder, no event files, a run without a seed
    specs = parse_metrics(list(request.metric) or ["train/reward"], reduce=request.reduce, last=request.last or 10)
    tags = sorted({tag for run in found for tag in run.series})
    runs = []
    for run in found:
        assert run.seed is not None  # read_runs refuses a run without one
        values = {}
        for spec in specs:
            if not run.series.get(spec.name):
                from rlvrlab.config.rules import unknown

                raise unknown("metric", spec.name, tags, where=f"run {run.name!r} of tensorboard:{folder}")
            values[spec.label] = reduce_series(dict(run.series[spec.name]), spec.last, spec.reduce)
        runs.append(FileRun(run.name, dict(run.params), run.seed, values))
    selected = grouped(runs, _keys(request.group_by), specs, f"tensorboard:{folder}", request, pairs, equivalence)
    selected.client = Histories(found)  # the runs' series: curves, events and a protocol's first run start
    return selected


def grouped(runs: list[FileRun], keys: list[str], specs: list[MetricSpec], source: str, request: ReportRequest,
            pairs: Sequence[Pair], equivalence: Optional[Equivalence], values_note: Optional[str] = None) -> Selected:
    """The runs grouped by `keys` (default: every param that differs between runs), seeds in order, and the values
    `data[("train", label)][group label]` -> [S] in each group's seed order."""
    params = sorted({k for run in runs for k in run.params})
    keys = keys or [k for k in params if len({run.params.get(k) for run in runs}) > 1]
    for key in keys:
        lacking = next((run for run in runs if key not in run.params), None)
        if lacking is not None:
            raise RlvrlabError(f"{source}: run {lacking.name!r} has no {key!r} (it has {', '.join(lacking.params)}); "
                               "give every run its group keys or group by others with --group-by KEY,...")
    by_values: dict[tuple[str, ...], list[FileRun]] = {}
    for run in runs:
        by_values.setdefault(tuple(run.params[k] for k in keys), []).append(run)
    groups = []
    for values in sorted(by_values, key=group_order):
        members = sorted(by_values[values], key=lambda r: r.seed)
        label = " ".join(f"{k}={v}" for k, v in zip(keys, values)) or "all runs"
        seeds = [m.seed for m in members]
        if len(set(seeds)) != len(seeds):
            raise RlvrlabError(f"{source}: group {label!r} has seed {next(s for s in seeds if seeds.count(s) > 1)} "
                               "twice; give each seed run once, or group by more keys with --group-by")
        seed_runs = [SeedRun(m.name, m.seed, m.params, m.commit, "FINISHED", dirty_known=False) for m in members]
        groups.append(Group(group_hash(keys, values), seed_runs, label, dict(zip(keys, values))))
    name = Path(source.partition(":")[2]).stem or "runs"  # the default folder: results/<file or folder name>
    selection = Selection(source, name, groups, [], all_groups=groups, group_by=keys, seed_key=SEED)
    check_columns([s.label for s in specs], groups, request.baseline, list(pairs), equivalence)
    data: dict[tuple[str, str], dict[str, np.ndarray]] = {("train", s.label): {} for s in specs}
    for s in specs:  # in each group's seed order (by_values holds the rows in file order)
        for g in groups:
            order = {m.seed: m.values[s.label] for m in by_values[tuple(g.values[k] for k in keys)]}
            data[("train", s.label)][g.label] = np.asarray([order[seed] for seed in g.seeds], dtype=np.float64)
    note = f"groups: {source} by {', '.join(keys) or 'nothing (one group)'}, seeds by {SEED}"
    return Selected(selection, specs, data, notes=[note], values_note=values_note)


def _keys(text: Optional[str]) -> list[str]:
    return [k.strip() for k in (text or "").split(",") if k.strip()]


def _seed(text: str, where: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise RlvrlabError(f"{where}: seed {text!r} is not an integer; give each run's integer seed") from None


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise RlvrlabError(f"{where}: {text!r} is not a number; give the run's final value") from None
