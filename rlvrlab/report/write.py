"""The report's last stage, render: the analysed report written into its folder as table.md / table.tex /
table.csv, comparisons.csv, the values the statistics were computed from (per_seed.csv, per_problem.csv), PNG plots
and sources.json (rlvrlab.report.render formats them; rlvrlab.report.plots draws)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import plots as plotting, provenance, render, verdict
from rlvrlab.report.events import EventResult, as_dict as event_dicts, markdown as event_markdown
from rlvrlab.report.request import ReportRequest
from rlvrlab.report.sources import Selected
from rlvrlab.report.table import Report, lower_is_better


@dataclass
class Analysed:
    """What the analysis stage gives render: the report, its events, its protocol's verdicts and registration."""

    result: Report
    events: list[EventResult]
    verdicts: Optional[verdict.Verdicts] = None
    registered: Optional[provenance.Protocol] = None


def write(folder: Path, request: ReportRequest, selected: Selected, done: Analysed,
          origin: provenance.Provenance) -> list[Path]:
    """Every file of the report, sources.json last (it lists the others)."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = request.chosen_formats
    written = tables(folder, chosen, request.interval, done)
    if "csv" in chosen:  # the numbers behind every cell and comparison, for a reader to recompute them
        written += values(folder, selected, done)
    if request.plots:
        written += plots(folder, request, selected, done.result)
    if selected.evals is not None and "csv" in chosen:  # pass@k and coverage@k over k = 1..64 with bands
        from rlvrlab.report import passk_curve

        written += passk_curve.write(selected.evals, folder, plot=request.plots)
    sidecar = folder / "sources.json"
    evals = selected.evals
    outputs.write_replacing(sidecar, render.sources(
        selected.selection, done.result, list(request.command), evals.eval_runs if evals else {},
        [p.name for p in written], origin.as_dict(), done.registered.as_dict() if done.registered else None,
        event_dicts(done.events) if done.events else None))
    return [*written, sidecar]


def tables(folder: Path, chosen: list[str], interval: str, done: Analysed) -> list[Path]:
    """table.md (with its events and verdicts), table.tex, table.csv as chosen; comparisons.csv with the CSV."""
    result = done.result
    texts = {"md": render.markdown(result, interval) + ("\n" + event_markdown(done.events) if done.events else "")
             + ("\n" + verdict.markdown(done.verdicts) if done.verdicts is not None else ""),
             "tex": render.latex(result, interval),
             "csv": render.to_csv(result)}
    written = [_write(folder / f"table.{fmt}", texts[fmt]) for fmt in chosen]
    if "csv" in chosen and result.comparisons:
        written.append(_write(folder / "comparisons.csv", render.comparisons_csv(result)))
    return written


def values(folder: Path, selected: Selected, done: Analysed) -> list[Path]:
    """per_seed.csv (and per_problem.csv for evaluations): the values the statistics read."""
    written = [_write(folder / "per_seed.csv", render.per_seed_csv(done.result, selected.data, done.events))]
    if selected.evals is not None and selected.eval_stats:
        written.append(_write(folder / "per_problem.csv",
                              render.per_problem_csv(done.result, selected.data, selected.evals.datasets)))
    return written


def plots(folder: Path, request: ReportRequest, selected: Selected, result: Report) -> list[Path]:
    """Training curves (from MLflow histories), pass@k curves and a study's heatmap."""
    selection, evals, written = selected.selection, selected.evals, []
    if selected.client is not None:
        for name in dict.fromkeys(spec.name for spec in selected.specs):
            written.append(plotting.training_curves(selected.client, selection, name, folder, request.smooth))
    if evals is not None:
        for dataset in evals.datasets:
            curves = plotting.passk_curves(selection, evals, dataset, folder)
            if curves is not None:
                written.append(curves)
    keys = heatmap_keys(selection, request.heatmap_keys)
    if keys is not None:
        first = selected.specs[0].label
        means = {c.group: c.mean for c in result.estimates if c.section == "train" and c.metric == first}
        written.append(plotting.heatmap(selection, means, keys, first, folder, not lower_is_better(first)))
    return written


def heatmap_keys(selection, text: Optional[str]) -> Optional[tuple[str, str]]:
    """--heatmap KEY1,KEY2, else a study's first two swept keys, else none."""
    if text:
        keys = [k.strip() for k in text.split(",") if k.strip()]
        if len(keys) != 2:
            raise RlvrlabError(f"--heatmap {text!r}: give two keys, e.g. --heatmap algorithm.tau,trainer.staleness")
        return keys[0], keys[1]
    if selection.study and len(selection.swept) >= 2:
        return selection.swept[0], selection.swept[1]
    return None


def _write(path: Path, text: str) -> Path:
    outputs.write_replacing(path, text)
    return path
