"""Report -> markdown, LaTeX (booktabs), CSV, a rich table, and the sources sidecar."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Optional

import numpy as np

from rlvrlab import stats
from rlvrlab.report.collect import EvalRun, Group, Selection
from rlvrlab.report.escape import md, tex
from rlvrlab.report.events import EventResult
from rlvrlab.report.provenance import environments, initial_models, portable, portable_text
from rlvrlab.report.table import Comparison, Estimate, Report, best_groups


def _num(x: Optional[float], digits: int = 3) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _p(x: Optional[float]) -> str:
    """p-values: 3 decimals, small ones in scientific notation (never a bare 0.000)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.1e}" if x < 0.001 else f"{x:.3f}"


TEXT = ("{}†", "{} ± {}", "{} [{}, {}]")  # an estimate without an interval (too few seeds), ± half-width, [low, high]
TEX = ("{}$^\\dagger$", "{} $\\pm$ {}", "{} {{\\scriptsize [{}, {}]}}")


def _cell_text(c: Estimate, interval: str, marks: tuple[str, str, str] = TEXT, mean: Optional[str] = None) -> str:
    """An estimate's cell: its mean (`mean`: as given, e.g. in bold) with its interval as `interval` asks."""
    mean = _num(c.mean) if mean is None else mean
    if c.flagged:
        return marks[0].format(mean)
    if c.bounds is None:
        return mean
    low, high = c.bounds
    return marks[1].format(mean, _num((high - low) / 2)) if interval == "pm" else \
        marks[2].format(mean, _num(low), _num(high))


NO_SPREAD = "0 (no spread)"  # the MDE where every seed's difference is the same: se 0, any other Δ has p = 0


def _mde(x: Optional[float], se: Optional[float] = None) -> str:
    """An MDE as text: ∞ where the claim cannot be made; where the comparison's standard error is 0 (the seeds'
    differences, all zero for instance, have no spread) the t-test's MDE is undefined (stats.mde: NaN), and a
    bare "MDE=" would read as a missing number: it is 0 there, the limit as se -> 0 and what the t's p says (p = 0
    for any other Δ, 1 for this one), with the reason; "—" where it is undefined for another reason (no df)."""
    if x is None:
        return ""
    if math.isinf(x):
        return "∞"
    if math.isnan(x):
        return NO_SPREAD if se == 0 else "—"
    return _num(x)


Delta = tuple[Optional[Comparison], Optional[float]]  # a group's comparison with the baseline; else Δ of means


def baseline_deltas(report: Report) -> dict[tuple[str, str, str], Delta]:
    """(group, section, metric) of each group but the baseline -> its comparison with the baseline, or, where too
    few seeds allow none, (None, the difference of the two means alone)."""
    if report.baseline is None:
        return {}
    versus, estimates = report.versus_baseline(), report.estimate_of()
    deltas: dict[tuple[str, str, str], Delta] = {}
    for key, e in estimates.items():
        if e.group != report.baseline:
            r = versus.get(key)
            deltas[key] = (r, None) if r is not None else \
                (None, e.mean - estimates[(report.baseline, e.section, e.metric)].mean)
    return deltas


def _delta_text(r: Optional[Comparison], difference: Optional[float] = None) -> str:
    """A Δ-vs-baseline cell: the comparison with its interval, Holm p and MDE; a bare difference of means † where
    too few seeds allow no comparison."""
    if r is None:
        return "—" if difference is None else f"{difference:+.3f}†"
    c = r.result
    star = "*" if r.significant else ""
    kind = "paired" if c.test.startswith("paired") else "unpaired"
    note = f" ({r.claim.note})" if r.claim is not None and r.claim.note else ""
    note += f" {_equivalent(r.margin)}" if r.equivalent else ""
    return (f"{c.delta:+.3f} [{c.low:+.3f}, {c.high:+.3f}]{star} p={_p(r.p_holm)} "
            f"MDE={_mde(r.claim.mde if r.claim else None, c.se)} {kind}{note}")


def _equivalent(margin: Optional[float]) -> str:
    """The verdict word of a TOST whose Holm p < 0.05 (Comparison.equivalent); nothing is written otherwise."""
    return f"equivalent within ±{margin:g}"


