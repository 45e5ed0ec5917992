"""The report's last stage, render: the analysed report written into its folder as table.md / table.tex /
table.csv, comparisons.csv, the values the statistics were computed from (per_seed.csv, per_problem.csv), PNG plots
and sources.json (rlvrlab.report.render formats them; rlvrlab.report.plots draws)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import plots as plotting, provenance, render, verdict
from rlvrlab.report.escape import md
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
    peaks: list[dict] = field(default_factory=list)  # --peak: peaks.csv's rows (rlvrlab.report.command.peak_rows)


@dataclass
class ReportOutcome:
    """A report written (by `rlvrlab report`, or re-analysed): its numbers, its folder and files, its verdicts."""

    result: Report
    folder: Path  # where the tables were written
    written: list[Path] = field(default_factory=list)
    verdicts: Optional[verdict.Verdicts] = None  # --protocol: its verdict rules evaluated (rlvrlab.report.verdict)


def write(folder: Path, request: ReportRequest, selected: Selected, done: Analysed,
          origin: provenance.Provenance) -> list[Path]:
    """Every file of the report, sources.json last (it lists the others)."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = request.chosen_formats
    written = tables(folder, chosen, request.interval, done, request.plots)
    if done.peaks:  # --peak, with every format
        written.append(_write(folder / "peaks.csv", render.csv_text(PEAK_FIELDS, done.peaks)))
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


def tables(folder: Path, chosen: list[str], interval: str, done: Analysed, plots: bool = True) -> list[Path]:
    """table.md (with its interactions, events and verdicts), table.tex, table.csv as chosen; comparisons.csv with
    the CSV; with --interaction, interactions.csv and (plots) its heat map."""
    result = done.result
    interactions = "\n".join(interaction_markdown(result)) if result.interactions is not None else ""
    texts = {"md": render.markdown(result, interval) + ("\n" + interactions if interactions else "")
             + ("\n" + event_markdown(done.events) if done.events else "")
             + ("\n" + verdict.markdown(done.verdicts) if done.verdicts is not None else ""),
             "tex": render.latex(result, interval),
             "csv": render.to_csv(result)}
    written = [_write(folder / f"table.{fmt}", texts[fmt]) for fmt in chosen]
    if "csv" in chosen and result.comparisons:
        written.append(_write(folder / "comparisons.csv", render.comparisons_csv(result)))
    if result.interactions is not None:  # --interaction A,B: its rows and heat map, with every format
        rows = interaction_records(result)
        written.append(_write(folder / "interactions.csv", render.csv_text(INTERACTION_FIELDS, rows)))
        if plots:
            written += plotting.interaction_maps(result, folder)
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


INTERACTION_FIELDS = ["a_key", "b_key", "section", "metric", "stratum", "a_ref", "b_ref", "a", "b", "contrast", "low",
                      "high", "se", "df", "n_seeds", "seeds", "p", "p_holm", "significant", "status"]


def interaction_records(report: Report) -> list[dict]:
    """interactions.csv's rows: one per contrast (rlvrlab.report.table.InteractionRow)."""
    return [{"a_key": r.keys[0], "b_key": r.keys[1], "section": r.section, "metric": r.metric,
             "stratum": r.grid.stratum,
             "a_ref": r.grid.a_levels[0], "b_ref": r.grid.b_levels[0], "a": r.grid.a_levels[r.contrast.i],
             "b": r.grid.b_levels[r.contrast.j], "contrast": r.contrast.estimate, "low": r.contrast.low,
             "high": r.contrast.high, "se": r.contrast.se, "df": r.contrast.df, "n_seeds": r.contrast.n_seeds,
             "seeds": " ".join(map(str, r.grid.seeds)), "p": r.contrast.p, "p_holm": r.p_holm,
             "significant": r.significant, "status": r.status} for r in report.interactions or []]


PEAK_FIELDS = ["a", "b", "metric", "peak_a", "step_a", "peak_b", "step_b", "D", "p_permutation", "naive_p",
               "n_seeds"]


def interaction_markdown(report: Report) -> list[str]:
    """table.md's section of --interaction A,B: one row per contrast."""
    out = ["### Interactions (exploratory)\n",
           "Per seed: (B = b vs b0 at A = a) − (the same at A = a0); 95% t-interval over the seeds; Holm p over every "
           "contrast below; * Holm p < 0.05\n"]
    rows = [[md(r["a_key"]), md(r["b_key"]), md(r["section"]), md(r["metric"]), md(r["stratum"]) or "—",
             f"{md(r['a'])} vs {md(r['a_ref'])}", f"{md(r['b'])} vs {md(r['b_ref'])}",
             f"{r['contrast']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]{'*' if r['significant'] else ''}",
             str(r["n_seeds"]), render.p_text(r["p"]), render.p_text(r["p_holm"]), r["status"]]
            for r in interaction_records(report)]
    if not rows:
        return out + ["No complete grid of both keys (see the notes).\n"]
    return out + render.md_table(["A", "B", "section", "metric", "held at", "a", "b", "interaction [95% CI]", "seeds",
                                  "p", "Holm p", "status"], "|---|---|---|---|---|---|---|---|---:|---:|---:|---|",
                                  rows)


def _write(path: Path, text: str) -> Path:
    outputs.write_replacing(path, text)
    return path
