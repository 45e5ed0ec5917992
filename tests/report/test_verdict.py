"""A protocol's verdict rules (issue 37, item 3): the ```verdict block's format, its precedence (the first rule
that holds is the verdict, however many hold), and one-line errors that name the rule and the fix. The report is
built from seeded per-seed values with the report's own comparison and Holm family (table.adjust_family); the
end-to-end run on a toy sweep is tests/report/test_report.py::test_report_evaluates_a_protocols_verdict_rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlvrlab import stats
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import verdict
from rlvrlab.report.table import Comparison, Equivalence, Report, adjust_family

UNIFORMITY, PASS1 = "eval/heldout/uniformity:mean:1", "eval/heldout/pass_at_1:mean:1"

# UCPO's case in results/README (issue 37, item 3): a small gain, Holm-significant, whose interval tops out below the
# negligible-effect bound 0.02; it meets both "reproduced" and "negligible", and the rule written for it leads.
RULES = """\
# Verdicts

In order of precedence; the block below is what `rlvrlab report --protocol` evaluates.

```verdict
question: UCPO tau=0.2 on pairs
precedence: first
rules:
  - verdict: negligible
    all:
      - {comparison: ucpo vs grpo, metric: "@U", where: ci_high < 0.02}
  - verdict: reproduced
    all:
      - {comparison: ucpo vs grpo, metric: "@U", where: [p_holm < 0.05, delta > 0]}
      - {comparison: ucpo vs grpo, metric: "@P", where: ci_low > -0.02}
  - verdict: refuted
    any:
      - {comparison: ucpo vs grpo, metric: "@U", where: [p_holm < 0.05, delta < 0]}
      - {comparison: ucpo vs grpo, metric: "@P", where: ci_high < -0.02}
  - verdict: not shown
```
""".replace("@U", UNIFORMITY).replace("@P", PASS1)


def _report(equivalence: bool = False) -> Report:
    """ucpo and ent_reg vs grpo on 6 paired seeds: ucpo's uniformity +0.010 (sd 0.001 per seed), pass@1 +0.001;
    ent_reg's uniformity -0.05; and the best of the two against grpo (selected)."""
    rng = np.random.default_rng(3)
    shared = rng.normal(0.5, 0.05, 6)
    grpo = shared + rng.normal(0, 0.001, 6)
    arms = {"ucpo": {UNIFORMITY: grpo + 0.010 + rng.normal(0, 0.001, 6), PASS1: grpo + 0.001 + rng.normal(0, 0.002, 6)},
            "ent_reg": {UNIFORMITY: grpo - 0.05 + rng.normal(0, 0.001, 6), PASS1: grpo + rng.normal(0, 0.002, 6)}}
    margin = 0.02 if equivalence else None
    rows = [Comparison(arm, "grpo", "train", metric, stats.compare(values[metric], grpo, paired=True), margin=margin)
            for arm, values in arms.items() for metric in (UNIFORMITY, PASS1)]
    rows.append(Comparison("ucpo", "grpo", "train", UNIFORMITY, rows[0].result, selected_from=2, margin=margin))
    adjust_family(rows)
    return Report([], [], "grpo", ["train"], {"train": [UNIFORMITY, PASS1]}, rows,
                  equivalence=Equivalence(0.02) if equivalence else None)