def _row_text(r: Comparison, esc: Callable[[str], str]) -> list[str]:
    """A comparison's cells; esc: how a value from the runs is written (markdown or rich markup escaped)."""
    c = r.result
    star = "*" if r.significant else ""
    test = c.test + (" + sign-flip" if r.max_statistic else "")
    test += f" ({r.claim.note})" if r.claim is not None and r.claim.note else ""
    test = esc(test)
    verdict = f" {_equivalent(r.margin)}" if r.equivalent else ""
    return [esc(r.name), esc(r.metric), f"{c.delta:+.3f} [{c.low:+.3f}, {c.high:+.3f}]{star}{verdict}", test,
            f"{c.n_a}/{c.n_b}", _p(c.p), _p(r.p_holm), _p(c.p_signflip), _mde(r.claim.mde if r.claim else None, c.se),
            _num(c.prob_improvement, 2)]


ROW_HEADER = ["comparison", "metric", "Δ [95% CI]", "test", "seeds", "p", "Holm p", "sign-flip p",
              "MDE (80%, Holm)", "P(impr.)"]


def _title(section: str) -> str:
    return "training metrics" if section == "train" else f"evaluation: {section}"


def _other_rows(report: Report, section: str) -> list[Comparison]:
    """Comparisons not shown in the baseline's Δ table: extra pairs and selected cells."""
    return [r for r in report.comparisons if r.section == section and (r.b != report.baseline or r.selected_from)]


def _needed_text(c: Estimate) -> str:
    if c.bounds is None:
        return "†"
    low, high = c.bounds
    needed = "∞" if c.seeds_needed is None else str(c.seeds_needed)
    return f"±{_num((high - low) / 2)} ({c.n_seeds}) → {needed}"


CONDITIONAL = "intervals are conditional on that one initial model"


UNRECORDED = ("not recorded by rlvrlab (another trainer's command; whether it varies with the seed is that "
              "trainer's doing)")


def _initial_model(params: dict[str, str]) -> str:
    """What a run started from, from its params. A tiny run logged before model.warm_start_seed existed started
    from warm start seed 0 (rlvrlab.config.compose.LEGACY_WARM_START_SEED); null is the run's seed."""
    if "model.tier" not in params:  # a command sweep's run: another trainer's, whose config rlvrlab did not log
        return UNRECORDED
    tier = params["model.tier"]
    if tier == "toy":
        return "the toy table of model.toy_init (no seed)"
    if tier == "real":
        return f"model.path {params.get('model.path', '?')}"
    seed = params.get("model.warm_start_seed", "0")
    return "warm start seed = run seed (varies with seed)" if seed == "None" else f"fixed warm start seed {seed}"


def initial_model_note(groups: Sequence[Group]) -> str:
    """The footer line on what every interval is conditional on: the initial model, which varies with the seed
    only when a tiny run's warm start seed is the run's own (model.warm_start_seed null); then the digests of the
    initial weights where the runs recorded them (digest_note)."""
    by_kind: dict[str, list[str]] = {}
    for g in groups:
        for kind in dict.fromkeys(_initial_model(r.params) for r in g.runs):
            by_kind.setdefault(kind, []).append(g.label)
    digests = digest_note(groups)
    if len(by_kind) == 1:
        kind = next(iter(by_kind))
        if kind == UNRECORDED:
            return f"initial model: {kind}{digests}"
        if kind.startswith("fixed"):
            return f"{kind}: {CONDITIONAL}{digests}"
        return f"initial model: {kind}" + ("" if kind.startswith("warm start") else f": {CONDITIONAL}") + digests
    parts = "; ".join(f"{kind} ({', '.join(labels)})" for kind, labels in by_kind.items())
    fixed = any(not kind.startswith("warm start") and kind != UNRECORDED for kind in by_kind)
    return f"initial model: {parts}" + (f"; where it is fixed, {CONDITIONAL}" if fixed else "") + digests


SHOWN_HEX = 12  # the digest prefix a footer shows (sources.json has the full SHA-256)


