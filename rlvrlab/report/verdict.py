"""A protocol's verdict rules (a ```verdict block of YAML in its markdown) and their evaluation on a report's
comparisons and recorded events (`rlvrlab report --protocol FILE`). The format, its fields and its errors are
docs/report.md, "Verdict rules". `evaluate_folder` evaluates a committed folder (comparisons.csv and sources.json)
without MLflow."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Optional, Union

from rlvrlab import stats
from rlvrlab.errors import RlvrlabError
from rlvrlab.report.escape import md
from rlvrlab.report.render import comparison_record
from rlvrlab.report.table import Report

FENCE = re.compile(r"^```verdict\s*$")
PRECEDENCE = "first"  # the only precedence: the first rule (in the listed order) that holds is the verdict
NUMERIC = ("delta", "low", "high", "se", "df", "p", "p_family", "p_holm", "p_signflip", "mde", "holm_level",
           "mde_holm", "prob_improvement", "n_a", "n_b", "selected_from", "equivalence_margin", "p_equivalence",
           "p_equivalence_holm", "p_holm_all")
EVENT = ("p", "p_holm", "p_holm_all", "count_a", "count_b", "count_diff", "rate_a", "rate_b", "n_a", "n_b")
BOOLEAN = ("significant", "equivalent", "paired", "max_statistic")
ALIASES = {"ci_low": "low", "ci_high": "high"}  # the 95% interval of Δ
OPERATORS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
             ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
PREDICATE = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")
TOP_KEYS, RULE_KEYS, LEAF_KEYS = {"question", "precedence", "rules", "folder"}, {"verdict", "all", "any"}, \
    {"comparison", "metric", "event", "section", "where", "folder"}
NO_RULES = "the protocol states no machine-readable verdict rules (a ```verdict block, docs/report.md)"


@dataclass(frozen=True)
class Predicate:
    field: str  # a column of comparisons.csv (ALIASES resolved)
    name: str  # as written (ci_high for high)
    op: str
    value: Union[float, bool]
    text: str  # as written


@dataclass(frozen=True)
class Leaf:
    comparison: str
    metric: str  # the column, or for an event condition the event's name
    section: Optional[str]
    where: tuple[Predicate, ...]
    event: bool = False  # a recorded event comparison (sources.json "events"), not a comparisons.csv row
    folder: Optional[str] = None  # another folder's committed records (from the repository root)


@dataclass(frozen=True)
class Combined:
    mode: str  # "all" | "any"
    items: tuple[Union[Leaf, Combined], ...]


@dataclass(frozen=True)
class Rule:
    verdict: str
    condition: Optional[Combined]  # None: always holds


@dataclass(frozen=True)
class Question:
    title: str
    rules: tuple[Rule, ...]
    folder: Optional[str] = None  # the results folder the question is about (None: any report it is run on)


@dataclass(frozen=True)
class RuleOutcome:
    verdict: str
    holds: bool
    detail: str  # every predicate with the value it was tested on


@dataclass(frozen=True)
class QuestionOutcome:
    title: str
    rules: tuple[RuleOutcome, ...]

    @property
    def verdict(self) -> Optional[str]:
        """The first rule that holds (the stated precedence); None when none does."""
        return next((r.verdict for r in self.rules if r.holds), None)


@dataclass(frozen=True)
class Verdicts:
    protocol: str
    questions: tuple[QuestionOutcome, ...]  # () when the protocol states no rules
    elsewhere: tuple[tuple[str, str], ...] = ()  # (title, folder) of the questions about other folders


@dataclass(frozen=True)
class Records:
    """What conditions are tested on: comparisons.csv rows as values, and the recorded event comparisons."""
    rows: tuple[dict, ...]
    events: tuple[dict, ...] = ()  # sources.json "events" (events.as_dict)
    name: str = "this report"
    holm_all: dict = dataclass_field(default_factory=dict, compare=False)  # (kind, index) -> Holm p over both


# ------------------------------------------------------------------------------------------------------ parsing
def load(path: Path) -> tuple[Question, ...]:
    """Every ```verdict block of the protocol, parsed and checked (not yet against a report)."""
    text = Path(path).read_text()
    blocks: list[str] = []
    current: Optional[list[str]] = None
    for line in text.splitlines():
        if current is None and FENCE.match(line):
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        raise RlvrlabError(f"--protocol {path}: a ```verdict block is not closed; end it with a line ```")
    return tuple(_question(block, f"--protocol {path}", index, len(blocks)) for index, block in enumerate(blocks))


def _question(block: str, where: str, index: int, count: int) -> Question:
    import yaml

    where = f"{where}, verdict block {index + 1}" if count > 1 else f"{where}, verdict block"
    try:
        spec = yaml.safe_load(block)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" (line {mark.line + 1} of the block)" if mark is not None else ""
        raise RlvrlabError(f"{where}: not valid YAML{at}; write precedence: first and rules: [...] "
                           "(docs/report.md, \"Verdict rules\")") from None
    if not isinstance(spec, dict):
        raise RlvrlabError(f"{where}: write a mapping with precedence: first and rules: [...]")
    unknown = sorted(set(map(str, spec)) - TOP_KEYS)
    if unknown:
        raise RlvrlabError(f"{where}: unknown key {unknown[0]!r}; a block has {', '.join(sorted(TOP_KEYS))}")
    if spec.get("precedence") != PRECEDENCE:
        raise RlvrlabError(f"{where}: state the precedence with precedence: {PRECEDENCE} (the first rule that "
                           "holds, in the listed order, is the verdict)")
    rules = spec.get("rules")
    if not isinstance(rules, list) or not rules:
        raise RlvrlabError(f"{where}: rules: must list the rules in order of precedence, each with verdict: NAME")
    title = str(spec.get("question") or (f"verdict {index + 1}" if count > 1 else "verdict"))
    folder = spec.get("folder")
    return Question(title, tuple(_rule(rule, where, number) for number, rule in enumerate(rules, 1)),
                    None if folder is None else str(folder).strip().rstrip("/"))


def _rule(rule: object, where: str, number: int) -> Rule:
    name = rule.get("verdict") if isinstance(rule, dict) else None
    here = f"{where}, rule {number}" + (f" ({name!r})" if isinstance(name, str) else "")
    if not isinstance(rule, dict) or not isinstance(name, str) or not name.strip():
        raise RlvrlabError(f"{here}: give each rule a name, verdict: NAME (e.g. reproduced, negligible, refuted, "
                           "not shown), and all: or any: conditions (none: it always holds)")
    unknown = sorted(set(map(str, rule)) - RULE_KEYS)
    if unknown:
        raise RlvrlabError(f"{here}: unknown key {unknown[0]!r}; a rule has verdict, and all or any")
    if "all" in rule and "any" in rule:
        raise RlvrlabError(f"{here}: give all: or any:, not both (nest one in the other)")
    mode = "all" if "all" in rule else "any" if "any" in rule else None
    return Rule(name.strip(), None if mode is None else _combined(mode, rule[mode], here))


def _combined(mode: str, items: object, here: str) -> Combined:
    if not isinstance(items, list) or not items:
        raise RlvrlabError(f"{here}: {mode}: must list conditions, each {{comparison: A vs B, metric: M, "
                           "where: FIELD OP VALUE}} or a nested all:/any:")
    return Combined(mode, tuple(_condition(item, here) for item in items))


def _condition(item: object, here: str) -> Union[Leaf, Combined]:
    if isinstance(item, dict) and len(item) == 1 and next(iter(item)) in ("all", "any"):
        mode = next(iter(item))
        return _combined(mode, item[mode], here)
    if not isinstance(item, dict):
        raise RlvrlabError(f"{here}: a condition is a mapping {{comparison: A vs B, metric: M, where: FIELD OP "
                           f"VALUE}}, got {item!r}")
    unknown = sorted(set(map(str, item)) - LEAF_KEYS)
    if unknown:
        raise RlvrlabError(f"{here}: unknown key {unknown[0]!r} in a condition; a condition has comparison, metric, "
                           "where (and section where the column is in several)")
    if item.get("metric") and item.get("event"):
        raise RlvrlabError(f"{here}: give metric: (a comparisons.csv column) or event: (a recorded event), not both")
    missing = [k for k in ("comparison", "metric", "where") if not item.get(k) and not (k == "metric" and
                                                                                      item.get("event"))]
    if missing:
        raise RlvrlabError(f"{here}: a condition needs {missing[0]}: (comparison: A vs B, metric: M, where: "
                           "FIELD OP VALUE)")
    where = item["where"] if isinstance(item["where"], list) else [item["where"]]
    section, folder, event = item.get("section"), item.get("folder"), bool(item.get("event"))
    return Leaf(str(item["comparison"]).strip(), str(item["event" if event else "metric"]).strip(),
                None if section is None else str(section), tuple(_predicate(str(w), here, event) for w in where),
                event, None if folder is None else str(folder).strip().rstrip("/"))


def _predicate(text: str, here: str, event: bool = False) -> Predicate:
    match = PREDICATE.match(text)
    if event and (match is None or match.group(1) not in EVENT):
        raise RlvrlabError(f"{here}: {text!r}: an event condition tests FIELD OP VALUE with FIELD one of "
                           f"{', '.join(EVENT)}, e.g. count_diff <= 0")
    if match is None:
        raise RlvrlabError(f"{here}: {text!r} is not FIELD OP VALUE (OP one of < <= > >= == !=), e.g. "
                           "p_holm < 0.05")
    name, op, value = match.groups()
    field = name if event else ALIASES.get(name, name)
    if field in BOOLEAN and not event:
        if value not in ("true", "false") or op not in ("==", "!="):
            raise RlvrlabError(f"{here}: {text!r}: {name} is true or false; write {name} == true")
        return Predicate(field, name, op, value == "true", text.strip())
    if field not in NUMERIC and not event:
        raise RlvrlabError(f"{here}: {text!r}: unknown field {name!r}; the fields are "
                           f"{', '.join((*NUMERIC, *ALIASES, *BOOLEAN))}")
    try:
        return Predicate(field, name, op, float(value), text.strip())
    except ValueError:
        raise RlvrlabError(f"{here}: {text!r}: {value!r} is not a number") from None


# --------------------------------------------------------------------------------------------------- evaluation
def evaluate(protocol: Path, questions: tuple[Question, ...], report: Report, *, folder: Optional[Path] = None,
             events: Sequence[dict] = (), root: Optional[Path] = None) -> Verdicts:
    """Every rule of every block on the report's comparisons (and its events, in sources.json's form); one-line
    errors for a comparison, column or field the report does not have. `folder`: where the report is written; a
    block that names another folder (or any folder, when `folder` is not given) is listed, not evaluated."""
    rows = tuple(comparison_record(r) for r in report.comparisons)
    return _evaluate(protocol, questions, Records(rows, tuple(events)), folder, root)


def evaluate_folder(protocol: Path, questions: tuple[Question, ...], folder: Path,
                    root: Optional[Path] = None) -> Verdicts:
    """The blocks about a committed results folder, from its comparisons.csv and sources.json alone (no MLflow)."""
    return _evaluate(protocol, questions, read_folder(Path(folder)), Path(folder), root)


def read_comparisons(path: Path) -> tuple[dict, ...]:
    """comparisons.csv as comparison_record's values: numbers as floats, booleans as bools, empty cells as ""."""
    with open(path, newline="") as handle:
        return tuple({k: _value(k, v) for k, v in row.items()} for row in csv.DictReader(handle))


def read_folder(folder: Path) -> Records:
    """A results folder's records: comparisons.csv and the event comparisons of sources.json."""
    if not (folder / "comparisons.csv").is_file():
        raise RlvrlabError(f"{folder}: no comparisons.csv; name a folder written by rlvrlab report")
    sidecar = folder / "sources.json"
    events = json.loads(sidecar.read_text()).get("events") or () if sidecar.is_file() else ()
    return Records(read_comparisons(folder / "comparisons.csv"), tuple(events), str(folder))


def _value(key: str, text: str) -> object:
    if text == "" or key not in (*NUMERIC, *BOOLEAN):
        return text
    if key in BOOLEAN:
        return text == "True"
    return float(text)


def _evaluate(protocol: Path, questions: tuple[Question, ...], records: Records, folder: Optional[Path],
              root: Optional[Path]) -> Verdicts:
    base = Path.cwd() if root is None else Path(root)
    cache: dict[str, Records] = {}

    def source(leaf: Leaf) -> Records:
        if leaf.folder is None:
            return records
        if leaf.folder not in cache:
            cache[leaf.folder] = read_folder(base / leaf.folder)
        return cache[leaf.folder]

    outcomes, elsewhere = [], []
    for question in questions:
        if question.folder is not None and (folder is None or
                                            (base / question.folder).resolve() != Path(folder).resolve()):
            elsewhere.append((question.title, question.folder))
            continue
        rules = []
        for number, rule in enumerate(question.rules, 1):
            here = f"--protocol {protocol}, rule {number} ({rule.verdict!r})"
            if rule.condition is None:
                rules.append(RuleOutcome(rule.verdict, True, "always (no condition)"))
                continue
            holds, detail = _holds(rule.condition, source, here)
            rules.append(RuleOutcome(rule.verdict, holds, detail))
        outcomes.append(QuestionOutcome(question.title, tuple(rules)))
    return Verdicts(str(protocol), tuple(outcomes), tuple(elsewhere))


def _holds(condition: Union[Leaf, Combined], source, here: str) -> tuple[bool, str]:
    if isinstance(condition, Combined):
        parts = [_holds(item, source, here) for item in condition.items]
        holds = all(h for h, _ in parts) if condition.mode == "all" else any(h for h, _ in parts)
        inner = "; ".join(d for _, d in parts)
        return holds, inner if len(parts) == 1 else f"{condition.mode} of ({inner})"
    records = source(condition)
    record = _event(condition, records, here) if condition.event else _row(condition, records, here)
    shown = []
    holds = True
    for predicate in condition.where:
        value = record.get(predicate.field, "")
        if value == "" or value is None:
            fix = "run the report with --equivalence MARGIN" if "equivalen" in predicate.field else \
                "it is empty for this comparison (the sign-flip p: paired comparisons only)"
            raise RlvrlabError(f"{here}: {predicate.text!r}: {condition.comparison} on {condition.metric} has no "
                               f"{predicate.field}; {fix}")
        ok = bool(OPERATORS[predicate.op](value, predicate.value))
        holds = holds and ok
        text = str(value).lower() if isinstance(value, bool) else ("nan" if math.isnan(float(value))
                                                                    else f"{float(value):.4g}")
        shown.append(f"{predicate.name} = {text} {predicate.op} {_target(predicate.value)} {'✓' if ok else '✗'}")
    where = f" ({condition.folder})" if condition.folder else ""
    return holds, f"{condition.comparison} · {condition.metric}{where}: {', '.join(shown)}"


def _target(value: Union[float, bool]) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:g}"


def _names(record: dict) -> set[str]:
    """What a condition may call a row: `A vs B`, or for a selected cell its full name and `best vs B`."""
    a, b, selected = record["a"], record["b"], record.get("selected_from") or ""
    if selected == "":
        return {f"{a} vs {b}"}
    return {f"{a} vs {b} (selected: best of {int(float(selected))})", f"best vs {b}"}


def _holm_all(records: Records) -> dict:
    """Holm (1979) over every comparison the records hold: each row's p entering Holm (p_family) and each event
    comparison's exact p, as one family (stats.holm)."""
    if not records.holm_all:
        keys: list[tuple] = [("row", i) for i in range(len(records.rows))]
        ps = [float(r["p_family"] if r.get("p_family", "") != "" else r["p"]) for r in records.rows]
        for e, event in enumerate(records.events):
            keys += [("event", e, c) for c in range(len(event.get("comparisons", ())))]
            ps += [float(c["p"]) for c in event.get("comparisons", ())]
        records.holm_all.update(zip(keys, stats.holm(ps)) if ps else ())
    return records.holm_all


def _row(leaf: Leaf, records: Records, here: str) -> dict:
    named = [(i, r) for i, r in enumerate(records.rows) if leaf.comparison in _names(r)]
    if not named:
        known = sorted({f"{r['a']} vs {r['b']}" for r in records.rows})
        shown = "; ".join(known[:6]) + ("; ..." if len(known) > 6 else "")
        a, _, b = leaf.comparison.partition(" vs ")
        raise RlvrlabError(f"{here}: no comparison {leaf.comparison!r} in {records.name}; add it with --compare "
                           f"\"{a}:{b}\" or name one of: {shown}")
    found = [(i, r) for i, r in named if r["metric"] == leaf.metric and leaf.section in (None, r["section"])]
    if not found:
        columns = sorted({r["metric"] for _, r in named})
        raise RlvrlabError(f"{here}: {leaf.comparison!r} is not tested on {leaf.metric!r}"
                           + (f" in section {leaf.section!r}" if leaf.section else "")
                           + f" in {records.name}; its columns: {', '.join(columns)}")
    sections = sorted({r["section"] for _, r in found})
    if len(sections) > 1:
        raise RlvrlabError(f"{here}: {leaf.metric!r} of {leaf.comparison!r} is in sections {', '.join(sections)}; "
                           "name one with section: NAME")
    index, record = found[0]  # the same test where a pair is asked twice (baseline and --compare): the same numbers
    return {**record, "p_holm_all": _holm_all(records)[("row", index)]}


def _event(leaf: Leaf, records: Records, here: str) -> dict:
    """The recorded event comparison `A vs B` (events.as_dict: McNemar exact on paired seeds) and its counts."""
    named = [(e, event) for e, event in enumerate(records.events)
             if event["event"].partition(":")[0].strip() == leaf.metric]
    if not named:
        known = ", ".join(sorted({e["event"].partition(":")[0].strip() for e in records.events})) or "none"
        raise RlvrlabError(f"{here}: no event {leaf.metric!r} recorded in {records.name} (recorded: {known}); run "
                           f"the report with --event \"{leaf.metric}: ...\"")
    e, event = named[0]
    a, _, b = leaf.comparison.partition(" vs ")
    found = [c for c, comparison in enumerate(event["comparisons"])
             if (comparison["group"], comparison["baseline"]) == (a, b)]
    if not found:
        known = "; ".join(f"{c['group']} vs {c['baseline']}" for c in event["comparisons"])
        raise RlvrlabError(f"{here}: event {leaf.metric!r} has no comparison {leaf.comparison!r} in {records.name}; "
                           f"name one of: {known}")
    comparison = event["comparisons"][found[0]]
    runs_a, runs_b = event["groups"][a], event["groups"][b]
    count_a, count_b = (sum(run["step"] is not None or bool(run["cause"]) for run in runs) for runs in (runs_a, runs_b))
    return {"p": float(comparison["p"]), "p_holm": float(comparison["holm_p"]),
            "p_holm_all": _holm_all(records)[("event", e, found[0])], "count_a": float(count_a),
            "count_b": float(count_b), "count_diff": float(count_a - count_b), "rate_a": count_a / len(runs_a),
            "rate_b": count_b / len(runs_b), "n_a": float(len(runs_a)), "n_b": float(len(runs_b))}


# ------------------------------------------------------------------------------------------------------ output
def markdown(verdicts: Verdicts) -> str:
    """The "Verdict (protocol rules)" section of table.md."""
    out = ["### Verdict (protocol rules)", ""]
    if not verdicts.questions and not verdicts.elsewhere:
        return "\n".join([*out, NO_RULES, ""]) + "\n"
    if not verdicts.questions:
        return "\n".join([*out, md(_elsewhere(verdicts)), ""]) + "\n"
    out.append(f"From `{verdicts.protocol}`; the rules in its order of precedence, the first that holds is the "
               "verdict.")
    out.append("")
    for question in verdicts.questions:
        out.append(f"**{md(question.title)}: {md(question.verdict or 'none of the rules holds')}**"
                   + md(_also(question)))
        out.append("")
        out.append("| rule | holds | conditions |")
        out.append("|---|---|---|")
        out += [f"| {md(r.verdict)} | {'yes' if r.holds else 'no'} | {md(r.detail)} |" for r in question.rules]
        out.append("")
    if verdicts.elsewhere:
        out += [md(_elsewhere(verdicts)), ""]
    return "\n".join(out) + "\n"


def _elsewhere(verdicts: Verdicts) -> str:
    listed = "; ".join(f"{title} ({folder})" for title, folder in verdicts.elsewhere)
    return (f"Not evaluated on this report, each about the results folder it names (rlvrlab.report.verdict."
            f"evaluate_folder evaluates it there): {listed}.")


def _also(question: QuestionOutcome) -> str:
    holding = [r.verdict for r in question.rules if r.holds][1:]
    return f" (also holds, lower in precedence: {', '.join(holding)})" if holding else ""


def lines(verdicts: Verdicts) -> list[str]:
    """What the CLI prints: each rule, then the verdict, per block."""
    if not verdicts.questions and not verdicts.elsewhere:
        return [NO_RULES]
    out = [_elsewhere(verdicts)] if verdicts.elsewhere else []
    for question in verdicts.questions:
        out += [f"  {r.verdict}: {'holds' if r.holds else 'does not hold'} — {r.detail}" for r in question.rules]
        verdict = question.verdict or "none of the rules holds"
        out.append(f"{question.title} (protocol rules, the first that holds): {verdict}{_also(question)}")
    return out
