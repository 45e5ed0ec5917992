"""Select from MLflow (the default source of `rlvrlab report`): rlvrlab's runs grouped by configuration
(rlvrlab.report.collect), or any runs grouped by --group-by params or tags (rlvrlab.report.external), with their
evaluation records, as a rlvrlab.report.sources.Selected."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.report import collect, external
from rlvrlab.report.columns import Equivalence, Pair, parse_metrics
from rlvrlab.report.request import ReportRequest
from rlvrlab.report.sources import Selected
from rlvrlab.report.table import check_columns, stage_one_of, values_from_runs
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.store import default_uri


def from_mlflow(path: Optional[Path], r: ReportRequest, pairs: Sequence[Pair],
                equivalence: Optional[Equivalence]) -> Selected:
    """rlvrlab's runs by configuration, or any runs by --group-by, with their evaluation records (--eval)."""
    output_dir = Path(r.output_dir)
    uri = r.tracking_uri or default_uri(output_dir)
    if r.tracking_uri is None and not (output_dir / "mlflow.db").is_file():
        raise RlvrlabError(f"no MLflow store at {output_dir / 'mlflow.db'}; pass --output-dir of the runs or "
                           "--tracking-uri")
    selection = _runs(r, uri)
    client = collect.client_for(uri)
    study_params, study_tags = _study_run(client, selection) if r.study else ({}, {})
    last = r.last or int(study_params.get("objective.window", 10))
    specs = parse_metrics(list(r.metric) or [study_params.get("objective.metric", "train/reward")], reduce=r.reduce,
                          last=last)
    available = collect.available_metrics(client, selection)
    for spec in specs:
        if spec.name not in available:
            from rlvrlab.config.rules import unknown

            raise unknown("metric", spec.name, available, where=f"the runs of {selection.experiment!r}")
    evals = collect.eval_records(client, selection, rarefy=r.rarefy) if r.evaluations else None
    columns = eval_columns(evals, r.eval_stats, r.rarefy)
    check_columns([m.label for m in specs] + columns, selection.groups, r.baseline, list(pairs), equivalence)
    data = values_from_runs(client, selection.groups, specs, evals, columns)
    searched = [f"study {selection.study}: {study_tags[tag]}" for tag in (T.SEQUENTIAL_LINE, T.CONFIRMATION_LINE)
                if tag in study_tags]  # the sweep's sequential seeds and confirm: (docs/sweeps.md)
    return Selected(selection, specs, data, columns, evals, client, stage_one_of(study_params),
                    notes=external.notes(selection) + searched)


def _runs(r: ReportRequest, uri: str) -> collect.Selection:
    """The runs: by configuration (rlvrlab's runs), or by --group-by keys (any runs; rlvrlab.report.external)."""
    run_ids = r.run_ids
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


def _study_run(client, selection) -> tuple[dict[str, str], dict[str, str]]:
    """The study run's params and tags ({} when the study has none)."""
    found = client.get_experiment_by_name(selection.study)
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{T.ROLE}` = 'study'", max_results=1)
    return (dict(runs[0].data.params), dict(runs[0].data.tags)) if runs else ({}, {})


def eval_columns(evals, wanted: Optional[str], rarefy: int) -> list[str]:
    """--eval-stats, checked against the records; by default avg@n, every pass@k, the largest maj@k, diversity."""
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
