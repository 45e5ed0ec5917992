"""Events in training curves (`rlvrlab report --event`): did a run fail, when did it reach a threshold? The grammar
(`failure: eval/heldout/reward < 0.5*initial for 5 | loss/approx_kl > 1.0 | nonfinite`) and the statistics are
docs/report.md, "Events: failures and thresholds".

Per run: the event's step, or none (censored at its last logged step). Per group: the count and rate with an exact
Clopper-Pearson interval, and the median step. Each group vs the baseline: McNemar's exact test on paired seeds,
else Fisher's exact test; Holm over every event comparison of the report. FAILED runs count."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy import stats as sps

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.collect import Group, metric_series
from rlvrlab.report.escape import code, md
from rlvrlab.stats import holm
from rlvrlab.tracking import tags as T

_CONDITION = re.compile(r"^\s*(?P<metric>[\w./@-]+)\s*(?P<op><=|>=|<|>)\s*(?P<value>[-+0-9.eE]+)"
                        r"(?P<initial>\s*\*\s*initial)?(?:\s+for\s+(?P<k>\d+))?\s*$")
_OPS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
NONFINITE = "nonfinite"


@dataclass(frozen=True)
class Condition:
    metric: str  # "" for nonfinite
    op: str = ""
    value: float = 0.0
    relative: bool = False  # value times the run's first logged value
    k: int = 1

    @property
    def text(self) -> str:
        if not self.metric:
            return NONFINITE
        value = f"{self.value:g}*initial" if self.relative else f"{self.value:g}"
        return f"{self.metric} {self.op} {value}" + (f" for {self.k}" if self.k > 1 else "")


@dataclass(frozen=True)
class Event:
    name: str
    conditions: tuple[Condition, ...]

    @property
    def text(self) -> str:
        return f"{self.name}: " + " | ".join(c.text for c in self.conditions)


def parse_event(text: str) -> Event:
    """`NAME: CONDITION | CONDITION ...` (module docstring); one-line RlvrlabError when it does not parse."""
    name, sep, body = text.partition(":")
    if not sep or not name.strip() or not re.fullmatch(r"[\w-]+", name.strip()):
        raise RlvrlabError(f"--event {text!r}: write NAME: CONDITION | ..., e.g. "
                           "'failure: eval/heldout/reward < 0.5*initial for 5 | nonfinite'")
    conditions = []
    for part in body.split("|"):
        if part.strip() == NONFINITE:
            conditions.append(Condition(""))
            continue
        m = _CONDITION.match(part)
        if m is None or not math.isfinite(float(m["value"])) or (m["k"] is not None and int(m["k"]) < 1):
            raise RlvrlabError(f"--event {text!r}: condition {part.strip()!r} is not METRIC OP VALUE [for K] "
                               "(OP < <= > >=, VALUE a number or F*initial, K >= 1) or nonfinite")
        conditions.append(Condition(m["metric"], m["op"], float(m["value"]), bool(m["initial"]), int(m["k"] or 1)))
    return Event(name.strip(), tuple(conditions))


def first_stretch(steps: Sequence[int], values: Sequence[float], condition: Condition) -> Optional[int]:
    """The first step of the first run of `condition.k` consecutive logged values that meet the condition."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return None
    threshold = condition.value * v[0] if condition.relative else condition.value
    hit = _OPS[condition.op](v, threshold) | ~np.isfinite(v)  # a non-finite value meets any failure condition
    streak = 0
    for i, h in enumerate(hit):
        streak = streak + 1 if h else 0
        if streak == condition.k:
            return int(steps[i - condition.k + 1])
    return None


@dataclass
class RunEvent:
    seed: int
    run_id: str
    step: Optional[int]  # None: the event did not happen
    cause: str = ""  # the condition that triggered first