def digest_note(groups: Sequence[Group]) -> str:
    """The initial-model digests of the runs (rlvrlab.initial_model.sha256 tags), as the footer's last clause: the
    one digest of all runs; or per group, saying plainly where one group mixes several though its configuration
    names one initial model (its intervals then also vary over initial models); "" where no run recorded one."""
    runs = [r for g in groups for r in g.runs]
    recorded = [r for r in runs if r.initial_model]
    if not recorded:
        return ""
    untagged = f"; no digest recorded for {len(runs) - len(recorded)} of {len(runs)} runs" \
        if len(recorded) < len(runs) else ""
    distinct = [d for d in dict.fromkeys(r.initial_model for r in recorded) if d]
    if len(distinct) == 1:
        return f"; initial-model sha256 {distinct[0][:SHOWN_HEX]} ({len(recorded)} runs){untagged}"
    own: dict[str, list[str]] = {g.label: [d for d in dict.fromkeys(r.initial_model for r in g.runs) if d]
                                 for g in groups}
    parts, mixed = [], []
    for g in groups:
        digests = own[g.label]
        shown = ", ".join(d[:SHOWN_HEX] for d in digests[:4]) + (", ..." if len(digests) > 4 else "")
        parts.append(f"{g.label}: {shown or 'not recorded'}" if len(digests) < 2
                     else f"{g.label}: {len(digests)} digests ({shown})")
        if len(digests) > 1 and any(_initial_model(r.params) != "warm start seed = run seed (varies with seed)"
                                    for r in g.runs):
            mixed.append(g.label)
    text = f"; initial-model sha256 by group: {'; '.join(parts)}"
    if all(len(digests) < 2 for digests in own.values()):
        text = f"; DIFFERENT INITIAL MODELS across groups (--allow-mixed), sha256 by group: {'; '.join(parts)}"
    if mixed:
        text += (f"; SEVERAL INITIAL MODELS MIXED within {', '.join(mixed)}: its intervals also vary over initial "
                 "models")
    return text + untagged


def _grids(report: Report, section: str, interval: str, esc: Callable[[str], str],
           bold: Callable[[str], str]) -> tuple[list[list[str]], list[list[str]]]:
    """A section's means table (group, seeds, a cell per metric, the best mean per column in bold) and its Δ-vs-
    baseline table (none without a baseline), as rows of text; esc: how a value from the runs is written."""
    cells, best, deltas = report.estimate_of(), best_groups(report), baseline_deltas(report)
    metrics = report.metrics[section]

    def mean(g: Group, m: str) -> str:
        text = _cell_text(cells[(g.label, section, m)], interval)
        return bold(text) if best.get((section, m)) == g.label else text

    means = [[esc(g.label), esc(g.seeds_text), *(mean(g, m) for m in metrics)] for g in report.groups]
    versus = [[esc(g.label), *(_delta_text(*deltas[(g.label, section, m)]) for m in metrics)]
              for g in report.groups if report.baseline is not None and g.label != report.baseline]
    return means, versus


def _md_table(header: list[str], rule: str, rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(row) + " |" for row in rows), ""]


md_table, p_text = _md_table, _p  # for the sections rlvrlab.report.write adds (events', interactions')


def markdown(report: Report, interval: str = "bracket") -> str:
    cells = report.estimate_of()
    out = []
    for section in report.sections:
        metrics = [md(m) for m in report.metrics[section]]
        means, versus = _grids(report, section, interval, md, lambda text: f"**{text}**")
        out.append(f"### {md(_title(section))}\n")
        out += _md_table(["group", "seeds", *metrics], "|---|---:|" + "---:|" * len(metrics), means)
        if report.baseline:
            out.append(f"Δ vs **{md(report.baseline)}** (95% interval; Holm-adjusted p; MDE at 80% power at the Holm "
                       "first-step level; * Holm p < 0.05 with ≥ 5 seeds per group, and for max-statistics the "
                       "sign-flip p < 0.05)\n")
            out += _md_table(["group", *metrics], "|---|" + "---|" * len(metrics), versus)
        others = _other_rows(report, section)
        if others:
            out.append("Other comparisons (same Holm family)\n")
            out += _md_table(ROW_HEADER, "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
                             [_row_text(r, md) for r in others])
        if report.target_halfwidth is not None:
            out.append(f"Seeds needed for a 95% half-width of {report.target_halfwidth:g} "
                       "(half-width now (seeds) → seeds needed)\n")
            out += _md_table(["group", *metrics], "|---|" + "---|" * len(metrics),
                             [[md(g.label), *(_needed_text(cells[(g.label, section, m)])
                                              for m in report.metrics[section])] for g in report.groups])
    out += [f"- {md(note)}" for note in report.notes]
    return "\n".join(out) + "\n"



