"""What `rlvrlab eval pass-at-k` prints, as plain text cells: the per-dataset summary of one evaluation, the table
over training seeds of a --study / --runs-of evaluation, the files and MLflow run written. `Table` is the plain
table the commands print (rlvrlab.cli.options.print_table draws it with rich); rlvrlab.sweep.view uses it too."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # the pipeline imports torch: not needed to print
    from rlvrlab.eval.pipeline import EvalOutcome

NOTHING_LEFT = "every finished training run already has an evaluation with these settings"  # --study / --runs-of


@dataclass(frozen=True)
class Table:
    """A table of text cells: its title, column labels, rows and caption; `right`: the columns aligned right,
    `nowrap`: the columns never wrapped, `marked`: the rows a command emphasises (a best trial, a failed check)."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: Optional[str] = None
    right: frozenset[int] = frozenset()
    nowrap: frozenset[int] = frozenset()
    marked: frozenset[int] = frozenset()


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _with_interval(entry: dict, name: str) -> str:
    value, iv = entry[name], entry.get("intervals", {}).get(name)
    if value is None or not iv or iv["se"] is None:
        return _fmt(value)
    return f"{value:.3f} (se {iv['se']:.3f}) [{iv['low']:.3f}, {iv['high']:.3f}]"


def summary_table(summary: dict, ks: list[int], n: int) -> Table:
    """One column per dataset (and per source within it, when they differ), one row per statistic. Each mean over
    problems is printed with its per-problem standard error and 95% t-interval (rlvrlab.algorithms.passk.
    problem_interval); ks above n / SAMPLES_PER_K are marked (few samples per k: close to one indicator per
    problem)."""
    from rlvrlab.algorithms.passk import SAMPLES_PER_K  # rlvrlab.algorithms imports torch: not at --help

    entries: list[dict] = []
    labels = ["statistic"]
    for name, entry in summary.items():
        entries.append(entry)
        labels.append(name)
        for source, sub in entry.get("by_source", {}).items():
            entries.append(sub)
            labels.append(f"{name}/{source}")
    short = [k for k in ks if SAMPLES_PER_K * k > n]
    caption = (f"† n < {SAMPLES_PER_K}k: few samples per k, close to one indicator per problem; raise --n to "
               f"{SAMPLES_PER_K * max(short)} for k = {max(short)}") if short else None
    rows = [["problems", *(str(e["problems"]) for e in entries)],
            [f"avg@{n}", *(_with_interval(e, "avg@n") for e in entries)]]
    rows += [[f"{stat}@{k}" + (" †" if k in short else ""), *(_with_interval(e, f"{stat}@{k}") for e in entries)]
             for stat in ("pass", "maj") for k in ks]
    rows += [["diversity of correct", *(_fmt(e["diversity"]) for e in entries)],
             ["  problems with a correct", *(str(e["diversity_problems"]) for e in entries)],
             ["no answer", *(f"{e['no_answer_rate']:.1%}" for e in entries)]]
    return Table(f"n={n} samples per problem; means over problems (se: per-problem standard error) [95% t-interval "
                 "over problems]", labels, rows, caption, right=frozenset(range(1, len(labels))))


def seeds_table(outcomes: Sequence[EvalOutcome]) -> Optional[Table]:
    """Over the training seeds of one configuration (--study / --runs-of; EvalOutcome.config_hash): each mean over
    seeds and problems with the crossed seeds × problems 95% interval that `rlvrlab report` gives evaluation
    columns (rlvrlab.stats.crossed_interval), for every configuration with 2+ seeds evaluated on the same
    problems; None when there is none."""
    import numpy as np

    from rlvrlab import stats
    from rlvrlab.algorithms.passk import SAMPLES_PER_K

    by_config: dict[str, list] = defaultdict(list)
    for outcome in outcomes:
        if outcome.config_hash:
            by_config[outcome.config_hash].append(outcome)
    rows = []
    for config, group in by_config.items():
        keyed = [{(r["dataset"], str(r["id"])): r for r in o.records} for o in group]
        if len(group) < 2 or any(k.keys() != keyed[0].keys() for k in keyed):
            continue
        names = ["avg@n", *(f"{stat}@{k}" for stat in ("pass", "maj") for k in group[0].ks)]
        for dataset in sorted({d for d, _ in keyed[0]}):
            ids = sorted(i for d, i in keyed[0] if d == dataset)
            for name in names:
                iv = stats.crossed_interval(np.asarray([[seed[(dataset, i)][name] for i in ids] for seed in keyed],
                                                       dtype=np.float64))
                short = name != "avg@n" and SAMPLES_PER_K * int(name.split("@")[1]) > group[0].n
                rows.append([config, str(len(group)), dataset, name + (" †" if short else ""),
                             f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"])
    if not rows:
        return None
    return Table("over training seeds: means over seeds and problems [95% crossed seeds x problems interval, as in "
                 "rlvrlab report]", ["configuration", "seeds", "dataset", "statistic", "mean [95% interval]"], rows,
                 right=frozenset({4}))


def done_lines(outcome: EvalOutcome) -> list[str]:
    """The files one evaluation wrote and its MLflow evaluation run."""
    return [f"done: {', '.join(str(f) for f in outcome.files)}",
            f"  MLflow run {outcome.mlflow_run_id} (experiment {outcome.experiment!r}) in {outcome.uri}"]
