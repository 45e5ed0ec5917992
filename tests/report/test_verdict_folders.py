"""Verdict rules evaluated on a committed results folder without MLflow (issue 45, item 5): comparisons.csv rows
read back give the same outcomes as the report they were written from; `event:` conditions read the recorded
McNemar comparisons of sources.json; `folder:` scopes a block to its folder and lets a condition read another
folder; p_holm_all is Holm over comparisons and event comparisons together. The committed protocols' blocks are
tests/results/test_verdicts.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlvrlab import stats
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import render, verdict
from rlvrlab.report.table import Comparison, Equivalence, Report, adjust_family

U, P = "eval/heldout/uniformity:mean:1", "eval/heldout/pass_at_1:mean:1"
RULES = """
```verdict
question: mixed
precedence: first
rules:
  - verdict: refuted
    any:
      - {comparison: ucpo vs grpo, metric: "@U", where: ci_high < 0.02}
      - {comparison: best vs grpo, metric: "@U", where: [significant == true, equivalent == false]}
  - verdict: reproduced
    all:
      - {comparison: ucpo vs grpo, metric: "@U", where: [p_holm < 0.05, delta > 0, p_signflip <= 1]}
      - {comparison: ent_reg vs grpo, metric: "@P", where: [ci_low > -0.02, n_a == 6, paired == true]}
  - verdict: not shown
```
""".replace("@U", U).replace("@P", P)

EVENTS = [{"event": "failure: nonfinite | loss/approx_kl > 3",
           "comparisons": [{"group": "up", "baseline": "base", "test": "McNemar exact", "p": 0.0078125,
                            "holm_p": 0.015625},
                           {"group": "base", "baseline": "up", "test": "McNemar exact", "p": 1.0, "holm_p": 1.0}],
           "groups": {"up": [{"seed": s, "run_id": f"u{s}", "step": 3 if s < 8 else None,
                              "cause": "loss/approx_kl > 3" if s < 8 else ""} for s in range(10)],
                      "base": [{"seed": s, "run_id": f"b{s}", "step": None, "cause": ""} for s in range(10)]}}]


def _report() -> Report:
    rng = np.random.default_rng(5)
    grpo = rng.normal(0.5, 0.05, 6)
    arms = {"ucpo": {U: grpo + 0.01 + rng.normal(0, 0.001, 6), P: grpo + rng.normal(0, 0.002, 6)},
            "ent_reg": {U: grpo + 0.04 + rng.normal(0, 0.01, 6), P: grpo + rng.normal(0, 0.002, 6)}}
    rows = [Comparison(arm, "grpo", "train", m, stats.compare(values[m], grpo, paired=True), margin=0.02)
            for arm, values in arms.items() for m in (U, P)]
    rows.append(Comparison("ent_reg", "grpo", "train", U, rows[2].result, selected_from=2, margin=0.02))
    adjust_family(rows)
    return Report([], [], "grpo", ["train"], {"train": [U, P]}, rows, equivalence=Equivalence(0.02))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _outcome(verdicts: verdict.Verdicts) -> list[tuple[str, bool, str]]:
    return [(r.verdict, r.holds, r.detail) for q in verdicts.questions for r in q.rules]


def test_comparisons_csv_read_back_gives_the_reports_outcomes(tmp_path: Path) -> None:
    report = _report()
    protocol = _write(tmp_path / "protocol.md", RULES)
    questions = verdict.load(protocol)
    csv_path = _write(tmp_path / "study" / "comparisons.csv", render.comparisons_csv(report))
    from_report = verdict.evaluate(protocol, questions, report)
    from_csv = verdict._evaluate(protocol, questions, verdict.Records(verdict.read_comparisons(csv_path)), None, None)
    records = verdict.Records(tuple(render.comparison_record(r) for r in report.comparisons))
    from_records = verdict._evaluate(protocol, questions, records, None, None)
    assert _outcome(from_report) == _outcome(from_csv) == _outcome(from_records)
    assert [r.holds for r in from_csv.questions[0].rules] == [True, True, True]  # the selected cell is significant
    assert from_csv.questions[0].verdict == "refuted"
    assert "best vs grpo" in from_csv.questions[0].rules[0].detail
    folder = verdict.evaluate_folder(protocol, questions, tmp_path / "study")  # no sources.json: no events
    assert _outcome(folder) == _outcome(from_csv)


def test_event_conditions_folders_and_holm_over_both(tmp_path: Path) -> None:
    report = _report()
    study, control = tmp_path / "results" / "study", tmp_path / "results" / "study" / "control"
    _write(study / "comparisons.csv", render.comparisons_csv(report))
    _write(study / "sources.json", json.dumps({"events": EVENTS}))
    _write(control / "comparisons.csv", render.comparisons_csv(report))
    protocol = _write(tmp_path / "protocol.md", f"""
