"""The numbers of a report: one Cell per (group, section, metric), with intervals and baseline comparisons.
Sections: "train" (training metrics, one value per seed) and one per evaluation dataset (per seed and problem)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.report import stats
from rlvrlab.report.collect import EvalRecords, Group, Selection, final_values


@dataclass
class Cell:
    group: str
    section: str  # "train" or an evaluation dataset
    metric: str
    mean: float
    n_seeds: int
    n_problems: int = 0
    low: Optional[float] = None  # the main interval (two-level for evaluations, seeds for training)
    high: Optional[float] = None
    seed_low: Optional[float] = None  # the seed-only interval (evaluations: for comparison)
    seed_high: Optional[float] = None
    delta: Optional[float] = None  # against the baseline group
    delta_low: Optional[float] = None
    delta_high: Optional[float] = None
    p: Optional[float] = None
    p_holm: Optional[float] = None
    prob_improvement: Optional[float] = None
    note: str = ""

    @property
    def flagged(self) -> bool:
        return self.n_seeds < stats.MIN_SEEDS


@dataclass
class Report:
    cells: list[Cell]
    groups: list[Group]
    baseline: Optional[str]
    sections: list[str]
    metrics: dict[str, list[str]]  # section -> metric columns
    seed: int
    reps: int
    notes: list[str] = field(default_factory=list)
    higher_is_better: dict[str, bool] = field(default_factory=dict)


def lower_is_better(metric: str) -> bool:
    return metric.startswith(("time/", "loss/")) or metric in ("rollout/lag", "rollout/logp_gap_max",
                                                                "rollout/logp_gap_mean")


def find_baseline(groups: list[Group], name: Optional[str]) -> Optional[Group]:
    if name is None:
        return None
    exact = [g for g in groups if g.label == name]
    by_algorithm = [g for g in groups if g.algorithm == name]
    matches = exact or by_algorithm
    if len(matches) == 1:
        return matches[0]
    labels = ", ".join(repr(g.label) for g in groups)
    if not matches:
        raise RlvrlabError(f"--baseline {name!r} matches no group; groups: {labels}")
    raise RlvrlabError(f"--baseline {name!r} matches {len(matches)} groups; give one label: {labels}")


def build(client, selection: Selection, *, metrics: list[str], last: int, reduce: str,
          evals: Optional[EvalRecords], eval_stats: list[str], baseline: Optional[str], seed: int,
          reps: int = stats.REPS) -> Report:
    rng = np.random.default_rng(seed)
    base = find_baseline(selection.groups, baseline)
    cells: list[Cell] = []
    sections = ["train"] if metrics else []
    columns: dict[str, list[str]] = {"train": list(metrics)} if metrics else {}
    for metric in metrics:
        values = {g.label: final_values(client, g, metric, last, reduce) for g in selection.groups}
        for g in selection.groups:
            x = values[g.label]
            cell = Cell(g.label, "train", metric, float(x.mean()), len(x))
            if not cell.flagged:
                interval = stats.seed_interval(x, rng, reps)
                cell.low, cell.high = interval.low, interval.high
                cell.seed_low, cell.seed_high = interval.low, interval.high
            _compare(cell, x, values[base.label] if base else None, base is not None and g is not base, rng, reps)
            cells.append(cell)
    if evals is not None:
        for dataset, ids in evals.datasets.items():
            sections.append(dataset)
            columns[dataset] = list(eval_stats)
            for stat in eval_stats:
                for g in selection.groups:
                    x = evals.matrices[(g.label, dataset, stat)]
                    ref = evals.matrices[(base.label, dataset, stat)] if base else None
                    cells.append(_eval_cell(g, dataset, stat, x, ref, base is not None and g is not base, rng, reps))
    compared = [c for c in cells if c.p is not None]
    for cell, adjusted in zip(compared, stats.holm([c.p for c in compared])):
        cell.p_holm = adjusted
    notes = [f"intervals: 95% percentile bootstrap, {reps} replicates, RNG seed {seed}; training metrics: over seeds "
             f"({reduce} of the last {last} logged steps per run); evaluations: seeds and problems resampled "
             "independently (seed-only interval in the CSV)"]
    if base is not None:
        notes.append(f"Δ vs {base.label}: difference of means (seeds independent; evaluation problems paired); "
                     "p two-sided "
                     f"from the bootstrap, Holm-adjusted over the {len(compared)} comparisons; P(impr.) = "
                     "P(seed score > baseline seed score) as in rliable")
    if any(g.failed for g in selection.groups) or selection.failed_only:
        notes.append("failed: seed runs that ended FAILED (non-finite loss, weights or gradients, or a crash) are "
                     "not in the means; the seeds column counts them")
    notes += selection.failed_only
    if any(c.flagged for c in cells):
        notes.append(f"† fewer than {stats.MIN_SEEDS} seeds: no interval")
    higher = {c.metric: not lower_is_better(c.metric) for c in cells}
    return Report(cells, selection.groups, base.label if base else None, sections, columns, seed, reps, notes, higher)


def _eval_cell(g: Group, dataset: str, stat: str, x: np.ndarray, ref: Optional[np.ndarray], compare: bool,
               rng: np.random.Generator, reps: int) -> Cell:
    seeds, problems = x.shape
    has_nan = bool(np.isnan(x).any())
    if has_nan:  # diversity is undefined on problems without a correct answer: per-seed means over the rest
        scores = np.nanmean(np.where(np.isnan(x).all(axis=1, keepdims=True), 0.0, x), axis=1)
        cell = Cell(g.label, dataset, stat, float(scores.mean()), seeds, problems,
                    note="mean over problems with a correct answer; seed-only interval")
        if not cell.flagged:
            interval = stats.seed_interval(scores, rng, reps)
            cell.low, cell.high = cell.seed_low, cell.seed_high = interval.low, interval.high
        ref_scores = None if ref is None else np.nanmean(np.where(np.isnan(ref).all(axis=1, keepdims=True), 0, ref), 1)
        _compare(cell, scores, ref_scores, compare, rng, reps)
        return cell
    cell = Cell(g.label, dataset, stat, float(x.mean()), seeds, problems)
    if not cell.flagged:
        two = stats.two_level_interval(x, rng, reps)
        one = stats.seed_interval(x, rng, reps)
        cell.low, cell.high, cell.seed_low, cell.seed_high = two.low, two.high, one.low, one.high
    _compare(cell, x, ref, compare, rng, reps)
    return cell


def _compare(cell: Cell, x: np.ndarray, ref: Optional[np.ndarray], compare: bool, rng: np.random.Generator,
             reps: int) -> None:
    if not compare or ref is None:
        return
    if cell.flagged or ref.shape[0] < stats.MIN_SEEDS:
        cell.delta = float(x.mean() - ref.mean())
        return
    result = stats.difference(x, ref, rng, reps)
    cell.delta, cell.delta_low, cell.delta_high = result.delta, result.low, result.high
    cell.p, cell.prob_improvement = result.p, result.prob_improvement


def best_groups(report: Report) -> dict[tuple[str, str], str]:
    """(section, metric) -> the label of the best group by mean (higher or lower by metric)."""
    best: dict[tuple[str, str], Cell] = {}
    for c in report.cells:
        if math.isnan(c.mean):
            continue
        key = (c.section, c.metric)
        sign = 1 if report.higher_is_better.get(c.metric, True) else -1
        if key not in best or sign * c.mean > sign * best[key].mean:
            best[key] = c
    return {k: c.group for k, c in best.items()}
