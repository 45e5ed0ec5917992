"""What `rlvrlab sweep` and `rlvrlab reproduce` print, as plain text cells (rlvrlab.eval.view.Table) and lines:
a study's trials, best configuration and records; a reproduction's header, per-seed, per-group, per-comparison and
identity tables and its verdict. The commands only draw them."""

from __future__ import annotations

from typing import Optional

from rlvrlab.eval.view import Table

STATE_ORDER = {"COMPLETE": 0, "RUNNING": 1, "WAITING": 2, "PRUNED": 3, "FAIL": 4}


def _short(keys: list[str]) -> list[str]:
    """Column labels: the last part of each dotted key, unless two keys share it."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return [tail if last.count(tail) == 1 else key for key, tail in zip(keys, last)]


def _more(row, most: int) -> str:
    """Seeds still needed for the target half-width; those beyond the sweep's max are marked."""
    if row.more_seeds is None:
        return ""
    if row.seeds_done + row.more_seeds > most:
        return f"{row.more_seeds} (> max {most})"
    return str(row.more_seeds)


def _note(row) -> str:
    return "; ".join(part for part in (
        row.reason, f"retry of trial {row.retry_of}" if row.retry_of is not None else "",
        "re-run by a later attempt" if row.retried and row.state == "FAIL" else "") if part)


def study_table(spec, summary) -> Table:
    """A study's trials, best first among the complete ones (then running, waiting, pruned, failed); the best trial
    is the marked row. The optimised value has its own column when it is not the mean (a bound)."""
    from rlvrlab.sweep.objective import MEAN
    from rlvrlab.sweep.spec import format_value

    keys, objective, adaptive = [p.key for p in spec.space], spec.objective, spec.adaptive
    bound = objective.aggregate != MEAN.name  # the optimised value differs from the mean: show both
    seeds_text = (f"seeds {adaptive.initial}-{adaptive.max} until ±{adaptive.halfwidth:g}" if adaptive
                  else f"{len(spec.seeds)} seeds")
    interval = ("95% interval of Stein's two-stage rule (t on the first stage's spread)" if adaptive
                else "95% t-interval over seeds")
    attempts = any(row.attempt > 1 for row in summary.rows)  # a retried study: which attempt each trial is
    columns = ["trial", "state", *(["attempt"] if attempts else []), *_short(keys),
               *([objective.aggregate] if bound else []), "mean", "95% CI", "±", "seeds",
               *(["more seeds"] if adaptive else []), "note"]
    sign = -1 if objective.direction == "maximize" else 1
    ordered = sorted(summary.rows, key=lambda r: (STATE_ORDER[r.state], sign * r.value if r.value is not None else 0,
                                                  r.number))
    rows: list[list[str]] = []
    marked: set[int] = set()
    for row in ordered:
        if summary.best is not None and row.number == summary.best.number:
            marked.add(len(rows))
        rows.append([str(row.number), row.state, *([str(row.attempt)] if attempts else []),
                     *[format_value(row.params.get(k, "")) for k in keys],
                     *([] if not bound else ["" if row.value is None else f"{row.value:.3f}"]),
                     "" if row.mean is None else f"{row.mean:.3f}",
                     f"[{row.low:.3f}, {row.high:.3f}]" if row.low is not None else "",
                     "" if row.halfwidth is None else f"{row.halfwidth:.3f}", str(row.seeds_done),
                     *([_more(row, adaptive.max)] if adaptive else []), _note(row)])
    last = len(columns) - 1  # the note: aligned left and wrapped; state aligned left
    return Table(f"study {spec.name}: {objective.metric} (last {objective.window} steps), {objective.direction}, "
                 f"{seeds_text}; {interval}", columns, rows, right=frozenset(range(len(columns))) - {1, last},
                 nowrap=frozenset(range(last)), marked=frozenset(marked))


def study_lines(opened, summary) -> list[str]:
    """Below a study's table: trials done, the best configuration, and where its records are (or, for a study
    whose start-up stopped, how to finish it)."""
    from rlvrlab.sweep.confirmation import confirmation_line
    from rlvrlab.sweep.spec import format_value
    from rlvrlab.tracking.mlflow_tracker import ui_hint
    from rlvrlab.tracking.store import masked

    spec, storage = opened.spec, masked(opened.storage_url)
    lines = [f"{summary.finished}/{summary.total if summary.total is not None else '?'} trials done"]
    if spec.pruner.type == "sequential":
        lines.append(sequential_line(spec, summary))
    if summary.best is not None:
        shown = " ".join(f"{k}={format_value(v)}" for k, v in summary.best.params.items())
        lines.append(f"best: trial {summary.best.number}: {shown} -> {summary.best.value:.4f}")
    if summary.confirmation:
        lines.append(confirmation_line(summary.confirmation))
    if not opened.started:  # --status of a study whose start-up stopped (killed, a store that was held)
        return [*lines, f"study {spec.name!r} in {storage}: its start-up stopped before it was done; re-run the "
                        "sweep command without --status to finish it and run the trials"]
    password = "   (with your password for ***)" if "***" in storage else ""
    ui = ui_hint(opened.mlflow_uri, opened.study_run_id)
    return [*lines, f"records: Optuna study {spec.name!r} in {storage}; MLflow experiment {spec.name!r} (study run "
                    f"{opened.study_run_id}) in {opened.mlflow_uri}",
            f"  look at them: optuna-dashboard {storage}{password}   |   {ui}"]