def _protocol(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "protocol.md"
    path.write_text(text)
    return path


def _verdicts(tmp_path: Path, text: str, report: Report | None = None) -> verdict.Verdicts:
    path = _protocol(tmp_path, text)
    return verdict.evaluate(path, verdict.load(path), report or _report())


def test_the_first_rule_that_holds_is_the_verdict(tmp_path: Path) -> None:
    """Both "negligible" and "reproduced" hold; the first listed is the verdict, the table says the other holds too;
    listed the other way round the verdict is "reproduced"."""
    report = _report()
    ucpo = next(r for r in report.comparisons if r.a == "ucpo" and r.metric == UNIFORMITY)
    assert ucpo.p_holm < 0.05 and 0 < ucpo.result.delta and ucpo.result.high < 0.02  # the case the rules are for
    outcome = _verdicts(tmp_path, RULES, report).questions[0]
    assert [(r.verdict, r.holds) for r in outcome.rules] == [("negligible", True), ("reproduced", True),
                                                             ("refuted", False), ("not shown", True)]
    assert outcome.verdict == "negligible" and outcome.title == "UCPO tau=0.2 on pairs"
    detail = outcome.rules[1].detail
    assert detail.startswith("all of (ucpo vs grpo · eval/heldout/uniformity:mean:1: p_holm = ")
    assert "delta = 0.009641 > 0 ✓" in detail and "pass_at_1:mean:1: ci_low = 0.000173 > -0.02 ✓)" in detail
    swapped = RULES.replace("  - verdict: negligible\n    all:\n      - {comparison: ucpo vs grpo, metric: "
                            f"\"{UNIFORMITY}\", where: ci_high < 0.02}}\n", "")
    swapped = swapped.replace("  - verdict: not shown", "  - verdict: negligible\n    all:\n      - {comparison: "
                              f"ucpo vs grpo, metric: \"{UNIFORMITY}\", where: ci_high < 0.02}}\n  - verdict: not shown")
    again = _verdicts(tmp_path, swapped, report).questions[0]
    assert [r.verdict for r in again.rules] == ["reproduced", "refuted", "negligible", "not shown"]
    assert again.verdict == "reproduced"
    md = verdict.markdown(_verdicts(tmp_path, RULES, report))
    assert md.startswith("### Verdict (protocol rules)\n")
    assert "**UCPO tau=0.2 on pairs: negligible** (also holds, lower in precedence: reproduced, not shown)" in md
    assert "| negligible | yes | ucpo vs grpo · eval/heldout/uniformity:mean:1: ci_high = 0.01" in md
    printed = verdict.lines(_verdicts(tmp_path, RULES, report))
    assert printed[-1].startswith("UCPO tau=0.2 on pairs (protocol rules, the first that holds): negligible")
    assert printed[2].startswith("  refuted: does not hold — any of (")


def test_nested_conditions_booleans_selected_cells_and_equivalence(tmp_path: Path) -> None:
    text = """```verdict
precedence: first
rules:
  - verdict: equivalent
    all:
      - {comparison: ucpo vs grpo, metric: "@P", where: [p_equivalence_holm < 0.05, equivalent == true]}
      - any:
          - {comparison: best vs grpo, metric: "@U", where: significant == true}
          - {comparison: ent_reg vs grpo, metric: "@U", where: delta > 0}
  - verdict: refuted
    all:
      - {comparison: ent_reg vs grpo, metric: "@U", section: train, where: [delta < 0, paired != false]}
```
""".replace("@U", UNIFORMITY).replace("@P", PASS1)
    with pytest.raises(RlvrlabError, match=r"rule 1 \('equivalent'\).*has no p_equivalence_holm; run the report with "
                                           r"--equivalence MARGIN"):
        _verdicts(tmp_path, text)
    outcome = _verdicts(tmp_path, text, _report(equivalence=True)).questions[0]
    assert [(r.verdict, r.holds) for r in outcome.rules] == [("equivalent", True), ("refuted", True)]
    assert "any of (best vs grpo" in outcome.rules[0].detail and outcome.verdict == "equivalent"
    # no rule holds: said so
    lone = _verdicts(tmp_path, "```verdict\nprecedence: first\nrules:\n  - verdict: refuted\n    all:\n      - "
                     f"{{comparison: ent_reg vs grpo, metric: \"{UNIFORMITY}\", where: delta > 0}}\n```\n")
    assert lone.questions[0].verdict is None
    assert "**verdict: none of the rules holds**" in verdict.markdown(lone)


def test_a_protocol_without_rules_says_so(tmp_path: Path) -> None:
    outcome = _verdicts(tmp_path, "# a protocol\n\n```yaml\nrules: []\n```\n")
    assert outcome.questions == ()
    assert verdict.markdown(outcome) == ("### Verdict (protocol rules)\n\nthe protocol states no machine-readable "
                                         "verdict rules (a ```verdict block, docs/report.md)\n\n")
    assert verdict.lines(outcome) == [verdict.NO_RULES]


BASE = "```verdict\nprecedence: first\nrules:\n  - verdict: reproduced\n    all:\n      - @LEAF\n```\n"
LEAF = "{comparison: ucpo vs grpo, metric: \"" + UNIFORMITY + "\", where: p_holm < 0.05}"


def _block(leaf: str = LEAF, base: str = BASE) -> str:
    return base.replace("@LEAF", leaf)


@pytest.mark.parametrize("text,fragments", [
    (_block(LEAF.replace("where", "wher")), ["rule 1 ('reproduced')", "unknown key 'wher'", "comparison, metric, where"]),
    (_block(LEAF.replace("p_holm", "p_hlom")), ["rule 1 ('reproduced')", "unknown field 'p_hlom'", "p_holm"]),
    (_block(LEAF.replace("< 0.05", "< small")), ["rule 1 ('reproduced')", "'small' is not a number"]),
    (_block(LEAF.replace("p_holm < 0.05", "p_holm")), ["rule 1 ('reproduced')", "is not FIELD OP VALUE"]),
    (_block(LEAF.replace("ucpo vs grpo", "ucpo vs dapo")), ["rule 1 ('reproduced')", "no comparison 'ucpo vs dapo'",
                                                          "--compare \"ucpo:dapo\"", "ucpo vs grpo"]),
    (_block(LEAF.replace(UNIFORMITY, "train/reward")), ["rule 1 ('reproduced')", "is not tested on 'train/reward'",
                                                       UNIFORMITY]),
    (_block(LEAF.replace("p_holm < 0.05", "significant < 1")), ["significant == true"]),
    (_block(LEAF, BASE.replace("verdict: reproduced", "verdict: reproduced\n    when: 1")),
     ["rule 1 ('reproduced')", "unknown key 'when'", "verdict, and all or any"]),
    (_block(LEAF, BASE.replace("precedence: first\n", "")), ["verdict block", "precedence: first"]),
    (_block(LEAF, BASE.replace("precedence: first", "precedence: last")), ["precedence: first"]),
    (_block(LEAF, BASE.replace("  - verdict: reproduced\n", "  - name: reproduced\n")), ["rule 1", "verdict: NAME"]),
    (_block(LEAF, BASE.replace("rules:", "rule:")), ["unknown key 'rule'"]),
    (_block()[:-4], ["is not closed"]),
    (_block("[unclosed"), ["not valid YAML"]),
])
def test_a_bad_rule_is_a_one_line_error_naming_it_and_the_fix(tmp_path: Path, text: str, fragments: list[str]) -> None:
    with pytest.raises(RlvrlabError) as caught:
        _verdicts(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--protocol {tmp_path / 'protocol.md'}")
    for fragment in fragments:
        assert fragment in message, message