def latex(report: Report, interval: str = "bracket") -> str:
    """One booktabs tabular per section; the best mean per column in bold; † marks groups without an interval."""
    cells, best = report.estimate_of(), best_groups(report)
    out = ["% generated by rlvrlab report; needs \\usepackage{booktabs}"]
    for section in report.sections:
        metrics = report.metrics[section]
        out.append(f"% {_title(section)}")
        out.append("\\begin{tabular}{l r " + "c " * len(metrics) + "}")
        out.append("\\toprule")
        out.append("Group & Seeds & " + " & ".join(tex(m) for m in metrics) + " \\\\")
        out.append("\\midrule")
        for g in report.groups:
            row = []
            for m in metrics:
                c = cells[(g.label, section, m)]
                mean = f"\\textbf{{{_num(c.mean)}}}" if best.get((section, m)) == g.label else _num(c.mean)
                row.append(_cell_text(c, interval, TEX, mean))
            out.append(f"{tex(g.label)} & {tex(g.seeds_text)} & " + " & ".join(row) + " \\\\")
        out.append("\\bottomrule")
        out.append("\\end{tabular}")
        out.append("")
    out += ["% " + " ".join(note.splitlines()) for note in report.notes]
    return "\n".join(out) + "\n"


CSV_FIELDS = ["group", "section", "metric", "mean", "low", "high", "se", "df", "method", "seed_low", "seed_high",
              "n_seeds", "n_problems", "seeds_needed", "delta", "delta_low", "delta_high", "test", "p", "p_holm",
              "p_signflip", "mde", "mde_holm", "claim_note", "significant", "prob_improvement", "note"]


def to_csv(report: Report) -> str:
    groups, deltas = {g.label: g for g in report.groups}, baseline_deltas(report)
    return csv_text(["baseline", *CSV_FIELDS, "config_hash", "seeds", "failed_seeds"], [
        {**{k: v for k, v in asdict(e).items() if k in CSV_FIELDS},
         **_delta_fields(*deltas.get((e.group, e.section, e.metric), (None, None))),
         "baseline": report.baseline or "", "config_hash": groups[e.group].config_hash,
         "seeds": " ".join(map(str, groups[e.group].seeds)), "failed_seeds": " ".join(map(str, groups[e.group].failed))}
        for e in report.estimates])


def _delta_fields(r: Optional[Comparison], difference: Optional[float]) -> dict:
    """table.csv's columns of an estimate's comparison with the baseline (empty for the baseline's own row; the
    difference of means alone where too few seeds allow no comparison)."""
    if r is None:
        return {"delta": difference, "significant": False}
    c = r.result
    return {"delta": c.delta, "delta_low": c.low, "delta_high": c.high, "test": c.test, "p": c.p, "p_holm": r.p_holm,
            "p_signflip": c.p_signflip, "mde": c.mde, "mde_holm": r.claim.mde if r.claim else None,
            "claim_note": r.claim.note if r.claim else "", "significant": r.significant,
            "prob_improvement": c.prob_improvement}


COMPARISON_FIELDS = ["a", "b", "section", "metric", "delta", "low", "high", "se", "df", "test", "paired", "n_a",
                     "n_b", "p", "selected_from", "p_family", "p_holm", "p_signflip", "mde", "max_statistic",
                     "holm_level", "mde_holm", "claim_note", "significant", "prob_improvement"]


# with --equivalence only (a report without it keeps the columns above, byte for byte): the TOST's margin, its p and
# its Holm p in the family of the difference tests and the TOSTs; empty for a column without a margin
EQUIVALENCE_FIELDS = ["equivalence_margin", "p_equivalence", "p_equivalence_holm", "equivalent"]


# with --simultaneous only: the row's joint max-t interval (rlvrlab.stats.simultaneous), its multiplier and
# Bonferroni's; empty on rows that are not a paired comparison with the baseline
SIMULTANEOUS_FIELDS = ["sim_low", "sim_high", "sim_crit", "sim_bonferroni"]


