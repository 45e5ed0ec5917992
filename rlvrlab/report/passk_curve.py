"""pass@k and coverage@k as curves over k = 1..K_MAX with 95% bands, from the per-problem records of each seed's
`rlvrlab eval pass-at-k` run: passk_curve.csv and a PNG per dataset (docs/report.md, "pass@k curves").

Per problem (rlvrlab.algorithms.passk, "curves over k"):
- exact, where every record has p_correct (the policy's probability of each correct response; `rlvrlab eval
  pass-at-k` writes it on tasks that list their correct set, pairs, sampled at top_p = 1): pass@k = 1 - (1 - Z)^k
  and coverage@k = mean_c 1 - (1 - p_c)^k, the expected share of the correct set C among k samples, at every k;
- else the unbiased without-replacement estimators from n samples (Chen et al. 2021, eq. 1; coverage only where the
  record has |C|, correct_set), reported only for k with n >= SAMPLES_PER_K · k: the other ks are left out of the
  CSV and the plot, with a one-line note on stderr naming the fix (raise --n).
Per group and k: the mean over seeds and problems with the report's interval for evaluation columns, the crossed
seeds × problems interval (rlvrlab.stats.crossed_interval; NaN bounds for one seed).
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlvrlab import outputs, stats
from rlvrlab.algorithms.passk import exact_curves, reportable_ks, sampled_curves, too_few_samples
from rlvrlab.report import plots
from rlvrlab.report.collect import EvalRecords

K_MAX = 64
METRICS = ("pass_at_k", "coverage_at_k")
COLUMNS = ("group", "dataset", "k", "metric", "mean", "ci_low", "ci_high", "n_seeds", "estimate")


@dataclass(frozen=True)
class CurvePoint:
    """One row of passk_curve.csv. estimate: exact (from p_correct) | unbiased (from n samples per problem)."""

    group: str
    dataset: str
    k: int
    metric: str
    mean: float
    ci_low: float
    ci_high: float
    n_seeds: int
    estimate: str


def problem_curves(row: Mapping, k_max: int = K_MAX) -> tuple[np.ndarray, np.ndarray]:
    """(pass@k, coverage@k) for k = 1..k_max of one per-problem record (rlvrlab.eval.run.problem_record): exact from
    its p_correct when it has one, else sampled_curves (NaN at ks that n samples cannot report; coverage NaN without
    correct_set)."""
    if row.get("p_correct"):
        return exact_curves(row["p_correct"], k_max)
    return sampled_curves(int(row["n"]), int(row["c"]), row.get("correct_forms") or [], row.get("correct_set"),
                          k_max)


def curve_points(records: Mapping[str, Sequence[Sequence[Mapping]]], dataset: str,
                 k_max: int = K_MAX) -> tuple[list[CurvePoint], str | None]:
    """records: group label -> [seed][problem] records (every seed on the same problems, in the same order).
    The points of every group, metric and reportable k, and the note for the ks left out (None when none is)."""
    points: list[CurvePoint] = []
    notes: list[str] = []
    for group, seeds in records.items():
        rows = [row for seed in seeds for row in seed]
        exact = all(row.get("p_correct") for row in rows)
        n_min = None if exact else min(int(row["n"]) for row in rows)
        ks = reportable_ks(n_min, k_max)
        if n_min is not None and (note := too_few_samples(n_min, k_max)) is not None:
            notes.append(note)
        curves = [[problem_curves(row, k_max) for row in seed] for seed in seeds]
        for index, metric in enumerate(METRICS):
            values = np.asarray([[c[index] for c in seed] for seed in curves], dtype=np.float64)  # [S, P, k_max]
            for k in ks:
                x = values[:, :, k - 1]
                if not np.isfinite(x).all():  # coverage without |C|: not defined for this group
                    break
                iv = stats.crossed_interval(x)
                points.append(CurvePoint(group, dataset, k, metric, iv.mean, iv.low, iv.high, x.shape[0],
                                         "exact" if exact else "unbiased"))
    return points, (min(notes, key=len) if notes else None)


def to_csv(points: Sequence[CurvePoint]) -> str:
    """passk_curve.csv: one row per point, floats exactly (repr), `nan` where a band needs 2 seeds."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for p in points:
        writer.writerow([p.group, p.dataset, p.k, p.metric, *(repr(float(v)) for v in (p.mean, p.ci_low, p.ci_high)),
                         p.n_seeds, p.estimate])
    return out.getvalue()


def write(evals: EvalRecords, folder: Path, *, plot: bool = True, k_max: int = K_MAX) -> list[Path]:
    """passk_curve.csv over every dataset and, with plot, passk_curve_<dataset>.png; the note of each dataset whose
    ks were cut by the n >= 4k rule goes to stderr. Nothing is written without per-problem records."""
    points: list[CurvePoint] = []
    written: list[Path] = []
    for dataset, records in evals.records.items():
        found, note = curve_points(records, dataset, k_max)
        if note is not None:
            print(f"note: {dataset}: {note}", file=sys.stderr, flush=True)
        points += found
        if plot and found:
            written.append(plots.passk_coverage_curves(found, dataset, folder, note))
    if points:
        path = folder / "passk_curve.csv"
        outputs.write_replacing(path, to_csv(points))
        written.insert(0, path)
    return written
