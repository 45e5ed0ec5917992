"""`rlvrlab report`'s options, defined once: each field of ReportRequest is an option with its flag, help and
default (its `Option` metadata), and its checks are the request's methods. rlvrlab.cli.report builds the typer
command from these fields; rlvrlab.report.reanalyse parses a recorded command with the same flags."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from rlvrlab import outputs
from rlvrlab.config.flags import Option as Option, option as _opt
from rlvrlab.errors import RlvrlabError
from rlvrlab.report.columns import REDUCTIONS

FORMATS = ("md", "tex", "csv")
INTERVALS = ("bracket", "pm")
SOURCES = ("mlflow", "csv", "tensorboard")  # --source KIND[:PATH] (rlvrlab.report.sources)


@dataclass(frozen=True)
class ReportRequest:
    """One `rlvrlab report` invocation: the options of the command, with their defaults (docs/report.md)."""

    experiment: Optional[str] = _opt(None, "--experiment", "The training runs of this MLflow experiment (with "
                                     "--group-by: any runs of it).")
    study: Optional[str] = _opt(None, "--study", "The seed runs of this sweep study.")
    runs: Optional[str] = _opt(None, "--runs", "Comma-separated MLflow run ids.")
    source: Optional[str] = _opt(None, "--source", "Runs from files instead of MLflow: csv:FILE (one row per seed "
                                 "run: group keys, seed, one column per metric's final value) or tensorboard:DIR "
                                 "(a folder of run folders with event files); docs/report.md, \"Sources\".")
    group_by: Optional[str] = _opt(None, "--group-by", "Group any MLflow runs (e.g. TRL's or verl's) of --experiment "
                                   "or --runs by these params or tags, KEY[,KEY] (a param, else a tag; params.KEY or "
                                   "tags.KEY to say which), instead of by rlvrlab's config hash; with --source: the "
                                   "columns or hparams to group by [default: every one that differs].")
    seed_key: Optional[str] = _opt(None, "--seed-key", "With --group-by: the param or tag holding each run's integer "
                                   "seed; groups with the same seeds are paired [default: seed].")
    baseline: Optional[str] = _opt(None, "--baseline", "Compare every group with this one (an algorithm name or a "
                                   "group label).")
    metric: tuple[str, ...] = _opt((), "--metric", "Training metric(s) for the table and curves, each "
                                   "NAME[:REDUCE[:LAST]] (repeat or comma-separate), e.g. "
                                   "loss/grad_norm:max:60,train/reward:mean:20; default: the study's objective, "
                                   "else train/reward.")
    last: Optional[int] = _opt(None, "--last", "Per run: reduce a metric over its last N steps unless it says "
                               "(default: the study's window, else 10).", minimum=1)
    reduce: str = _opt("mean", "--reduce", "mean | max | min | auc (area under the curve per step) over those "
                       "steps, unless the metric says.", shown=True)
    compare: tuple[str, ...] = _opt((), "--compare", "Extra comparisons A:B (group labels or algorithm names; "
                                    "repeat or comma-separate); best:B compares the best group (selected, adjusted "
                                    "over the candidates) with B; A:B[m1|m2] tests it on those columns only. All "
                                    "comparisons of a report are one Holm family.")
    target_halfwidth: Optional[float] = _opt(None, "--target-halfwidth", "Print, per group and metric, the seeds "
                                             "needed for a 95% interval of this half-width.", minimum=0.0)
    rarefy: int = _opt(4, "--rarefy", "rarefied@M: expected distinct correct forms among M correct responses "
                       "(problems with at least M).", shown=True, minimum=1)
    allow_dirty: bool = _opt(False, "--allow-dirty", "Write into results/ although some runs were trained from a "
                             "tree with uncommitted changes (the table says so).", shown=True)
    allow_mixed: bool = _opt(False, "--allow-mixed", "Write into results/ although the runs come from more than one "
                             "commit, or comparing groups started from different initial models (the table says "
                             "so).", shown=True)
    evaluations: bool = _opt(True, "--eval/--no-eval", "Include the runs' `rlvrlab eval pass-at-k` records (when "
                             "they have any).", shown=True)
    eval_stats: Optional[str] = _opt(None, "--eval-stats", "Evaluation columns, e.g. "
                                     "avg@n,pass@1,pass@16,maj@16,diversity (default: avg@n, every pass@k, the "
                                     "largest maj@k, diversity).")
    formats: str = _opt("md,tex,csv", "--format", "Any of md,tex,csv.", shown=True)
    out: Optional[Path] = _opt(None, "--out", "Output folder (default results/<experiment or study>).")
    interval: str = _opt("bracket", "--interval", "bracket: mean [lo, hi]; pm: mean ± half-width.", shown=True)
    heatmap_keys: Optional[str] = _opt(None, "--heatmap", "Two swept keys KEY1,KEY2 for a study's heatmap (default: "
                                       "its first two).")
    plots: bool = _opt(True, "--plots/--no-plots", "Write PNG plots.", shown=True)
    smooth: int = _opt(1, "--smooth", "Moving average (steps) for training curves.", shown=True, minimum=1)
    only_changed: bool = _opt(True, "--only-changed/--all-keys", "Label groups by the config keys that differ "
                              "between them, or by every key.", shown=True)
    tracking_uri: Optional[str] = _opt(None, "--tracking-uri", "MLflow URI (default: "
                                       "sqlite:///<output-dir>/mlflow.db).")
    events: tuple[str, ...] = _opt((), "--event", "An event in the training curves, 'NAME: METRIC OP VALUE [for K] | "
                                   "... | nonfinite' (VALUE may be F*initial); its rate per group with exact intervals "
                                   "and exact tests against --baseline. Repeatable.")
    protocol: Optional[Path] = _opt(None, "--protocol", "The study's protocol file: its commits go into "
                                    "sources.json, the table says whether the study was pre-registered (committed, "
                                    "unchanged since before the first run), and its verdict rules (docs/report.md) "
                                    "are evaluated.")
    equivalence: Optional[str] = _opt(None, "--equivalence", "Equivalence tests (TOST) at this margin, in the "
                                      "metric's units: M for every column, or NAME=M per column, comma-separated; "
                                      "they join the Holm family, and a row reads 'equivalent within ±M' when its "
                                      "Holm p < 0.05.")
    simultaneous: bool = _opt(False, "--simultaneous", "Add to comparisons.csv, for every group against --baseline "
                              "per column, intervals that hold jointly (max-t on paired seeds, 95% family-wise "
                              "coverage): sim_low, sim_high, sim_crit, sim_bonferroni (docs/report.md, \"Simultaneous "
                              "intervals\").", shown=True)
    interaction: tuple[str, ...] = _opt((), "--interaction", "Test the A x B interaction of two config keys A,B "
                                        "(e.g. algorithm.tau,trainer.staleness; repeat for more pairs) on the "
                                        "per-seed values, seeds as blocks, Holm over every contrast: "
                                        "interactions.csv, a table.md section and interaction_<A>_<B>.png "
                                        "(docs/report.md, \"Interactions\").")
    peak: tuple[str, ...] = _opt((), "--peak", "Compare a training metric's peak (the max over steps of its mean "
                                 "curve over seeds) between every group and --baseline (and the --compare pairs) on "
                                 "their shared seeds and steps, its null by swapping arm labels within seeds: "
                                 "peaks.csv (docs/report.md, \"Peaks\"). Repeat for more metrics.")
    reanalyse: Optional[Path] = _opt(None, "--reanalyse", "Re-compute the tables of this results folder from its "
                                     "recorded values (per_seed.csv, per_problem.csv) and options (sources.json), "
                                     "without the runs; with --out (default: the folder itself), --protocol, "
                                     "--simultaneous and --interaction only.")
    output_dir: Path = _opt(Path("runs"), "--output-dir", "The runs' output_dir (for the default MLflow store).",
                            shown=True)
    command: tuple[str, ...] = ("rlvrlab", "report")  # recorded in sources.json (no option)

    @property
    def interaction_pairs(self) -> tuple[tuple[str, str], ...]:
        """Each --interaction A,B as (A, B), in order, once each."""
        return interaction_pairs(self.interaction)

    @property
    def chosen_formats(self) -> list[str]:
        return [f.strip() for f in self.formats.split(",") if f.strip()]

    @property
    def run_ids(self) -> list[str]:
        return [r.strip() for r in (self.runs or "").split(",") if r.strip()]

    @property
    def source_kind(self) -> tuple[str, Optional[Path]]:
        """("mlflow", None) or ("csv" | "tensorboard", PATH) from --source KIND:PATH."""
        if self.source is None:
            return "mlflow", None
        kind, sep, path = self.source.partition(":")
        if kind not in SOURCES or (kind != "mlflow" and not (sep and path)) or (kind == "mlflow" and path):
            raise RlvrlabError(f"--source {self.source!r}: give csv:FILE or tensorboard:DIR (or mlflow)")
        return kind, Path(path) if path else None

    def check(self) -> None:
        """The options' own checks, before any run is read (one-line RlvrlabErrors)."""
        chosen = self.chosen_formats
        if not chosen or any(f not in FORMATS for f in chosen):
            raise RlvrlabError(f"--format {self.formats!r}: use any of {', '.join(FORMATS)}, comma-separated")
        if self.interval not in INTERVALS:
            raise RlvrlabError(f"--interval {self.interval!r}: use bracket or pm")
        if self.reduce not in REDUCTIONS:
            raise RlvrlabError(f"--reduce {self.reduce!r}: use {', '.join(REDUCTIONS)}")
        out = self.out
        outputs.check_dir(out if out is not None else Path("results"), f"--out {out}" if out is not None else "results")
        if self.target_halfwidth is not None and not self.target_halfwidth > 0:
            raise RlvrlabError(f"--target-halfwidth {self.target_halfwidth}: give a half-width > 0, e.g. 0.02")
        if self.simultaneous and self.baseline is None:
            raise RlvrlabError("--simultaneous compares every group with --baseline; give --baseline GROUP")
        _ = self.interaction_pairs  # its check
        if self.peak and self.baseline is None and not self.compare:
            raise RlvrlabError("--peak compares groups' peaks; give --baseline GROUP (or --compare A:B)")
        if self.source_kind[0] != "mlflow":
            self._check_file_source()

    def _check_file_source(self) -> None:
        given = self.given()
        mlflow_only = [name for name in MLFLOW_ONLY if name in given]
        if mlflow_only:
            raise RlvrlabError(f"--source {self.source} reads no MLflow runs; drop {flag_of(mlflow_only[0])}")
        per_step = [name for name in PER_STEP if name in given]
        if per_step and self.source_kind[0] == "csv":
            raise RlvrlabError(f"--source {self.source}: {flag_of(per_step[0])} reads each run's per-step series and a "
                               "CSV has one value per seed run; drop it, or report the runs' logged steps "
                               "(--source tensorboard:DIR, or their MLflow runs)")

    def given(self, *, but: tuple[str, ...] = ()) -> list[str]:
        """The fields set to something other than their default, except `but`."""
        return [f.name for f in fields(self) if f.name not in but and getattr(self, f.name) != f.default]


