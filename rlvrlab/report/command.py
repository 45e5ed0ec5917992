"""`rlvrlab report` as a library call: select runs from MLflow, group them by configuration, compute the statistics
(docs/report.md), and write table.md / table.tex / table.csv, comparisons.csv, the values the statistics were
computed from (per_seed.csv, per_problem.csv), PNG plots and sources.json."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import collect, external, plots as plotting, provenance, reanalyse as reanalysis, render, verdict
from rlvrlab.report.events import analyse, as_dict as event_dicts, markdown as event_markdown, parse_event
from rlvrlab.report.table import (
    REDUCTIONS,
    Report,
    build,
    find_baseline,
    lower_is_better,
    parse_equivalence,
    parse_metrics,
    parse_pairs,
    stage_one_of,
    values_from_runs,
)
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.store import default_uri

FORMATS = ("md", "tex", "csv")


@dataclass(frozen=True)
class ReportRequest:
    """One `rlvrlab report` invocation (the options of the command, with its defaults)."""

    experiment: Optional[str] = None
    study: Optional[str] = None
    runs: Optional[str] = None  # comma-separated run ids
    baseline: Optional[str] = None
    metric: tuple[str, ...] = ()
    last: Optional[int] = None
    reduce: str = "mean"
    compare: tuple[str, ...] = ()
    target_halfwidth: Optional[float] = None
    rarefy: int = 4
    allow_dirty: bool = False
    allow_mixed: bool = False
    evaluations: bool = True
    eval_stats: Optional[str] = None
    formats: str = "md,tex,csv"
    out: Optional[Path] = None
    interval: str = "bracket"
    heatmap_keys: Optional[str] = None
    plots: bool = True
    smooth: int = 1
    only_changed: bool = True
    tracking_uri: Optional[str] = None
    output_dir: Path = Path("runs")
    events: tuple[str, ...] = ()  # `NAME: CONDITION | ...` (rlvrlab.report.events)
    protocol: Optional[Path] = None  # the study's protocol file (results/protocols/NAME.md)
    equivalence: Optional[str] = None  # `M` or `NAME=M,...`: TOST margins (table.parse_equivalence)
    group_by: Optional[str] = None  # KEY,KEY: group any runs by params or tags (rlvrlab.report.external)
    seed_key: Optional[str] = None  # with group_by: the param or tag holding each run's seed (default "seed")
    command: tuple[str, ...] = ("rlvrlab", "report")  # recorded in sources.json
    reanalyse: Optional[Path] = None  # a results folder: its tables re-computed from its values (report.reanalyse)


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
    r = request
    formats, interval, reduce, target_halfwidth = r.formats, r.interval, r.reduce, r.target_halfwidth
    tracking_uri, output_dir, runs = r.tracking_uri, Path(r.output_dir), r.runs
    study, last, out = r.study, r.last, r.out
    allow_dirty, allow_mixed, rarefy, evaluations = r.allow_dirty, r.allow_mixed, r.rarefy, r.evaluations
    eval_stats, baseline, plots, smooth, heatmap_keys = r.eval_stats, r.baseline, r.plots, r.smooth, r.heatmap_keys
    compare, metric = list(r.compare), list(r.metric)
    events = [parse_event(text) for text in r.events]
    chosen = [f.strip() for f in formats.split(",") if f.strip()]
    bad = [f for f in chosen if f not in FORMATS]
    if bad or not chosen:
        raise RlvrlabError(f"--format {formats!r}: use any of {', '.join(FORMATS)}, comma-separated")
    if interval not in ("bracket", "pm"):
        raise RlvrlabError(f"--interval {interval!r}: use bracket or pm")
    if reduce not in REDUCTIONS:
        raise RlvrlabError(f"--reduce {reduce!r}: use {', '.join(REDUCTIONS)}")
    outputs.check_dir(out if out is not None else Path("results"), f"--out {out}" if out is not None else "results")
    if target_halfwidth is not None and not target_halfwidth > 0:
        raise RlvrlabError(f"--target-halfwidth {target_halfwidth}: give a half-width > 0, e.g. 0.02")
    pairs = parse_pairs(compare or [])
    equivalence = parse_equivalence(r.equivalence)
    rules = verdict.load(r.protocol) if r.protocol is not None and Path(r.protocol).is_file() else ()
    uri = tracking_uri or default_uri(output_dir)
    if tracking_uri is None and not (output_dir / "mlflow.db").is_file():
        raise RlvrlabError(f"no MLflow store at {output_dir / 'mlflow.db'}; pass --output-dir of the runs or "
                           "--tracking-uri")
    run_ids = [r.strip() for r in (runs or "").split(",") if r.strip()]
    selection = _select(r, uri, run_ids)
    client = collect.client_for(uri)

    study_params = _study_params(client, selection) if study else {}
    last = last or int(study_params.get("objective.window", 10))
    specs = parse_metrics(metric or [study_params.get("objective.metric", "train/reward")], reduce=reduce, last=last)
    available = collect.available_metrics(client, selection)
    for spec in specs:
        if spec.name not in available:
            from rlvrlab.config.rules import unknown

            raise unknown("metric", spec.name, available, where=f"the runs of {selection.experiment!r}")

    folder = out or Path("results") / outputs.path_part(selection.study or selection.experiment)
    outputs.check_dir(folder, f"--out {folder}")
    origin = provenance.of(selection)
    provenance.check(origin, folder, allow_dirty=allow_dirty, allow_mixed=allow_mixed)
    evals = collect.eval_records(client, selection, rarefy=rarefy) if evaluations else None
    stats_columns = _eval_columns(evals, eval_stats, rarefy)
    result = build(client, selection, metrics=specs, evals=evals, eval_stats=stats_columns, baseline=baseline,
                   pairs=pairs, target_halfwidth=target_halfwidth, equivalence=equivalence,
                   stage_one=stage_one_of(study_params))
    result.notes += external.notes(selection)
    result.notes.append(provenance.note(origin))
    if not selection.group_by:  # other trainers' runs do not record their initial model in rlvrlab's params
        result.notes.append(render.initial_model_note(result.groups))
    registered, verdicts = None, None
    if r.protocol is not None:
        registered = provenance.protocol(r.protocol, origin.commits, provenance.first_run_start(client, selection))
        result.notes.append(registered.note())
    event_results = []
    if events:
        base = find_baseline(selection.all_groups, baseline)
        labels = {g.label for g in selection.all_groups}
        event_pairs = [(pair.a, pair.b) for pair in pairs if pair.a in labels and pair.b in labels]
        event_results = analyse(client, selection.all_groups, events, base.label if base else None, event_pairs)
    if r.protocol is not None:  # a block about another folder is listed, not evaluated (rlvrlab.report.verdict)
        verdicts = verdict.evaluate(r.protocol, rules, result, folder=folder, root=provenance.results_dir().parent,
                                    events=event_dicts(event_results) if event_results else ())

    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    texts = {"md": render.markdown(result, interval) + ("\n" + event_markdown(event_results) if event_results else "")
             + ("\n" + verdict.markdown(verdicts) if verdicts is not None else ""),
             "tex": render.latex(result, interval),
             "csv": render.to_csv(result)}
    for fmt in chosen:
        path = folder / f"table.{fmt}"
        outputs.write_replacing(path, texts[fmt])
        written.append(path)
    if "csv" in chosen and result.rows:
        path = folder / "comparisons.csv"
        outputs.write_replacing(path, render.comparisons_csv(result))
        written.append(path)
    if "csv" in chosen:  # the numbers behind every cell and comparison, for a reader to recompute them
        values = values_from_runs(client, selection.groups, specs, evals, stats_columns)
        path = folder / "per_seed.csv"
        outputs.write_replacing(path, render.per_seed_csv(result, values, event_results))
        written.append(path)
        if evals is not None and stats_columns:
            path = folder / "per_problem.csv"
            outputs.write_replacing(path, render.per_problem_csv(result, values, evals.datasets))
            written.append(path)
    if plots:
        for name in dict.fromkeys(spec.name for spec in specs):
            written.append(plotting.training_curves(client, selection, name, folder, smooth))
        if evals is not None:
            for dataset in evals.datasets:
                curves = plotting.passk_curves(selection, evals, dataset, folder)
                if curves is not None:
                    written.append(curves)
        keys = _heatmap_keys(selection, heatmap_keys)
        if keys is not None:
            first = specs[0].label
            means = {c.group: c.mean for c in result.cells if c.section == "train" and c.metric == first}
            written.append(plotting.heatmap(selection, means, keys, first, folder, not lower_is_better(first)))
    if evals is not None and "csv" in chosen:  # pass@k and coverage@k over k = 1..64 with bands
        from rlvrlab.report import passk_curve

        written += passk_curve.write(evals, folder, plot=plots)
    sidecar = folder / "sources.json"
    outputs.write_replacing(sidecar, render.sources(selection, result, list(request.command),
                                      evals.eval_runs if evals else {}, [p.name for p in written],
                                      origin.as_dict(), registered.as_dict() if registered else None,
                                      event_dicts(event_results) if event_results else None))
    written.append(sidecar)
    return ReportOutcome(result, folder, written, verdicts)



# with --reanalyse, the options that still mean something (the rest are recorded in the folder's sources.json)
REANALYSE_OPTIONS = ("reanalyse", "out", "protocol", "command")
OPTION_NAMES = {"metric": "--metric", "formats": "--format", "evaluations": "--eval/--no-eval", "events": "--event",
                "heatmap_keys": "--heatmap", "plots": "--plots/--no-plots", "only_changed": "--only-changed/--all-keys"}


def _reanalyse(r: ReportRequest) -> ReportOutcome:
    """`--reanalyse FOLDER [--out DIR] [--protocol FILE]`: the folder's tables from its recorded values and options."""
    given = [f.name for f in fields(r) if f.name not in REANALYSE_OPTIONS and getattr(r, f.name) != f.default]
    if given:
        option = OPTION_NAMES.get(given[0], "--" + given[0].replace("_", "-"))
        raise RlvrlabError(f"--reanalyse takes the options recorded in {r.reanalyse}/sources.json (and --out, "
                           f"--protocol); drop {option}, or run rlvrlab report on the runs to change it")
    assert r.reanalyse is not None  # make_report calls this with --reanalyse only
    done = reanalysis.reanalyse(r.reanalyse, out=r.out, protocol=r.protocol, command=r.command)
    return ReportOutcome(done.result, done.folder, done.written, done.verdicts)