def run_event(client, run, event: Event) -> RunEvent:
    """When `event` happened in one run (the earliest of its conditions), or not."""
    found: list[tuple[int, str]] = []
    for condition in event.conditions:
        if not condition.metric:
            tag = client.get_run(run.run_id).data.tags.get(T.NONFINITE_STEP)
            if tag is not None:
                found.append((int(tag), NONFINITE))
            continue
        series = metric_series(client, run.run_id, condition.metric)
        steps = sorted(series)
        step = first_stretch(steps, [series[s] for s in steps], condition)
        if step is not None:
            found.append((step, condition.text))
    if not found:
        return RunEvent(run.seed, run.run_id, None)
    step, cause = min(found)
    return RunEvent(run.seed, run.run_id, step, cause)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval of k successes in n trials."""
    alpha = 1 - level
    low = 0.0 if k == 0 else float(sps.beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(sps.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


def exact_test(a: dict[int, bool], b: dict[int, bool]) -> tuple[str, float]:
    """(test name, two-sided p) for the event rates of two groups keyed by seed: McNemar's exact test on the
    discordant pairs of their common seeds when every seed is shared, else Fisher's exact test."""
    if set(a) == set(b):
        only_a = sum(a[s] and not b[s] for s in a)
        only_b = sum(b[s] and not a[s] for s in a)
        if only_a + only_b == 0:
            return "McNemar exact", 1.0
        return "McNemar exact", float(sps.binomtest(only_a, only_a + only_b, 0.5).pvalue)
    table = [[sum(a.values()), len(a) - sum(a.values())], [sum(b.values()), len(b) - sum(b.values())]]
    return "Fisher exact", float(sps.fisher_exact(table).pvalue)


@dataclass
class GroupEvents:
    group: str
    runs: list[RunEvent]

    @property
    def count(self) -> int:
        return sum(r.step is not None for r in self.runs)

    @property
    def median_step(self) -> Optional[float]:
        steps = [r.step for r in self.runs if r.step is not None]
        return float(np.median(steps)) if steps else None

    def happened(self) -> dict[int, bool]:
        return {r.seed: r.step is not None for r in self.runs}


@dataclass
class EventResult:
    event: Event
    groups: list[GroupEvents]
    comparisons: list[dict] = field(default_factory=list)  # group vs baseline: test, p, holm_p


def analyse(client, groups: Sequence[Group], events: Sequence[Event], baseline: Optional[str],
            pairs: Sequence[tuple[str, str]] = ()) -> list[EventResult]:
    """Every event in every group's seed runs (FINISHED and FAILED), with comparisons of every group to the baseline
    group and of each (a, b) pair (group labels), Holm-adjusted over all events' comparisons."""
    results = []
    for event in events:
        per_group = [GroupEvents(g.label, sorted((run_event(client, r, event) for r in [*g.runs, *g.failed_runs]),
                                                 key=lambda r: r.seed)) for g in groups]
        result = EventResult(event, per_group)
        by_label = {g.group: g for g in per_group}
        versus = [(g, baseline) for g in by_label if g != baseline] if baseline in by_label else []
        for a, b in [*versus, *pairs]:
            if a not in by_label or b not in by_label:
                raise RlvrlabError(f"--compare {a}:{b}: no group named {a if a not in by_label else b!r}; groups: "
                                   + ", ".join(by_label))
            test, p = exact_test(by_label[a].happened(), by_label[b].happened())
            result.comparisons.append({"group": a, "baseline": b, "test": test, "p": p})
        results.append(result)
    flat = [c for r in results for c in r.comparisons]
    for c, adjusted in zip(flat, holm([c["p"] for c in flat]) if flat else []):
        c["holm_p"] = adjusted
    return results


def markdown(results: Sequence[EventResult]) -> str:
    """Per event: each group's rate with its exact interval and median step; then every comparison."""
    lines = []
    for r in results:
        lines += [f"### Event {code(r.event.text)}", "",
                  "| group | runs | events | rate [95% exact] | median step |", "|---|---:|---:|---:|---:|"]
        for g in r.groups:
            n, k = len(g.runs), g.count
            low, high = clopper_pearson(k, n) if n else (float("nan"), float("nan"))
            median = f"{g.median_step:g}" if g.median_step is not None else "-"
            rate = k / n if n else float("nan")
            lines.append(f"| {md(g.group)} | {n} | {k} | {rate:.2f} [{low:.2f}, {high:.2f}] | {median} |")
        if r.comparisons:
            counts = {g.group: f"{g.count}/{len(g.runs)}" for g in r.groups}
            lines += ["", "| comparison | events | test | p | Holm p |", "|---|---|---|---:|---:|"]
            for c in r.comparisons:
                pair = f"{md(c['group'])} vs {md(c['baseline'])}"
                lines.append(f"| {pair} | {counts[c['group']]} vs {counts[c['baseline']]} | {c['test']} | "
                             f"{c['p']:.3g} | {c['holm_p']:.3g} |")
        lines.append("")
    return "\n".join(lines)


def as_dict(results: Sequence[EventResult]) -> list[dict]:
    """For sources.json: every run's event step and cause."""
    return [{"event": r.event.text, "comparisons": r.comparisons,
             "groups": {g.group: [{"seed": e.seed, "run_id": e.run_id, "step": e.step, "cause": e.cause}
                                  for e in g.runs] for g in r.groups}} for r in results]
