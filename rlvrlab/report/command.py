"""`rlvrlab report` as a library call, in three stages: select (a source's runs become groups and their per-seed
values: rlvrlab.report.sources), analyse (the statistics of those values: rlvrlab.report.table.analyse, with events
and a protocol's verdicts) and render (table.md / table.tex / table.csv, comparisons.csv, per_seed.csv,
per_problem.csv, PNG plots and sources.json: rlvrlab.report.write). docs/report.md."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import files, provenance, reanalyse as reanalysis, render, verdict
from rlvrlab.report.collect import curves
from rlvrlab.report.columns import Equivalence, Pair, parse_equivalence, parse_pairs
from rlvrlab.report.events import analyse as count_events, as_dict as event_dicts, parse_event
from rlvrlab.report.from_mlflow import from_mlflow
from rlvrlab.report.request import FORMATS as FORMATS, ReportRequest as ReportRequest, flag_of
from rlvrlab.report.sources import Selected, Source
from rlvrlab.report.table import analyse, find_baseline
from rlvrlab.report.write import Analysed, ReportOutcome as ReportOutcome, write
from rlvrlab.stats.peak import MAX_EXACT_SWAPS, RANDOM_SWAPS, peak_test

SOURCES: dict[str, Source] = {"mlflow": from_mlflow, "csv": files.from_csv, "tensorboard": files.from_tensorboard}
# with --reanalyse, the options that still mean something (the rest are recorded in the folder's sources.json)
REANALYSE_OPTIONS = ("reanalyse", "out", "protocol", "command", "simultaneous", "interaction")
PEAK_NOTE = ("peaks.csv: D = peak_a − peak_b, each the max over the shared steps of the mean curve over the shared "
             f"seeds; p_permutation swaps the arm labels within seeds (all 2^S swaps up to {MAX_EXACT_SWAPS} seeds, "
             f"else {RANDOM_SWAPS:,} random ones): with identical arms it is below 0.05 with probability ≤ 0.05 "
             "(never below 6 seeds: its smallest value is 2/2^S); naive_p (a paired t at each arm's own best step) "
             "ignores the selection")
UNTIMED = "the runs' start times are unknown (a CSV has none), so the protocol's preceding them cannot be checked"


def make_report(request: ReportRequest) -> ReportOutcome:
    """Everything `rlvrlab report` does but printing; one-line RlvrlabErrors before anything is written."""
    from rlvrlab.tracking.provenance import git_state

    if request.reanalyse is not None:
        return _reanalyse(request)
    git_state()  # the checkout's state as the report starts (cached): its own outputs under results/ are not the code
    request.check()
    pairs, equivalence = parse_pairs(request.compare), parse_equivalence(request.equivalence)
    events = [parse_event(text) for text in request.events]
    rules = verdict.load(request.protocol) if request.protocol is not None and Path(request.protocol).is_file() else ()
    kind, path = request.source_kind
    selected = SOURCES[kind](path, request, pairs, equivalence)  # select
    selection = selected.selection
    folder = request.out or Path("results") / outputs.path_part(selection.study or selection.experiment)
    outputs.check_dir(folder, f"--out {folder}")
    origin = provenance.of(selection)
    provenance.check(origin, folder, allow_dirty=request.allow_dirty, allow_mixed=request.allow_mixed)
    done = analysed(request, selected, pairs, equivalence, origin, folder, events, rules)  # analyse
    return ReportOutcome(done.result, folder, write(folder, request, selected, done, origin), done.verdicts)  # render


def analysed(request: ReportRequest, selected: Selected, pairs: list[Pair], equivalence: Optional[Equivalence],
             origin: provenance.Provenance, folder: Path, events: list, rules) -> Analysed:
    """The statistics of the selected values (table.analyse), the footer notes, the events' counts and tests, and a
    protocol's registration and verdicts."""
    selection = selected.selection
    result = analyse(selection, selected.data, metrics=selected.specs, eval_stats=selected.eval_stats,
                     baseline=request.baseline, pairs=pairs, target_halfwidth=request.target_halfwidth,
                     equivalence=equivalence, stage_one=selected.stage_one, simultaneous=request.simultaneous,
                     interaction=request.interaction_pairs)
    result.notes = selected.values_noted(result.notes)
    result.notes += selected.notes
    result.notes.append(provenance.note(origin))
    if request.source_kind[0] == "mlflow" and not selection.group_by:  # others' runs record no initial model
        result.notes.append(render.initial_model_note(result.groups))
    registered, verdicts, event_results = None, None, []
    if request.protocol is not None:
        registered = registration(request.protocol, origin, selected)
        result.notes.append(registered.note())
    if events:
        base = find_baseline(selection.all_groups, request.baseline)
        labels = {g.label for g in selection.all_groups}
        event_pairs = [(pair.a, pair.b) for pair in pairs if pair.a in labels and pair.b in labels]
        event_results = count_events(selected.client, selection.all_groups, events, base.label if base else None,
                                     event_pairs)
    if request.protocol is not None:  # a block about another folder is listed, not evaluated (rlvrlab.report.verdict)
        verdicts = verdict.evaluate(request.protocol, rules, result, folder=folder,
                                    root=provenance.results_dir().parent,
                                    events=event_dicts(event_results) if event_results else ())
    peaks: list[dict] = []
    if request.peak:
        peaks, skipped = peak_rows(selected.client, selection, request.peak, request.baseline, pairs)
        result.notes += [PEAK_NOTE, *skipped]
    return Analysed(result, event_results, verdicts, registered, peaks)