def comparison_fields(report: Report) -> list[str]:
    return COMPARISON_FIELDS + (EQUIVALENCE_FIELDS if report.equivalence is not None else []) + \
        (SIMULTANEOUS_FIELDS if report.simultaneous else [])


def _simultaneous_fields(r: Comparison) -> dict:
    joint, k = r.simultaneous, r.sim_index
    if joint is None:
        return dict.fromkeys(SIMULTANEOUS_FIELDS, "")
    return {"sim_low": joint.low[k], "sim_high": joint.high[k], "sim_crit": joint.critical,
            "sim_bonferroni": joint.bonferroni}


def comparison_record(r: Comparison) -> dict:
    """One row of comparisons.csv as values (the protocol's verdict rules read these too)."""
    result = {k: v for k, v in asdict(r.result).items() if k in COMPARISON_FIELDS}
    tost = r.margin is not None
    return {**result, "a": r.a, "b": r.b, "section": r.section, "metric": r.metric,
            "selected_from": r.selected_from or "", "p_family": r.p_family, "p_holm": r.p_holm,
            "max_statistic": r.max_statistic, "holm_level": r.claim.level if r.claim else "",
            "mde_holm": r.claim.mde if r.claim else "", "claim_note": r.claim.note if r.claim else "",
            "significant": r.significant, "equivalence_margin": r.margin if tost else "",
            "p_equivalence": r.p_equivalence if tost else "",
            "p_equivalence_holm": r.p_equivalence_holm if tost else "", "equivalent": r.equivalent if tost else "",
            **_simultaneous_fields(r)}


def comparisons_csv(report: Report) -> str:
    """Every comparison of the report's Holm family, with every number behind it."""
    return csv_text(comparison_fields(report), [comparison_record(r) for r in report.comparisons],
                    extrasaction="ignore")


def csv_text(fieldnames: list[str], rows: Sequence[dict], **options) -> str:
    """A CSV of `rows` under a header of `fieldnames` (csv.DictWriter's `options`)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames, **options)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# The values the statistics were fed, one (section, metric) column at a time: group label -> [S] (training: each
# seed run's reduced value) or [S, P] (evaluation: seeds x problems, in the group's seed order and the dataset's
# problem order). Written with repr(), which round-trips a float exactly, so a reader recomputes to the bit.
Values = dict[tuple[str, str], dict[str, np.ndarray]]

PER_SEED_FIELDS = ["group", "section", "seed", "metric", "value"]
PER_PROBLEM_FIELDS = ["group", "section", "seed", "problem", "metric", "value"]


def _exact(x: float) -> str:
    return repr(float(x))  # shortest string that parses back to the same double ("nan" for undefined)


def per_seed_csv(report: Report, values: Values, events: Sequence[EventResult] = ()) -> str:
    """Long format, one row per (group, section, metric, seed): the per-seed values each table cell and comparison
    rests on. Training metrics: the run's reduced value; evaluation metrics: the seed's mean over problems
    (stats.seed_scores: over the problems where the statistic is defined). Events (`--event NAME: ...`), in section
    `event`: metric NAME is 1 when it happened in the seed's run, else 0 (the exact tests' data), and NAME:step the
    step it happened at ("nan" when it did not)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(PER_SEED_FIELDS)
    for (section, metric), by_group in values.items():
        for g in report.groups:
            for seed, value in zip(g.seeds, stats.seed_scores(by_group[g.label])):
                writer.writerow([g.label, section, seed, metric, _exact(value)])
    for result in events:
        for group in result.groups:
            for run in sorted(group.runs, key=lambda r: r.seed):
                writer.writerow([group.group, "event", run.seed, result.event.name, int(run.step is not None)])
                writer.writerow([group.group, "event", run.seed, f"{result.event.name}:step",
                                 "nan" if run.step is None else run.step])
    return buffer.getvalue()