def reproduce_header(o) -> list[str]:
    """What a reproduction re-runs, and whether its code is the recorded commit's."""
    sha, dirty = o.checkout
    same = o.recorded_commits == [sha]
    if same:
        versus = "same commit, with uncommitted changes here" if dirty else "same commit"
    else:
        versus = "DIFFERENT: the re-runs run this checkout's code" + (", with uncommitted changes" if dirty else "")
    lines = [f"reproduce {o.folder} (study {o.study}, sweep file {o.sweep_file}), seeds "
             f"{' '.join(map(str, o.seeds))} of {o.committed_seeds}",
             f"RECORDED COMMIT: {', '.join(c[:12] for c in o.recorded_commits)}   THIS CHECKOUT: {sha[:12]}"
             f"{' (dirty)' if dirty else ''}   ({versus})"]
    if o.at_commit:
        lines.append(f"RE-RUN WITH THE CODE OF THE RECORDED COMMIT {o.at_commit[:12]} (a temporary shared clone, "
                     "removed after), not this checkout's")
    elif not same:
        lines.append("  to re-run with the recorded commit's code: add --at-recorded-commit "
                     "(docs/reproducibility.md)")
    return lines


def _number(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.6g}"


def _lands(inside: Optional[bool]) -> str:
    return "-" if inside is None else "inside" if inside else "outside"


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    """A reproduction table; a row with a value outside, a failed run or a differing identity is marked."""
    return Table(title, columns, rows, marked=frozenset(
        i for i, row in enumerate(rows) if any(cell.startswith(("OUTSIDE", "run failed", "differs")) for cell in row)))


def reproduce_tables(o) -> list[Table]:
    """Per seed, per group, per comparison (when there are any) and the recorded identity."""
    n, s = len(o.seeds), "s" * (len(o.seeds) != 1)
    seeds = [[r.group, r.metric, str(r.seed), _number(r.committed), _number(r.rerun), _number(r.difference),
              f"[{r.low:.4g}, {r.high:.4g}]", r.status + (f": {r.failed}" if r.failed else "")] for r in o.rows]
    groups = [[g.group, g.metric, f"{g.mean:.4g} [{g.low:.4g}, {g.high:.4g}] ({g.n_committed} seeds)",
               _number(g.committed_mean), _number(g.rerun_mean), _lands(g.inside)] for g in o.groups]
    comparisons = [[f"{c.a} - {c.b}", c.metric, f"{c.delta:.4g} [{c.low:.4g}, {c.high:.4g}]",
                    f"{_number(c.rerun_delta)} ({c.n} paired seed{'s' * (c.n != 1)})", _lands(c.inside)]
                   for c in o.comparisons]
    return [
        _table("per seed", ["group", "metric", "seed", "committed", "re-run", "|difference|", "committed interval",
                            "lands"], seeds),
        _table("per group", ["group", "metric", "committed mean [95% CI]", f"committed, these {n} seed{s}",
                             f"re-run, {n} seed{s}", "re-run mean lands"], groups),
        *([_table("per comparison", ["a - b", "metric", "committed delta [95% CI]", "re-run delta",
                                     "re-run delta lands"], comparisons)] if comparisons else []),
        _table("recorded identity", ["what", "committed runs", "re-runs", "verdict"],
               [[i.what, i.committed, i.rerun, i.verdict] for i in o.identities]),
    ]


def reproduce_footer(o) -> list[str]:
    """The verdict lines, where the re-runs are recorded, and the exit code."""
    return [*o.footer(), f"re-runs: {o.output_dir} (MLflow experiment {o.study}-reproduce); exit {o.exit_code}"]


def sequential_line(spec, summary) -> str:
    """pruner: sequential: the trials it stopped early and the seed runs that saved (also a tag of the study run, which
    `rlvrlab report --study` prints)."""
    return (f"sequential seeds (delta {spec.pruner.delta:g}): {summary.pruned_early} trials pruned early, "
            f"{summary.seeds_saved} seed runs saved")