def peak_rows(client, selection, metrics, baseline: Optional[str], pairs: list[Pair]) -> tuple[list[dict], list[str]]:
    """--peak: per metric, every group against the baseline and each --compare pair A:B of two groups, on the seeds
    and steps both logged: peaks.csv's rows, and a note for each pair without 2 shared seeds and a shared step."""
    groups = {g.label: g for g in selection.groups}
    base = find_baseline(selection.all_groups, baseline)
    wanted = [(g.label, base.label) for g in selection.groups if base is not None and g.label != base.label]
    wanted += [(p.a, p.b) for p in pairs if p.a in groups and p.b in groups]
    out: list[dict] = []
    skipped: list[str] = []
    for metric in dict.fromkeys(metrics):
        for a, b in dict.fromkeys(wanted):
            if b not in groups:  # a baseline none of whose seeds finished
                continue
            steps_a, curve_a = curves(client, groups[a], metric)
            steps_b, curve_b = curves(client, groups[b], metric)
            seeds = sorted(set(groups[a].seeds) & set(groups[b].seeds))
            steps = sorted(set(steps_a.tolist()) & set(steps_b.tolist()))
            if len(seeds) < 2 or not steps:
                skipped.append(f"peak of {metric}, {a} vs {b}: {len(seeds)} shared seeds, {len(steps)} shared "
                               "steps; not tested (needs >= 2 seeds and a step both logged)")
                continue
            try:
                r = peak_test(_aligned(curve_a, steps_a, groups[a], seeds, steps),
                              _aligned(curve_b, steps_b, groups[b], seeds, steps))
            except RlvrlabError as error:  # e.g. a non-finite logged value: the other pairs are still tested
                skipped.append(f"peak of {metric}, {a} vs {b}: not tested ({error})")
                continue
            out.append({"a": a, "b": b, "metric": metric, "peak_a": r.peak_a, "step_a": steps[r.step_a],
                        "peak_b": r.peak_b, "step_b": steps[r.step_b], "D": r.delta, "p_permutation": r.p,
                        "naive_p": r.naive_p, "n_seeds": r.n_seeds})
    return out, skipped


def _aligned(values, steps, group, seeds: list[int], keep: list[int]):
    """values [runs, steps] of a group as [seeds, keep]: its rows of `seeds` (in order), its columns of `keep`."""
    rows = [group.seeds.index(seed) for seed in seeds]
    columns = [list(steps).index(step) for step in keep]
    return values[rows][:, columns]


def registration(path: Path, origin: provenance.Provenance, selected: Selected) -> provenance.Protocol:
    """--protocol's record (provenance.protocol) against the first run's start, which MLflow runs and TensorBoard
    event files carry; a CSV has no start times, so that the protocol preceded the runs cannot be checked: its
    record says so and never "pre-registered"."""
    if selected.client is not None:
        return provenance.protocol(path, origin.commits, provenance.first_run_start(selected.client,
                                                                                    selected.selection))
    record = provenance.protocol(path, origin.commits, int(time.time() * 1000))  # the file's commits, checked now
    reason = "; ".join(filter(None, [UNTIMED, record.reason]))
    return replace(record, first_run_start="unknown", pre_registered=False, reason=reason)


def _reanalyse(r: ReportRequest) -> ReportOutcome:
    """`--reanalyse FOLDER [--out DIR] [--protocol FILE] [--simultaneous] [--interaction A,B]`: the folder's tables
    from its recorded values and options, with the joint intervals and interaction tests added when asked."""
    given = r.given(but=REANALYSE_OPTIONS)
    if given:
        raise RlvrlabError(f"--reanalyse takes the options recorded in {r.reanalyse}/sources.json (and --out, "
                           f"--protocol, --simultaneous, --interaction); drop {flag_of(given[0])}, or run rlvrlab "
                           "report on the runs to change it")
    assert r.reanalyse is not None  # make_report calls this with --reanalyse only
    return reanalysis.reanalyse(r.reanalyse, out=r.out, protocol=r.protocol, command=r.command,
                                simultaneous=bool(r.simultaneous),
                                interaction=r.interaction_pairs if r.interaction else ())