```verdict
question: stability
folder: results/study
precedence: first
rules:
  - verdict: refuted
    all:
      - {{comparison: up vs base, event: failure, where: [count_diff > 0, p_holm < 0.05, rate_a >= 0.8]}}
      - {{comparison: ent_reg vs grpo, metric: "{P}", folder: results/study/control, where: ci_low > -0.02}}
  - verdict: not shown
```

```verdict
question: elsewhere
folder: results/other
precedence: first
rules:
  - verdict: not shown
```
""")
    questions = verdict.load(protocol)
    assert [q.folder for q in questions] == ["results/study", "results/other"]
    outcome = verdict.evaluate_folder(protocol, questions, study, root=tmp_path)
    assert [q.title for q in outcome.questions] == ["stability"] and outcome.elsewhere == (("elsewhere",
                                                                                            "results/other"),)
    first = outcome.questions[0]
    assert first.verdict == "refuted"
    assert "up vs base · failure: count_diff = 8 > 0 ✓, p_holm = 0.01562 < 0.05 ✓, rate_a = 0.8 >= 0.8 ✓" in \
        first.rules[0].detail
    assert "(results/study/control)" in first.rules[0].detail
    assert "Not evaluated on this report, each about the results folder it names" in verdict.markdown(outcome)
    assert "evaluates it there): elsewhere (results/other)." in verdict.markdown(outcome)
    # p_holm_all: Holm over the 5 comparisons.csv rows and the 2 event comparisons as one family
    records = verdict.read_folder(study)
    family = [float(r["p_family"]) for r in records.rows] + [0.0078125, 1.0]
    leaf = verdict.Leaf("up vs base", "failure", None, (), event=True)
    assert verdict._event(leaf, records, "here")["p_holm_all"] == pytest.approx(stats.holm(family)[5])
    # a report evaluated without its folder lists folder-scoped blocks instead of failing on them
    assert verdict.evaluate(protocol, questions, report).questions == ()
    assert verdict.evaluate(protocol, questions, report, folder=study, events=EVENTS,
                            root=tmp_path).questions[0].verdict == "refuted"


@pytest.mark.parametrize("condition, fragments", [
    ("{comparison: up vs base, event: failure, where: delta > 0}", ["an event condition tests", "count_diff"]),
    ("{comparison: up vs base, event: failure, metric: x, where: p < 1}", ["metric: (a comparisons.csv column) or"]),
    ("{comparison: up vs nobody, event: failure, where: p < 1}", ["event 'failure' has no comparison 'up vs nobody'",
                                                                 "name one of: up vs base; base vs up"]),
    ("{comparison: up vs base, event: crash, where: p < 1}", ["no event 'crash' recorded", "--event \"crash: ...\""]),
    ("{comparison: ucpo vs grpo, metric: x, folder: results/none, where: p < 1}", ["results/none: no comparisons.csv"]),
])
def test_event_and_folder_mistakes_are_one_line_errors(tmp_path: Path, condition: str, fragments: list[str]) -> None:
    study = tmp_path / "results" / "study"
    _write(study / "comparisons.csv", render.comparisons_csv(_report()))
    _write(study / "sources.json", json.dumps({"events": EVENTS}))
    protocol = _write(tmp_path / "protocol.md", "```verdict\nprecedence: first\nrules:\n  - verdict: x\n    all:\n"
                      f"      - {condition}\n```\n")
    with pytest.raises(RlvrlabError) as error:
        verdict.evaluate_folder(protocol, verdict.load(protocol), study, root=tmp_path)
    message = str(error.value)
    assert "\n" not in message and all(f in message for f in fragments), message
