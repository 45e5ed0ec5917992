"""results/README.md against its CSVs (issue 45, item 6): every number the README quotes for a committed folder is
checked against that folder's files as they are on disk when the test runs (so a regenerated folder is checked by
re-running it), at the precision it is printed with: a printed number matches a value that rounds to it (0.045
matches 0.0449; 9.3e-10 matches 9.26e-10).

A README section reports a folder when its heading names `results/<folder>/`; its data are that folder and each
subfolder with a comparisons.csv that the section cites as `<name>/` (`control/`, `secondary/`, `noclip/`); the
contrasts of an interactions.csv (`report --interaction`) count as comparisons. In it:

- a signed number with an interval, `+0.008 [+0.003, +0.013]`: a comparison's (delta, low, high) in comparisons.csv;
  an interval alone, `[−0.018, +0.019]`: a comparison's (low, high); any other signed number, `+0.045`: a
  comparison's delta (or, failing that, an interval end: "lower ends −0.036 and −0.056");
- an unsigned number with an interval, `0.316 [0.290, 0.342]`: a cell's (mean, low, high) in table.csv;
- `Holm p = x` (or `Holm p x`): a Holm-adjusted p: comparisons.csv's `p_holm`, an event comparison's `holm_p`
  (sources.json), or Holm (1979) over the folder's metric and event comparisons together (the family §0d uses);
  `sign-flip p = x`: `p_signflip`; a plain `p = x` (McNemar, paired t): the unadjusted `p`. The README quotes the
  Holm p unless it says otherwise;
- `MDE x` (or `MDE at the Holm level x`): `mde_holm`, at the family's Holm level, never the 0.05 `mde`;
- a failure count `k/n` or `k of n`: some group of the folder failed k of its n seeds (sources.json's events; for a
  folder without events, table.csv's `failed_seeds` over all its groups); `k/n [a, b]`: the exact (Clopper and
  Pearson 1934) 95% interval of k in n;
- a table with a `seeds` column: each row names a group of table.csv (a closing remark in parentheses aside) and
  gives its seed count.

A p or MDE in the same clause (up to `;`, a sentence's end, a table cell's end) as a comparison's number must be
that comparison's, and a p after a failure count an event comparison's; elsewhere it must be some comparison's of
the folder.

Not data, excluded by rule rather than by a list: fenced code blocks (commands); in a parenthesis or bracket,
everything from the words "first run" to its closing mark, and every table column whose header says "first run"
(an earlier run's numbers, whose per-seed values were never committed); a number right after `=` (a
hyperparameter: tau=0.2); a signed number beside the word "margin" (a protocol's constant: "the margin −0.02",
"the −0.03 margin"); a p followed by `×` (a design's arithmetic: "p = 0.0039 × 8"); and unsigned numbers without an
interval (steps, seeds, commits, sizes, levels: a mean the README relies on is quoted with its interval).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "results" / "README.md"

_NUM = r"[+\-−]?(?:\d+\.?\d*|\.\d+)(?:e[+\-−]?\d+)?"
_SIGNED = r"[+\-−±](?:\d+\.?\d*)(?:e[+\-−]?\d+)?"
_TRIPLE = re.compile(rf"(?<![\w./=])({_NUM}) \[({_NUM}), ({_NUM})\]")
_COUNT = re.compile(r"(?<![\w./])(\d+)(?:/| of )(\d+)\b")
_P = re.compile(rf"\b(Holm p|sign-flip p|p)(?: =| ) ?({_NUM})(?!\d|\.\d| ?×)")
_MDE = re.compile(rf"\bMDE(?: at the Holm level)? ({_NUM})(?!\d|\.\d)")
_INTERVAL = re.compile(rf"\[({_SIGNED}), ({_SIGNED})\]")
_BARE = re.compile(rf"(?<![\w./=])({_SIGNED})(?![\w/]|\.\d| \[)")
_CLAUSE_END = re.compile(r";|\|\s|\.\s|\n")


def printed_match(text: str, value: float) -> bool:
    """True when `value` rounds to the number printed as `text` at the precision it is printed with."""
    text = text.replace("−", "-").replace("+", "").replace("±", "")
    if text in {"inf", "∞"}:
        return math.isinf(value)
    if not math.isfinite(value):
        return False
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    unit = 10.0 ** (-decimals + (int(exponent) if exponent else 0))
    return abs(value - float(text)) <= unit / 2 + 1e-12 * max(1.0, abs(value))


def _float(cell: str | None) -> float | None:
    try:
        return float(cell) if cell not in (None, "") else None
    except ValueError:
        return None


def holm(p_values: list[float]) -> list[float]:
    """Holm (1979) step-down adjustment: the k-th smallest p times (m - k + 1), made monotone, capped at 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """Exact 95% binomial interval (Clopper & Pearson 1934) from beta quantiles."""
    low = 0.0 if k == 0 else float(stats.beta.ppf(0.025, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(0.975, k + 1, n - k))
    return low, high


@dataclass
class Pool:
    """The numbers a README section may quote: its folder's comparisons, cells, event tests and failure counts."""

    comparisons: list[dict[str, float | None]] = field(default_factory=list)
    cells: list[tuple[float, float, float]] = field(default_factory=list)
    event_tests: list[dict[str, float | None]] = field(default_factory=list)
    counts: set[tuple[int, int]] = field(default_factory=set)
    seeds: dict[str, set[int]] = field(default_factory=dict)  # group label -> its cells' seed counts

    def add_folder(self, folder: Path) -> None:
        comparisons = list(csv.DictReader((folder / "comparisons.csv").open()))
        rows = [{k: _float(r.get(k)) for k in ("delta", "low", "high", "p", "p_holm", "p_signflip", "mde", "mde_holm")}
                for r in comparisons]
        failed, seeds = 0, 0
        for row in csv.DictReader((folder / "table.csv").open()):
            mean, low, high = (_float(row.get(k)) for k in ("mean", "low", "high"))
            if mean is not None:
                self.cells.append((mean, low if low is not None else mean, high if high is not None else mean))
            self.seeds.setdefault(row["group"], set()).add(int(row.get("n_seeds") or 0))
            if row["metric"] == comparisons[0]["metric"]:
                failed += len(row.get("failed_seeds", "").split())
                seeds += int(row.get("n_seeds") or 0)
        events = json.loads((folder / "sources.json").read_text()).get("events") or []
        tests = [{k: float(t[k]) for k in ("p", "holm_p")} for e in events for t in e["comparisons"]]
        # Holm over the metric and event families together (the family §0d states), per row
        union = holm([r["p"] for r in rows if r["p"] is not None] + [t["p"] for t in tests])
        for row, value in zip([r for r in rows if r["p"] is not None] + tests, union):
            row["p_union"] = value
        self.comparisons += rows
        self.event_tests += tests
        if (folder / "interactions.csv").is_file():  # report --interaction: its contrasts quote as comparisons do
            self.comparisons += [{**dict.fromkeys(("p_signflip", "mde", "mde_holm")), "delta": _float(r["contrast"]),
                                  **{k: _float(r[k]) for k in ("low", "high", "p", "p_holm")}}
                                 for r in csv.DictReader((folder / "interactions.csv").open())]
        for event in events:
            for outcomes in event["groups"].values():
                self.counts.add((sum(o["step"] is not None for o in outcomes), len(outcomes)))
        if not events:
            self.counts.add((failed, seeds))


def folder_pool(folder: Path, section_text: str) -> Pool:
    pool = Pool()
    pool.add_folder(folder)
    for sub in sorted(p.parent for p in folder.glob("*/comparisons.csv")):
        if f"{sub.name}/" in section_text:
            pool.add_folder(sub)
    return pool


def sections(text: str) -> list[tuple[str, Path, str]]:
    """(heading, folder, body) of each `##`/`###` section whose heading names `results/<folder>/`."""
    parts = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    found = []
    for heading, body in zip(parts[1::2], parts[2::2]):
        named = re.search(r"results/([\w\-]+)/", heading)
        if named:
            found.append((heading, ROOT / "results" / named.group(1), body))
    return found


def _drop_first_run_columns(lines: list[str]) -> list[str]:
    """Blank every table column whose header says "first run"."""
    out, drop = [], set()
    for line in lines:
        if not line.startswith("|"):
            drop = set()
            out.append(line)
            continue
        cells = line.split("|")
        if not drop and not set(line) <= set("|-: "):
            header = [i for i, c in enumerate(cells) if re.search(r"first[ -]run", c, re.I)]
            drop = set(header) or {-1}
        out.append("|".join("" if i in drop else c for i, c in enumerate(cells)))
    return out


def quoted_text(body: str) -> str:
    """The section without what is not data: code, first-run numbers, bold marks, margins."""
    body = re.sub(r"```.*?```", "", body, flags=re.S).replace("**", "").replace("`", "")
    body = re.sub(r"\n[ ]*(?!\n|- |\||#)", " ", body)  # a wrapped line continues its paragraph or bullet
    body = "\n".join(_drop_first_run_columns(body.split("\n")))
    for _ in range(3):  # a first-run span ends at the closing mark of the parenthesis or bracket it opens in
        body = re.sub(r"first[ -]run[^()\[\]]*(?:\[[^\[\]]*\][^()\[\]]*)*(?=[)\]])", "", body, flags=re.I)
    body = re.sub(rf"(margin (?:of )?)({_SIGNED})|({_SIGNED})( margin)", " ", body)
    return body


@dataclass
class Finding:
    line: str
    quote: str
    why: str

    def __str__(self) -> str:
        return f"{self.quote!r} ({self.why}) in: {self.line.strip()[:160]}"


def _same(printed: tuple[str, ...], values: tuple[float | None, ...]) -> bool:
    return all(v is not None and printed_match(t, v) for t, v in zip(printed, values))


def check_text(text: str, pool: Pool) -> list[Finding]:
    """Every data number of `text` (already through quoted_text) against `pool`; one Finding per mismatch."""
    findings: list[Finding] = []
    for line in text.split("\n"):
        tokens = []
        for kind, pattern in (("triple", _TRIPLE), ("interval", _INTERVAL), ("count", _COUNT), ("p", _P), ("mde", _MDE),
                              ("bare", _BARE)):
            tokens += [(m.start(), m.end(), kind, m) for m in pattern.finditer(line)]
        tokens += [(m.start(), m.end(), "end", m) for m in _CLAUSE_END.finditer(line)]
        tokens.sort(key=lambda t: (t[0], -t[1]))
        current: list[dict[str, float | None]] | None = None  # the comparisons the clause is about
        events = False
        covered = -1
        for start, end, kind, m in tokens:
            if kind == "end":
                current, events = None, False
                continue
            if start < covered:
                continue
            covered = end
            quote = m.group(0)
            if kind == "triple":
                printed = m.group(1), m.group(2), m.group(3)
                if printed[0][0] in "+-−":
                    current = [r for r in pool.comparisons if _same(printed, (r["delta"], r["low"], r["high"]))]
                    events = False
                    if not current:
                        current = None
                        findings.append(Finding(line, quote, "no comparison has this delta and interval"))
                elif not any(_same(printed, cell) for cell in pool.cells):
                    findings.append(Finding(line, quote, "no cell of table.csv has this mean and interval"))
            elif kind == "interval":  # an interval quoted without its Δ
                current = [r for r in pool.comparisons if _same(m.groups(), (r["low"], r["high"]))] or None
                events = False
                if current is None:
                    findings.append(Finding(line, quote, "no comparison has this interval"))
            elif kind == "count":
                k, n = int(m.group(1)), int(m.group(2))
                events, current = True, None
                after = re.match(rf" \[({_NUM}), ({_NUM})\]", line[end:])
                if after:
                    covered = end + after.end()
                    if not _same(after.groups(), clopper_pearson(k, n)):
                        findings.append(Finding(line, quote + after.group(0), "not the exact 95% interval"))
                elif (k, n) not in pool.counts:
                    findings.append(Finding(line, quote, f"no group failed {k} of {n} seeds"))
            elif kind == "bare":  # a Δ without its interval starts a clause about it; an interval end does not
                current = [r for r in pool.comparisons if _same((m.group(1),), (r["delta"],))] or None
                events = False
                if current is None and not any(_same((m.group(1),), (r[key],)) for r in pool.comparisons
                                                for key in ("low", "high")):
                    findings.append(Finding(line, quote, "no comparison has this delta or interval end"))
            elif kind == "p":
                which, printed = m.group(1), m.group(2)
                about = current or ([] if events else pool.comparisons)
                if events or current is None:
                    about = about + pool.event_tests
                keys = {"Holm p": ("p_holm", "holm_p", "p_union"), "sign-flip p": ("p_signflip",), "p": ("p",)}[which]
                if not any(_same((printed,), (r.get(k),)) for r in about for k in keys):
                    scope = "this comparison" if current else "any comparison of the folder"
                    findings.append(Finding(line, quote, f"not the {which} of {scope}"))
            elif kind == "mde":
                rows = [r["mde_holm"] for r in (current or pool.comparisons)]
                if not any(v is not None and printed_match(m.group(1), v) for v in rows):
                    scope = "this comparison" if current else "any comparison of the folder"
                    findings.append(Finding(line, quote, f"not the MDE at the Holm level (mde_holm) of {scope}"))
    return findings


def check_seed_columns(text: str, pool: Pool) -> list[Finding]:
    """In a table with a `seeds` column, each row names a group of table.csv (a trailing remark in parentheses
    aside) and gives its number of seeds."""
    findings: list[Finding] = []
    column = None
    for line in text.split("\n"):
        cells = [c.strip() for c in line.split("|")]
        if not line.startswith("|"):
            column = None
        elif column is None:
            column = cells.index("seeds") if "seeds" in cells else -1
        elif column > 0 and not set(line) <= set("|-: "):
            label = re.sub(r"\s*\(.*\)$", "", cells[1])
            if label not in pool.seeds:
                findings.append(Finding(line, label, "no group of table.csv has this label"))
            elif int(cells[column]) not in pool.seeds[label]:
                findings.append(Finding(line, cells[column], f"not the seed count of {label}"))
    return findings


_SECTIONS = sections(README.read_text())


def test_the_readme_reports_every_committed_folder() -> None:
    named = {folder.name for _, folder, _ in _SECTIONS}
    committed = {p.parent.name for p in (ROOT / "results").glob("*/comparisons.csv")}
    assert committed <= named, f"folders the README reports no section for: {sorted(committed - named)}"


@pytest.mark.parametrize("heading,folder,body", _SECTIONS, ids=[f.name for _, f, _ in _SECTIONS])
def test_every_number_the_readme_quotes_matches_its_folder(heading: str, folder: Path, body: str) -> None:
    pool = folder_pool(folder, body)
    findings = check_text(quoted_text(body), pool) + check_seed_columns(quoted_text(body), pool)
    assert not findings, f"{heading}: {len(findings)} numbers match no row of {folder.name}:\n" + \
        "\n".join(map(str, findings))


def test_the_matcher_fails_a_wrong_line_and_passes_the_right_one() -> None:
    """A Δ, interval, Holm p or MDE off by one printed digit has no row; first-run numbers are excluded by rule."""
    folder = ROOT / "results" / "ucpo_pairs"
    rows = list(csv.DictReader((folder / "comparisons.csv").open()))
    row = next(r for r in rows if r["a"] == "ucpo tau=0.2" and "uniformity" in r["metric"])
    d, lo, hi = (float(row[k]) for k in ("delta", "low", "high"))
    p, mde = float(row["p_holm"]), float(row["mde_holm"])
    pool = folder_pool(folder, "")
    right = "| arm | seeds | Δ vs GRPO |\n|---|---:|---|\n" + \
        f"| ucpo tau=0.2 (paper) | 10 | {d:+.3f} [{lo:+.3f}, {hi:+.3f}], Holm p = {p:.2g}, MDE {mde:.3f} (first run [+9.9, +9.9]) |"
    assert check_text(quoted_text(right), pool) == []
    for wrong in (right.replace(f"{hi:+.3f}]", f"{hi + 0.002:+.3f}]"), right.replace(f"{p:.2g}", f"{p * 1.5:.2g}"),
                  right.replace(f"MDE {mde:.3f}", f"MDE {float(row['mde']):.3f}")):
        assert len(check_text(quoted_text(wrong), pool)) == 1, wrong
    assert len(check_text(quoted_text(f"its interval [{lo:+.3f}, {hi + 0.002:+.3f}]"), pool)) == 1
    assert printed_match("9.3e-10", 9.26e-10) and not printed_match("9.3e-10", 9.36e-10)
    assert printed_match("0.045", 0.0449) and printed_match("−0.000", -0.0004) and not printed_match("0.045", 0.0456)
    assert clopper_pearson(0, 6)[1] == pytest.approx(0.459, abs=1e-3)
    assert [f.why for f in check_seed_columns(right.replace("| 10 |", "| 9 |"), pool)] == \
        ["not the seed count of ucpo tau=0.2"]


def test_counts_are_failures_of_the_folder_and_first_run_columns_are_not_read() -> None:
    folder = ROOT / "results" / "up_pairs"
    events = json.loads((folder / "sources.json").read_text())["events"][0]["groups"]
    outcomes = events["up_dapo staleness=4"]
    failed = sum(o["step"] is not None for o in outcomes)
    pool = folder_pool(folder, "")
    table = "| arm | failures | first run: failures |\n|---|---:|---:|\n| up_dapo | {}/{} | 5/6 |"
    assert check_text(quoted_text(table.format(failed, len(outcomes))), pool) == []
    impossible = len(outcomes) + 1  # no group of the folder ran that many seeds
    assert len(check_text(quoted_text(table.format(failed, impossible)), pool)) == 1
    assert check_text(quoted_text("0/6 [0, 0.46]"), pool) == []
    assert len(check_text(quoted_text("0/6 [0, 0.40]"), pool)) == 1
