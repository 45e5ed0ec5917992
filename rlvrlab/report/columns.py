"""What a report is asked for, as `rlvrlab report`'s options give it: the training metrics with their per-run
reduction (--metric, --reduce, --last), the comparisons (--compare) and the equivalence margins (--equivalence).
rlvrlab.report.table computes the report; rlvrlab.report.reanalyse parses a recorded command with these too."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rlvrlab.errors import RlvrlabError

REDUCTIONS = ("mean", "max", "min", "auc")  # auc: area under the curve / its step span (rlvrlab.report.collect)
EXTREMES = ("max", "min")  # reductions whose per-run value is a maximum or minimum over the window


def max_statistic(spec: MetricSpec) -> bool:
    """A training metric whose per-run value is an extreme over its window (`--metric NAME:max` or `:min`): skewed (one
    spike decides a run's value), so a claim on it also needs the exact sign-flip p (stats.claim). A per-step maximum
    reduced with mean (`loss/ratio_max`) is a mean of the window's steps and is not one."""
    return spec.reduce in EXTREMES


@dataclass(frozen=True)
class MetricSpec:
    """A training metric with its per-run reduction over the run's last `last` logged steps."""

    name: str
    reduce: str
    last: int
    label: str  # the column name: the name as given (`loss/grad_norm:max:60` or `train/reward`)


def parse_metrics(entries: Sequence[str], *, reduce: str, last: int) -> list[MetricSpec]:
    """`NAME[:REDUCE[:LAST]]`, comma-separated or repeated; REDUCE and LAST default to --reduce and --last."""
    specs = []
    for entry in entries:
        for text in (t.strip() for t in entry.split(",")):
            if not text:
                continue
            name, *rest = text.split(":")
            how = rest[0] if rest else reduce
            if how not in REDUCTIONS or len(rest) > 2 or (len(rest) == 2 and not rest[1].isdigit()) or \
                    (len(rest) == 2 and int(rest[1]) < 1):
                raise RlvrlabError(f"--metric {text!r}: write NAME[:REDUCE[:LAST]] with REDUCE one of "
                                   f"{', '.join(REDUCTIONS)} and LAST a step count >= 1, e.g. loss/grad_norm:max:60")
            specs.append(MetricSpec(name, how, int(rest[1]) if len(rest) == 2 else last, text))
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise RlvrlabError(f"--metric lists {next(x for x in labels if labels.count(x) > 1)!r} twice; give it once")
    return specs


def reduce_series(series: dict[int, float], last: int, reduce: str) -> float:
    """One run's value of a metric from its {step: value} series: the mean (or max/min) over its last `last` logged
    steps; auc: the area under those steps' curve (trapezoids, in steps) divided by their span, a mean over steps
    that weighs sparse logging correctly (one logged step: its value). The reduction of every source: MLflow
    histories (rlvrlab.report.collect.final_values) and TensorBoard scalars (rlvrlab.report.files)."""
    steps = sorted(series)[-last:]
    tail = np.asarray([series[s] for s in steps], dtype=np.float64)
    if reduce != "auc":
        return float(tail.mean() if reduce == "mean" else tail.max() if reduce == "max" else tail.min())
    if len(steps) == 1:
        return float(tail[0])
    x = np.asarray(steps, dtype=np.float64)
    return float(np.sum((tail[1:] + tail[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


@dataclass(frozen=True)
class Pair:
    """A comparison asked for: a - b. a == BEST: the best group by mean (among all groups but b), labelled selected
    and adjusted over the number of candidates."""

    a: str
    b: str
    metrics: tuple[str, ...] = ()  # the columns (metric labels, eval stats) it is tested on; () = every column


BEST = "best"


def parse_pairs(entries: Sequence[str]) -> list[Pair]:
    """`A:B` (group labels or algorithm names), comma-separated or repeated; `best:B` for the selected best cell.
    `A:B[m1|m2]` tests the pair on those columns only (metric labels as given to --metric, eval stats such as
    pass@1), so that a report's Holm family is exactly a protocol's list of comparisons."""
    pairs = []
    for entry in entries:
        for text in (t.strip() for t in entry.split(",")):
            if not text:
                continue
            metrics: tuple[str, ...] = ()
            if text.endswith("]") and "[" in text:
                text, _, listed = text[:-1].rpartition("[")
                metrics = tuple(m.strip() for m in listed.split("|") if m.strip())
                if not metrics:
                    raise RlvrlabError(f"--compare {text}[]: name the columns to test it on, e.g. "
                                       "\"up_dapo:dapo[train/reward|pass@1]\", or leave out the brackets for all")
            a, sep, b = text.partition(":")
            if not sep or not a.strip() or not b.strip():
                raise RlvrlabError(f"--compare {text!r}: write A:B with two group labels (or algorithm names), e.g. "
                                   "--compare \"up_dapo:dapo eps_high=inf\", or best:B")
            pairs.append(Pair(a.strip(), b.strip(), metrics))
    return pairs


@dataclass(frozen=True)
class Equivalence:
    """`--equivalence`: the margin M of the TOST (stats.equivalence_p) per column, in the metric's own units."""

    default: Optional[float] = None  # every column not named
    by_label: tuple[tuple[str, float], ...] = ()  # (metric label or eval stat, margin)

    def margin(self, label: str) -> Optional[float]:
        return dict(self.by_label).get(label, self.default)


def parse_equivalence(text: Optional[str]) -> Optional[Equivalence]:
    """`M` (every column), `NAME=M,...` (those columns only), or both (`0.02,pass@1=0.05`); M a float > 0."""
    if text is None:
        return None
    default, named = None, {}
    for entry in (t.strip() for t in text.split(",")):
        name, sep, value = entry.rpartition("=")
        try:
            margin = float(value)
        except ValueError:
            margin = math.nan
        if not entry or not margin > 0 or not math.isfinite(margin) or (sep and not name.strip()) or \
                (not sep and default is not None) or name.strip() in named:
            raise RlvrlabError(f"--equivalence {text!r}: give a margin > 0 in the metric's units (every column) or "
                               "NAME=MARGIN (one column), comma-separated, e.g. 0.02 or train/reward=0.02,pass@1=0.05")
        if sep:
            named[name.strip()] = margin
        else:
            default = margin
    return Equivalence(default, tuple(named.items()))
