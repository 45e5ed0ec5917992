"""analyse gives two lists (issue 47, item 2): estimates, one per (group, section, metric), that hold no comparison;
and comparisons, the report's Holm family. table.csv's Δ columns of a group are written from its comparison with the
baseline (the same numbers comparisons.csv has), or, where too few seeds allow none, the difference of means alone."""

from __future__ import annotations

import csv
import io
from dataclasses import fields

import numpy as np
import pytest

from rlvrlab.report import render
from rlvrlab.report.collect import Group, SeedRun, Selection
from rlvrlab.report.columns import parse_metrics, parse_pairs
from rlvrlab.report.table import Estimate, analyse

SEEDS = {"base": [0, 1, 2, 3, 4, 5], "up": [0, 1, 2, 3, 4, 5], "other": [0, 1, 2, 3, 4], "one": [0]}
DELTA_COLUMNS = {"delta": "delta", "delta_low": "low", "delta_high": "high", "test": "test", "p": "p",
                 "p_holm": "p_holm", "p_signflip": "p_signflip", "mde": "mde", "mde_holm": "mde_holm",
                 "claim_note": "claim_note", "significant": "significant", "prob_improvement": "prob_improvement"}


def _report():
    rng = np.random.default_rng(11)
    groups = [Group(label, [SeedRun(f"{label}{s}", s, {"algorithm.name": label}, "abc", "FINISHED") for s in seeds],
                    label=label) for label, seeds in SEEDS.items()]
    specs = parse_metrics(["train/reward"], reduce="mean", last=1)
    data = {("train", "train/reward"): {g: 0.5 + 0.01 * rng.normal(size=len(s)) for g, s in SEEDS.items()},
            ("heldout", "pass@1"): {g: rng.random((len(s), 4)) for g, s in SEEDS.items()}}
    selection = Selection("memory", "runs", groups, [], all_groups=groups)
    return analyse(selection, data, metrics=specs, eval_stats=["pass@1"], baseline="base",
                   pairs=parse_pairs(["best:base", "up:other"]))


def _rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_estimates_hold_no_comparison() -> None:
    report = _report()
    assert {f.name for f in fields(Estimate)} & {"delta", "p", "p_holm", "significant", "mde_holm", "test"} == set()
    assert [(e.group, e.section) for e in report.estimates] == [(g, s) for s in ("train", "heldout") for g in SEEDS]
    named = {(r.a, r.b, r.section, r.selected_from is not None) for r in report.comparisons}
    assert ("up", "base", "train", False) in named and ("up", "other", "train", False) in named
    assert not any("one" in (r.a, r.b) for r in report.comparisons)  # one seed: no test
    assert any(selected for *_, selected in named)


@pytest.mark.parametrize("section", ["train", "heldout"])
def test_table_csv_deltas_are_the_baseline_comparisons(section: str) -> None:
    report = _report()
    table = {r["group"]: r for r in _rows(render.to_csv(report)) if r["section"] == section}
    versus = {r["a"]: r for r in _rows(render.comparisons_csv(report))
              if r["section"] == section and r["b"] == "base" and r["selected_from"] == ""}
    assert sorted(versus) == ["other", "up"]
    for group, row in versus.items():
        assert {column: table[group][column] for column in DELTA_COLUMNS} == \
            {column: row[field] for column, field in DELTA_COLUMNS.items()}
    assert {column: table["base"][column] for column in DELTA_COLUMNS} == \
        {column: ("False" if column == "significant" else "") for column in DELTA_COLUMNS}
    means = {e.group: e.mean for e in report.estimates if e.section == section}
    one = table["one"]
    assert float(one["delta"]) == pytest.approx(means["one"] - means["base"], abs=1e-15)
    assert (one["delta_low"], one["p_holm"], one["significant"]) == ("", "", "False")
    assert f"{means['one'] - means['base']:+.3f}†" in render.markdown(report)