# with --source csv:FILE or tensorboard:DIR, the options that select or read MLflow runs (refused)
MLFLOW_ONLY = ("experiment", "study", "runs", "seed_key", "tracking_uri", "output_dir", "eval_stats", "heatmap_keys")
# the options that read each run's per-step series (events, training curves, peaks): MLflow histories, TensorBoard
# scalars; refused with --source csv:FILE
PER_STEP = ("events", "smooth", "peak")


def interaction_pairs(given: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`A,B` values (of --interaction, or as a results folder records them) as (A, B) pairs, once each."""
    pairs = []
    for text in given:
        keys = [k.strip() for k in text.split(",") if k.strip()]
        if len(keys) != 2 or keys[0] == keys[1]:
            raise RlvrlabError(f"--interaction {text!r}: give two different config keys A,B, e.g. "
                               "--interaction algorithm.tau,trainer.staleness")
        pairs.append((keys[0], keys[1]))
    return tuple(dict.fromkeys(pairs))


def options() -> list[tuple[str, Option]]:
    """(field name, Option) of every command-line option, in the command's order."""
    return [(f.name, f.metadata["cli"]) for f in fields(ReportRequest) if "cli" in f.metadata]


def flag_of(name: str) -> str:
    """A field's option as a user types it (`--format`, `--eval/--no-eval`)."""
    return dict(options())[name].flag


def value_options() -> tuple[str, ...]:
    """The options that take a value (repeatable ones included)."""
    return tuple(f.metadata["cli"].flag for f in fields(ReportRequest)
                 if "cli" in f.metadata and not isinstance(f.default, bool))


def switch_flags() -> tuple[str, ...]:
    """The flags that take no value (both halves of a --x/--no-x switch)."""
    return tuple(flag for f in fields(ReportRequest) if "cli" in f.metadata and isinstance(f.default, bool)
                 for flag in f.metadata["cli"].flags)