def _select(r: ReportRequest, uri: str, run_ids: list[str]) -> collect.Selection:
    """The runs: by configuration (rlvrlab's runs), or by --group-by keys (any runs; rlvrlab.report.external)."""
    if sum(bool(x) for x in (r.experiment, r.study, run_ids)) != 1:
        raise RlvrlabError("give exactly one of --experiment NAME, --study NAME or --runs ID,ID,...")
    if r.group_by is None:
        if r.seed_key is not None:
            raise RlvrlabError("--seed-key pairs runs grouped with --group-by KEY; add --group-by (a study's or "
                               "rlvrlab's runs carry their seed already)")
        return collect.select(uri, experiment=r.experiment, study=r.study, run_ids=run_ids,
                              only_changed=r.only_changed)
    if r.study:
        raise RlvrlabError("--group-by groups the runs of --experiment NAME or --runs; a --study's seed runs are "
                           "grouped by their configuration: drop --group-by or use --experiment")
    return external.select(uri, experiment=r.experiment, run_ids=run_ids, group_by=r.group_by,
                           seed_key=r.seed_key or "seed")


def _study_params(client, selection) -> dict[str, str]:
    found = client.get_experiment_by_name(selection.study)
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{T.ROLE}` = 'study'", max_results=1)
    return dict(runs[0].data.params) if runs else {}


def _eval_columns(evals, wanted: Optional[str], rarefy: int) -> list[str]:
    if evals is None:
        return []
    if wanted:
        columns = [c.strip() for c in wanted.split(",") if c.strip()]
        bad = [c for c in columns if c not in evals.statistics]
        if bad:
            raise RlvrlabError(f"--eval-stats {bad[0]!r} is not in the evaluation records; they have "
                               f"{', '.join(evals.statistics)}")
        return columns
    passes = [s for s in evals.statistics if s.startswith("pass@")]
    majs = [s for s in evals.statistics if s.startswith("maj@")]
    derived = [s for s in evals.statistics if s.startswith("distinct@")][-1:] + \
        [s for s in evals.statistics if s == f"rarefied@{rarefy}"]
    return ["avg@n", *passes, *(majs[-1:]), "diversity", *derived]


def _heatmap_keys(selection, text: Optional[str]) -> Optional[tuple[str, str]]:
    if text:
        keys = [k.strip() for k in text.split(",") if k.strip()]
        if len(keys) != 2:
            raise RlvrlabError(f"--heatmap {text!r}: give two keys, e.g. --heatmap algorithm.tau,trainer.staleness")
        return keys[0], keys[1]
    if selection.study and len(selection.swept) >= 2:
        return selection.swept[0], selection.swept[1]
    return None
