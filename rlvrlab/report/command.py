"""`rlvrlab report` as a library call, in three stages: select (a source's runs become groups and their per-seed
values: rlvrlab.report.sources), analyse (the statistics of those values: rlvrlab.report.table.analyse, with events
and a protocol's verdicts) and render (table.md / table.tex / table.csv, comparisons.csv, per_seed.csv,
per_problem.csv, PNG plots and sources.json: rlvrlab.report.write). docs/report.md."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import files, provenance, reanalyse as reanalysis, render, verdict
from rlvrlab.report.columns import Equivalence, Pair, parse_equivalence, parse_pairs
from rlvrlab.report.events import analyse as count_events, as_dict as event_dicts, parse_event
from rlvrlab.report.from_mlflow import from_mlflow
from rlvrlab.report.request import FORMATS as FORMATS, ReportRequest as ReportRequest, flag_of
from rlvrlab.report.sources import Selected, Source
from rlvrlab.report.table import Report, analyse, find_baseline
from rlvrlab.report.write import Analysed, write

SOURCES: dict[str, Source] = {"mlflow": from_mlflow, "csv": files.from_csv, "tensorboard": files.from_tensorboard}
# with --reanalyse, the options that still mean something (the rest are recorded in the folder's sources.json)
REANALYSE_OPTIONS = ("reanalyse", "out", "protocol", "command", "simultaneous", "interaction")
UNTIMED = "the runs' start times are unknown (a CSV has none), so the protocol's preceding them cannot be checked"


@dataclass
class ReportOutcome:
    result: Report
    folder: Path
    written: list[Path] = field(default_factory=list)
    verdicts: Optional[verdict.Verdicts] = None  # --protocol: its verdict rules evaluated (rlvrlab.report.verdict)


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
    return Analysed(result, event_results, verdicts, registered)


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
    added = {**({"simultaneous": True} if r.simultaneous else {}),
             **({"interaction": r.interaction_pairs} if r.interaction else {})}
    done = reanalysis.reanalyse(r.reanalyse, out=r.out, protocol=r.protocol, command=r.command, **added)
    return ReportOutcome(done.result, done.folder, done.written, done.verdicts)
