"""Every pre-registered protocol in results/protocols/ carries machine-read verdict rules (issue 45, item 5), and
they give, on the committed folders (comparisons.csv and sources.json, no MLflow), the verdict results/README.md
states for each claim. README is not parsed as prose: EXPECTED holds, per (protocol, question), the verdict and the
words README states it with, and the test checks those words are in README's section of that study, so an edit of
README that changes a verdict (or of a block that changes its evaluation) breaks the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvrlab.report import verdict

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = sorted((ROOT / "results" / "protocols").glob("*.md"))
README = (ROOT / "results" / "README.md").read_text()

# (protocol file, question) -> (the verdict, fragments that README's section of the study states it with, all in one
# paragraph, bullet or table row)
EXPECTED = {
    ("ucpo_pairs.md", "UCPO at the paper's tau 0.2 against GRPO"):
        ("refuted", ("**UCPO at the paper's tau 0.2: refuted",)),
    ("ucpo_pairs.md", "UCPO at tau 1 against GRPO"): ("reproduced", ("**UCPO at tau 1: reproduced.**",)),
    ("ucpo_pairs.md", "The objective reading (ucpo_objective) against GRPO"):
        ("refuted", ("**The objective reading (`ucpo_objective`): refuted.**",)),
    ("up_pairs.md", "UP-DAPO stable under stale rollouts (blocks A and B)"):
        ("not shown", ("Verdict, in the protocol's terms", "**not shown (uninformative by the protocol's rule)**")),
    ("up_pairs_replication.md", "Block A (gradient clipping on)"): ("reproduced", ("**block A: reproduced**",)),
    ("up_pairs_replication.md", "Block B (no gradient clipping)"): ("not shown", ("**Block B: not shown**",)),
    ("up_dual_clip.md", "Block A (gradient clipping on)"): ("not shown", ("**Block A: not shown.**",)),
    ("up_dual_clip.md", "Block B (no gradient clipping)"): ("reproduced", ("**Block B: reproduced.**",)),
    ("up_dual_clip.md", "The earlier block B contrast against the one-change baseline"):
        ("not shown", ("earlier block B contrast", "not shown against the one-change baseline.**")),
    ("tiny_algorithms.md", "UCPO against GRPO"): ("not shown", ("| ucpo − grpo |", "| **not shown** |")),
    ("tiny_algorithms.md", "UP-DAPO against dapo_dual_clip"):
        ("not shown", ("| up_dapo − dapo_dual_clip |", "| **not shown** |")),
    ("tiny_algorithms.md", "UP-GRPO against grpo_seq_mean"):
        ("not shown", ("| up_grpo − grpo_seq_mean |", "| **not shown** |")),
    ("tiny_tau_eps_staleness_grid.md", "tau (tau 1 against tau 0 in each eps_high, staleness cell)"):
        ("not shown", ("**tau: not shown.**", "non-inferior at the margin −0.02 in two cells, (0.2, 0) and (∞, 2)")),
    ("tiny_tau_eps_staleness_grid.md", "eps_high (eps_high inf against 0.2 at staleness 2)"):
        ("not shown", ("**eps_high: not shown.**",)),
    ("tiny_up_stability.md", "UP-DAPO under stale rollouts on the tiny tier"):
        ("not shown", ("Verdict, in the protocol's terms: **not shown**",)),
}


def _questions(path: Path) -> tuple[verdict.Question, ...]:
    return verdict.load(path)


def _leaves(condition) -> list[verdict.Leaf]:
    if condition is None:
        return []
    if isinstance(condition, verdict.Leaf):
        return [condition]
    return [leaf for item in condition.items for leaf in _leaves(item)]


def _governed(protocol: Path) -> set[str]:
    """The folders whose sources.json names this protocol (results/*/ and results/*/*/)."""
    out = set()
    for sidecar in [*(ROOT / "results").glob("*/sources.json"), *(ROOT / "results").glob("*/*/sources.json")]:
        record = json.loads(sidecar.read_text()).get("protocol") or {}
        path = record.get("path") if isinstance(record, dict) else record
        if path and Path(path).name == protocol.name:
            out.add(sidecar.parent.relative_to(ROOT).as_posix())
    return out


def _chunks(study: str) -> list[str]:
    """README's section of a study (from its heading, which names `results/STUDY/`, to the next heading) as its
    paragraphs, bullets and table rows, each with its line breaks made spaces."""
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and f"`{study}/`" in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "### "))), len(lines))
    chunks: list[list[str]] = [[]]
    for line in lines[start:end]:
        if not line.strip() or line.startswith(("|", "- ")) or (chunks[-1] and chunks[-1][0].startswith("|")):
            chunks.append([])
        chunks[-1].append(line.strip())
    return [" ".join(chunk) for chunk in chunks if chunk]


def test_every_protocol_is_covered() -> None:
    assert len(PROTOCOLS) >= 7
    assert {name for name, _ in EXPECTED} == {p.name for p in PROTOCOLS}


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.stem)
def test_each_block_names_what_its_folder_records(protocol: Path) -> None:
    questions = _questions(protocol)
    assert questions, f"{protocol.name} has no ```verdict block"
    text = protocol.read_text()
    appendix = text.index("## Appendix (2026-12-07): machine-read verdict rules")
    assert text.index("```verdict") > appendix  # the blocks are in the dated appendix, after the prose
    governed = _governed(protocol)
    for question in questions:
        assert question.folder in governed, (question.title, question.folder, governed)
        for rule in question.rules:
            for leaf in _leaves(rule.condition):
                folder = leaf.folder or question.folder
                assert folder in governed, (question.title, folder)
                records = verdict.read_folder(ROOT / folder)
                a, _, b = leaf.comparison.partition(" vs ")
                if leaf.event:
                    named = [c for e in records.events if e["event"].partition(":")[0].strip() == leaf.metric
                             for c in e["comparisons"] if (c["group"], c["baseline"]) == (a, b)]
                else:
                    named = [r for r in records.rows if (r["a"], r["b"], r["metric"]) == (a, b, leaf.metric)
                             and leaf.section in (None, r["section"])]
                assert named, (protocol.name, question.title, folder, leaf.comparison, leaf.metric)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.stem)
def test_the_blocks_give_the_verdicts_readme_states(protocol: Path) -> None:
    questions = _questions(protocol)
    for folder in sorted({q.folder for q in questions}):
        verdicts = verdict.evaluate_folder(protocol, questions, ROOT / folder, root=ROOT)
        assert verdicts.questions and all(t[1] != folder for t in verdicts.elsewhere)
        for outcome in verdicts.questions:
            expected, words = EXPECTED[(protocol.name, outcome.title)]
            chunks = _chunks("results/" + folder.split("/")[1])
            assert any(all(w in chunk for w in words) for chunk in chunks), (folder, words)
            assert outcome.verdict == expected, (protocol.name, outcome.title, verdict.lines(verdicts))