def per_problem_csv(report: Report, values: Values, problems: dict[str, list[str]]) -> str:
    """Long format, one row per (group, section, metric, seed, problem): the seeds x problems matrices of the
    evaluation metrics (their crossed intervals and comparisons); "nan" where a statistic is undefined."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(PER_PROBLEM_FIELDS)
    for (section, metric), by_group in values.items():
        for g in report.groups:
            matrix = np.asarray(by_group[g.label], dtype=np.float64)
            if matrix.ndim != 2:
                continue
            for seed, row in zip(g.seeds, matrix):
                for problem, value in zip(problems[section], row):
                    writer.writerow([g.label, section, seed, problem, metric, _exact(value)])
    return buffer.getvalue()


def rich_tables(report: Report):
    """The report as rich tables for the terminal; values from the runs are text, never rich markup."""
    from rich.markup import escape
    from rich.table import Table

    def table(title: str, header: list[str], rows: list[list[str]], justify: str = "right") -> Table:
        made = Table(title=escape(title))
        for i, name in enumerate(header):
            made.add_column(name, justify="left" if i == 0 else justify)  # type: ignore[arg-type]
        for row in rows:
            made.add_row(*row)
        return made

    tables = []
    for section in report.sections:
        metrics = [escape(m) for m in report.metrics[section]]
        means, versus = _grids(report, section, "bracket", escape, lambda text: f"[bold]{text}[/]")
        tables.append(table(_title(section), ["group", "seeds", *metrics], means))
        if report.baseline:
            tables.append(table(f"{_title(section)}: Δ vs {report.baseline}", ["group", *metrics], versus))
        others = _other_rows(report, section)
        if others:
            tables.append(table(f"{_title(section)}: other comparisons", ROW_HEADER,
                                [_row_text(r, escape) for r in others], "left"))
    return tables


def sources(selection: Selection, report: Report, command: list[str], eval_runs: dict[str, list[EvalRun]],
            outputs: list[str], provenance: Optional[dict] = None, protocol: Optional[dict] = None,
            events: Optional[list] = None) -> str:
    """Everything a table rests on: runs per group (ids, seeds, git SHAs, initial-model digests), evaluations (ids,
    commits), the distinct initial models and environments of the runs, excluded runs, settings. No absolute path
    of the machine that wrote it (rlvrlab.report.provenance.portable): a reader's checkout reads it the same."""
    from rlvrlab.tracking.provenance import git_state

    sha, dirty, _ = git_state()
    every = selection.all_groups or selection.groups
    body = {
        "command": [portable(arg) for arg in command], "tracking_uri": portable(selection.uri),
        "source": selection.experiment, "study": selection.study,
        "statistics": "Student-t seed intervals; crossed seeds x problems intervals for evaluations; paired t / "
                      "Welch comparisons (adaptive-seed studies: Stein two-stage intervals, paired Stein), "
                      "sign-flip p, Holm, MDE at the Holm level, the claim rule "
                      "(rlvrlab/stats/)",
        "baseline": report.baseline, "rlvrlab_git_sha": sha, "rlvrlab_git_dirty": dirty, "outputs": outputs,
        "provenance": provenance or {},
        "protocol": protocol and {**protocol, "path": portable(protocol["path"])},  # its commits; pre-registered?
        "initial_models": initial_models(every),  # the distinct digests of the runs' initial weights
        "environment": environments(every, eval_runs),  # the distinct environments the runs ran in
        "events": events or [],
        "groups": [{"label": g.label, "config_hash": g.config_hash,
                    "values": {k: portable(v) if isinstance(v, str) else v for k, v in g.values.items()},
                    "runs": [{"run_id": r.run_id, "seed": r.seed, "git_sha": r.git_sha, "git_dirty": r.git_dirty,
                              "initial_model": r.initial_model,
                              **({"duration_s": r.duration_s} if r.duration_s is not None else {})} for r in g.runs],
                    "failed_runs": [{"run_id": r.run_id, "seed": r.seed, "git_sha": r.git_sha,
                                     "initial_model": r.initial_model} for r in g.failed_runs],
                    "eval_runs": [e.as_dict() for e in eval_runs.get(g.label, [])]} for g in selection.groups],
        "excluded_runs": [{"run_id": run_id, "why": why} for run_id, why in selection.excluded],
        "notes": [portable_text(note) for note in report.notes],
    }
    return json.dumps(body, indent=2) + "\n"
