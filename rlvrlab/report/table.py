"""The numbers of a report: one Estimate per (group, section, metric) with its interval, and one Comparison per
pair of groups compared on a column, all comparisons of one report in one Holm family. Sections: "train" (training
metrics, one value per seed) and one per evaluation dataset (per seed and problem). The statistics are in
rlvrlab.stats. An adaptive-seed study's training metrics take Stein's two-stage interval and paired test
(stats.stein; _stein says which groups). values_from_runs reads the values from MLflow, analyse analyses them;
what is asked (metrics, comparisons, margins) is parsed in rlvrlab.report.columns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from rlvrlab import stats
from rlvrlab.errors import RlvrlabError
from rlvrlab.report.collect import EvalRecords, Group, Selection, final_values
from rlvrlab.report.columns import BEST, Equivalence, MetricSpec, Pair, max_statistic
from rlvrlab.stats.interaction import Contrast, Grid, grids, interaction as interaction_contrasts
from rlvrlab.stats.simultaneous import Simultaneous, simultaneous as joint_intervals


@dataclass
class Estimate:
    """One (group, section, metric) of the report: its mean and interval. Its comparison with the baseline is in
    Report.comparisons (Report.versus_baseline finds it)."""

    group: str
    section: str  # "train" or an evaluation dataset
    metric: str
    mean: float
    n_seeds: int
    n_problems: int = 0
    low: Optional[float] = None  # the interval: Student t over seeds (training), crossed seeds x problems (evaluation)
    high: Optional[float] = None
    se: Optional[float] = None
    df: Optional[float] = None
    method: str = ""
    seed_low: Optional[float] = None  # evaluations: the t-interval of the seed scores (the benchmark held fixed)
    seed_high: Optional[float] = None
    seeds_needed: Optional[int] = None  # for --target-halfwidth (None: not asked, or unreachable)
    note: str = ""

    @property
    def flagged(self) -> bool:
        return self.n_seeds < stats.MIN_SEEDS

    @property
    def bounds(self) -> Optional[tuple[float, float]]:
        """(low, high) of the interval; None when the estimate has none."""
        return None if self.low is None or self.high is None else (self.low, self.high)


@dataclass
class Comparison:
    """One comparison of the report's family: a vs b on one column, its test (stats.Comparison) and its place in
    the family (Holm p, the claim, the TOST)."""

    a: str
    b: str
    section: str
    metric: str
    result: stats.Comparison
    selected_from: Optional[int] = None  # a was picked as the best of this many groups
    p_family: float = math.nan  # p entering Holm: result.p, times selected_from for a selected cell
    p_holm: float = math.nan
    max_statistic: bool = False  # a per-run extreme (max_statistic): a claim also needs the sign-flip p
    claim: Optional[stats.Claim] = None  # the claim rule's verdict and MDE in the family (set once Holm is done)
    margin: Optional[float] = None  # --equivalence: the TOST margin of this row's column (None: no TOST)
    p_equivalence: float = math.nan  # TOST p (stats.equivalence_p)
    p_equivalence_family: float = math.nan  # entering Holm: times selected_from for a selected cell
    p_equivalence_holm: float = math.nan
    simultaneous: Optional[Simultaneous] = None  # --simultaneous: the joint intervals of its column's baseline rows
    sim_index: int = -1  # this row's place in them

    @property
    def significant(self) -> bool:
        """A claim: Holm p < 0.05, >= 5 seeds per group, and for a max-statistic the sign-flip p (stats.claim)."""
        return self.claim.claim if self.claim is not None else False

    @property
    def equivalent(self) -> bool:
        """Equivalence shown within ±margin: the TOST's Holm p < 0.05 with >= 5 seeds per group (the claim rule's
        seeds; a non-rejection of the difference test is never this). Not on a max-statistic: its one-sided t is
        what skew misleads (docs/report.md, "Skewed data"), and the sign-flip check of a claim has no TOST form."""
        return self.margin is not None and self.p_equivalence_holm < stats.ALPHA and \
            self.result.may_be_significant and not self.max_statistic

    @property
    def name(self) -> str:
        return f"{self.a} vs {self.b}" + (f" (selected: best of {self.selected_from})" if self.selected_from else "")


@dataclass
class Report:
    estimates: list[Estimate]
    groups: list[Group]
    baseline: Optional[str]
    sections: list[str]
    metrics: dict[str, list[str]]  # section -> metric columns
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    target_halfwidth: Optional[float] = None
    equivalence: Optional[Equivalence] = None
    stage_one: Optional[int] = None  # n0 of an adaptive-seed study (Stein's two-stage rule); None: fixed seeds
    simultaneous: bool = False  # --simultaneous: the baseline rows carry joint intervals (comparisons.csv sim_*)
    interactions: Optional[list[InteractionRow]] = None  # --interaction A,B (each pair): contrasts, one Holm family

    @property
    def family_size(self) -> int:
        """The tests Holm adjusts together: every comparison, and with --equivalence every TOST."""
        return len(self.comparisons) + sum(r.margin is not None for r in self.comparisons)

    def versus_baseline(self) -> dict[tuple[str, str, str], Comparison]:
        """(group, section, metric) -> that group's comparison with the baseline (not a selected cell's)."""
        return {(r.a, r.section, r.metric): r for r in self.comparisons
                if r.b == self.baseline and r.selected_from is None}

    def estimate_of(self) -> dict[tuple[str, str, str], Estimate]:
        """(group, section, metric) -> its estimate."""
        return {(e.group, e.section, e.metric): e for e in self.estimates}


def lower_is_better(metric: str) -> bool:
    name = metric.split(":")[0]
    return name.startswith(("time/", "loss/")) or name in ("rollout/lag", "rollout/logp_gap_max",
                                                           "rollout/logp_gap_mean")


def stage_one_of(study_params: dict[str, str]) -> Optional[int]:
    """n0 of an adaptive-seed study from its study run's params (`seeds.adaptive`: "initial=5 max=20 halfwidth=0.02",
    rlvrlab.sweep.study), None for fixed seeds or a report of no study."""
    try:
        return stats.stage_one_size(study_params.get("seeds.adaptive"))
    except ValueError as e:
        raise RlvrlabError(f"the study run's param {e}; re-run the study with this rlvrlab version or report it with "
                           "--experiment") from None


def find_group(groups: list[Group], name: str, option: str = "--baseline") -> Group:
    exact = [g for g in groups if g.label == name]
    by_algorithm = [g for g in groups if g.algorithm == name]
    matches = exact or by_algorithm
    if len(matches) == 1:
        return matches[0]
    labels = ", ".join(repr(g.label) for g in groups)
    if not matches:
        raise RlvrlabError(f"{option} {name!r} matches no group; groups: {labels}")
    raise RlvrlabError(f"{option} {name!r} matches {len(matches)} groups; give one label: {labels}")


def find_baseline(groups: list[Group], name: Optional[str]) -> Optional[Group]:
    """The --baseline group, None when none was given."""
    return None if name is None else find_group(groups, name)


def values_from_runs(client, groups: Sequence[Group], metrics: Sequence[MetricSpec], evals: Optional[EvalRecords],
                     eval_stats: Sequence[str]) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """The arrays the statistics are fed: (section, metric) -> group label -> [S] (each seed run's reduced value,
    collect.final_values) or [S, P] (an evaluation's seeds x problems), training metrics first, in group seed order."""
    data = {("train", m.label): {g.label: final_values(client, g, m.name, m.last, m.reduce) for g in groups}
            for m in metrics}
    matrices = evals.matrices if evals is not None else {}
    for dataset in evals.datasets if evals is not None else ():
        data.update({(dataset, stat): {g.label: matrices[(g.label, dataset, stat)] for g in groups}
                     for stat in eval_stats})
    return data


def check_columns(columns_given: list[str], groups: list[Group], baseline: Optional[str], pairs: Sequence[Pair],
                  equivalence: Optional[Equivalence]) -> None:
    """--baseline, --compare and --equivalence name groups and columns of this report (one-line errors)."""
    find_baseline(groups, baseline)
    for pair in pairs:
        find_group(groups, pair.b, "--compare")
        if pair.a != BEST:
            find_group(groups, pair.a, "--compare")
        unknown = [m for m in pair.metrics if m not in columns_given]
        if unknown:
            raise RlvrlabError(f"--compare {pair.a}:{pair.b}[...]: {unknown[0]!r} is not a column of this report; "
                               f"columns: {', '.join(columns_given)}")
    for label, _ in equivalence.by_label if equivalence else ():
        if label not in columns_given:
            raise RlvrlabError(f"--equivalence {label}=...: {label!r} is not a column of this report; columns: "
                               f"{', '.join(columns_given)}")


def analyse(selection: Selection, data: dict[tuple[str, str], dict[str, np.ndarray]], *,
            metrics: Sequence[MetricSpec], eval_stats: Sequence[str], baseline: Optional[str],
            pairs: Sequence[Pair] = (), target_halfwidth: Optional[float] = None,
            equivalence: Optional[Equivalence] = None, stage_one: Optional[int] = None, simultaneous: bool = False,
            interaction: Sequence[tuple[str, str]] = ()) -> Report:
    """The report of given values (values_from_runs, or a folder's per-seed values: rlvrlab.report.reanalyse):
    estimates, comparisons in one Holm family, notes. eval_stats: the columns of each evaluation section (after
    "train"). simultaneous: joint intervals for the baseline rows (add_simultaneous); interaction: (A, B) pairs of
    config keys whose interaction contrasts are tested (interaction_rows)."""
    groups = selection.groups
    check_columns([m.label for m in metrics] + list(eval_stats), groups, baseline, pairs, equivalence)
    base = find_baseline(groups, baseline)
    sections = ["train"] if metrics else []
    sections += list(dict.fromkeys(section for section, _ in data if section != "train"))
    columns = {section: [m.label for m in metrics] if section == "train" else list(eval_stats) for section in sections}
    extremes = {m.label for m in metrics if max_statistic(m)}
    higher = {label: not lower_is_better(label) for cols in columns.values() for label in cols}

    estimates = [_estimate(g, section, metric, values[g.label], target_halfwidth, _stein(stage_one, section, g))
                 for (section, metric), values in data.items() for g in groups]
    comparisons = [_compare(a, b, section, metric, values, selected_from, stage_one,
                            max_statistic=section == "train" and metric in extremes,
                            margin=equivalence.margin(metric) if equivalence else None)
                   for (section, metric), values in data.items()
                   for a, b, selected_from in _wanted(groups, base, pairs, metric, values, higher[metric])
                   if a is not b and min(len(a.runs), len(b.runs)) >= stats.MIN_SEEDS]
    adjust_family(comparisons)
    report = Report(estimates, groups, base.label if base else None, sections, columns, comparisons,
                    higher_is_better=higher, target_halfwidth=target_halfwidth, equivalence=equivalence,
                    stage_one=stage_one, simultaneous=simultaneous)
    if simultaneous:
        add_simultaneous(comparisons, data, {g.label: g for g in groups})
    skipped: list[str] = []
    if interaction:
        report.interactions, skipped = interaction_rows(groups, data, interaction, report.baseline)
    report.notes = _notes(report, metrics, selection) + ([f"interaction: left out {'; '.join(skipped)}"]
                                                         if skipped else [])
    return report


def _wanted(groups: list[Group], base: Optional[Group], pairs: Sequence[Pair], metric: str,
            values: dict[str, np.ndarray], higher: bool) -> list[tuple[Group, Group, Optional[int]]]:
    """(a, b, selected_from) of one column: every group against the baseline, then the --compare pairs (a `best`
    pair's a is the best group by mean among the N others, selected_from N)."""
    wanted: list[tuple[Group, Group, Optional[int]]] = [(g, base, None) for g in groups if g is not base] \
        if base is not None else []
    for pair in pairs:
        if pair.metrics and metric not in pair.metrics:
            continue
        ref = find_group(groups, pair.b, "--compare")
        if pair.a == BEST:
            candidates = [g for g in groups if g is not ref]
            sign = 1 if higher else -1
            wanted.append((max(candidates, key=lambda g: sign * _score(values[g.label])), ref, len(candidates)))
        else:
            wanted.append((find_group(groups, pair.a, "--compare"), ref, None))
    return wanted


def _compare(a: Group, b: Group, section: str, metric: str, values: dict[str, np.ndarray],
             selected_from: Optional[int], stage_one: Optional[int], *, max_statistic: bool,
             margin: Optional[float]) -> Comparison:
    """a vs b on one column: paired Stein for two groups of an adaptive study (_stein), else stats.compare (paired
    when both ran the same seeds)."""
    if _stein(stage_one, section, a) is not None and _stein(stage_one, section, b) is not None:
        assert stage_one is not None
        result = stats.paired_stein(values[a.label], values[b.label], stage_one)
    else:
        result = stats.compare(values[a.label], values[b.label], paired=a.seeds == b.seeds)
    return Comparison(a.label, b.label, section, metric, result, selected_from, max_statistic=max_statistic,
                      margin=margin)


def adjust_family(rows: list[Comparison]) -> None:
    """One Holm family: each row's p entering Holm (times N for a cell selected from N), its Holm p, and its claim
    (stats.claim) with the MDE at the Holm first-step level 0.05/(m·N) of this family of m. Rows with an equivalence
    margin add their TOST p (stats.equivalence_p, times N for a selected cell: Bonferroni over the cells it was
    picked from holds whichever is picked) to the same family, so m counts the difference tests and the TOSTs; without
    margins the family, its Holm p and its levels are those of the difference tests alone."""
    tested = [r for r in rows if r.margin is not None]
    for row in rows:
        row.p_family = stats.selected(row.result.p, row.selected_from) if row.selected_from else row.result.p
    for row in tested:
        assert row.margin is not None
        r = row.result
        row.p_equivalence = stats.equivalence_p(r.delta, r.se, r.df, row.margin)
        row.p_equivalence_family = stats.selected(row.p_equivalence, row.selected_from) if row.selected_from \
            else row.p_equivalence
    adjusted = stats.holm([r.p_family for r in rows] + [r.p_equivalence_family for r in tested])
    size = len(adjusted)
    for row, p_holm in zip(rows, adjusted):
        row.p_holm = p_holm
        row.claim = stats.claim(row.result, p_holm, stats.holm_level(size, row.selected_from),
                                max_statistic=row.max_statistic)
    for row, p_holm in zip(tested, adjusted[len(rows):]):
        row.p_equivalence_holm = p_holm


def add_simultaneous(rows: list[Comparison], data: dict[tuple[str, str], dict[str, np.ndarray]],
                     groups: dict[str, Group]) -> None:
    """--simultaneous: per column, the joint max-t intervals (stats.simultaneous) of every group minus the baseline
    over their per-seed scores, on each baseline row that ran the baseline's seeds (the others have none)."""
    by_column: dict[tuple[str, str, str], list[Comparison]] = {}
    for r in rows:
        if r.selected_from is None and groups[r.a].seeds == groups[r.b].seeds and len(groups[r.b].seeds) >= 2:
            by_column.setdefault((r.section, r.metric, r.b), []).append(r)
    for (section, metric, base), column in by_column.items():
        values = data[(section, metric)]
        joint = joint_intervals([stats.seed_scores(values[r.a]) for r in column], stats.seed_scores(values[base]))
        for k, r in enumerate(column):
            r.simultaneous, r.sim_index = joint, k


@dataclass
class InteractionRow:
    """One A × B interaction contrast (stats.interaction) of one column in one stratum of the other keys."""

    keys: tuple[str, str]  # (A, B)
    section: str
    metric: str
    grid: Grid
    contrast: Contrast
    p_holm: float = math.nan  # over every contrast of the report (one family)
    status: str = "exploratory"  # no protocol names interaction rows (docs/report.md, "Interactions")

    @property
    def significant(self) -> bool:
        return self.p_holm < stats.ALPHA


def interaction_rows(groups: list[Group], data: dict[tuple[str, str], dict[str, np.ndarray]],
                     pairs: Sequence[tuple[str, str]],
                     baseline: Optional[str]) -> tuple[list[InteractionRow], list[str]]:
    """--interaction A,B (each pair): every contrast of every column's complete grids (stats.interaction.grids: one
    per stratum of the other differing keys, reference levels the baseline's), Holm-adjusted together as one
    family; and the strata left out."""
    config = {g.label: {**g.runs[0].params, **g.values} for g in groups}
    seeds = {g.label: g.seeds for g in groups}
    rows, skipped = [], []
    for keys in pairs:
        others, left = sorted({k for g in groups for k in g.values} - set(keys)), list[str]()
        for (section, metric), values in data.items():
            scores = {label: stats.seed_scores(x) for label, x in values.items()}
            found, left = grids(config, seeds, scores, keys, others, baseline)
            rows += [InteractionRow(keys, section, metric, grid, c) for grid in found
                     for c in interaction_contrasts(grid.y)]
        skipped += [f"{' × '.join(keys)}: {text}" for text in left]
    for row, p in zip(rows, stats.holm([r.contrast.p for r in rows])):
        row.p_holm = p
    return rows, skipped


def _score(x: np.ndarray) -> float:
    return float(stats.seed_scores(x).mean())


def _stein(stage_one: Optional[int], section: str, g: Group) -> Optional[int]:
    """n0 when the group's training metrics take Stein's interval and test: an adaptive study's group that ran seeds
    0..N-1, N >= n0 (its values, ordered by seed like g.runs, then have stage one first); None otherwise."""
    if stage_one is None or section != "train" or not stats.stein_seeds(g.seeds, stage_one):
        return None
    return stage_one


def _estimate(g: Group, section: str, metric: str, x: np.ndarray, target: Optional[float],
              stage_one: Optional[int] = None) -> Estimate:
    x = np.asarray(x, dtype=np.float64)
    n_problems = x.shape[1] if x.ndim == 2 else 0
    seed_only = None
    if stage_one is not None:  # an adaptive study's two-stage trial (_stein): Stein's interval, exact
        e = Estimate(g.label, section, metric, float(x.mean()), x.shape[0])
        iv = stats.stein_interval(x, stage_one)
    elif x.ndim == 2 and np.isnan(x).any():  # undefined on some problems (diversity, rarefaction): per-seed means
        scores = stats.seed_scores(x)
        e = Estimate(g.label, section, metric, float(scores.mean()), x.shape[0], n_problems,
                     note="mean over the problems where it is defined; t-interval over seeds")
        iv = seed_only = stats.t_interval(scores)
    else:
        e = Estimate(g.label, section, metric, float(x.mean()), x.shape[0], n_problems)
        iv = stats.interval(x)
        seed_only = stats.t_interval(x.mean(axis=1)) if x.ndim == 2 else None
    if seed_only is not None:
        e.seed_low, e.seed_high = seed_only.low, seed_only.high
    if not e.flagged:
        e.low, e.high, e.se, e.df, e.method = iv.low, iv.high, iv.se, iv.df, iv.method
        if target is not None:
            e.seeds_needed = _seeds_needed(x, target)
    return e


def _seeds_needed(x: np.ndarray, target: float) -> Optional[int]:
    """Seeds for a 95% half-width of `target`, from the observed spread (None: problems alone exceed it)."""
    if x.ndim == 1 or np.isnan(x).any():
        return stats.seeds_for_halfwidth(float(np.std(stats.seed_scores(x), ddof=1)), target)
    return stats.seeds_for_halfwidth_crossed(x, target)


def _notes(report: Report, metrics: Sequence[MetricSpec], selection: Selection) -> list[str]:
    notes = []
    if metrics:
        shown = "; ".join(f"{m.label}: {m.reduce} of the last {m.last} logged steps" for m in metrics)
        if report.stage_one is None:
            notes.append(f"training metrics, per run: {shown}; intervals: 95% Student-t over the per-seed values "
                         "(Student 1908)")
        else:
            notes.append(f"training metrics, per run: {shown}; adaptive seeds, Stein two-stage, n0 = "
                         f"{report.stage_one}" + _stein_note(report, selection))
    if any(s != "train" for s in report.sections):
        notes.append("evaluation metrics: 95% interval of a crossed seeds x problems design (variance components "
                     "from the two-way ANOVA: the seed term MS_S, unbiased, the problem term max(MS_P - MS_E, 0); t "
                     "quantile on Satterthwaite df with the seed term on S-1; docs/report.md); the CSV also has the "
                     "seed-only t-interval" + ("; not adjusted for the adaptive seed count (N was chosen from "
                                               "stage one)" if report.stage_one is not None else ""))
    if report.comparisons:
        tests = sorted({r.result.test for r in report.comparisons})
        m, tosts = report.family_size, report.family_size - len(report.comparisons)
        family = f"all {m} comparisons of this report" if not tosts else \
            f"all {len(report.comparisons)} comparisons and {tosts} equivalence tests of this report, {m} tests"
        notes.append(f"comparisons ({', '.join(tests)}): paired when both groups ran the same seeds (same initial "
                     "weights, prompt order and sampling seeds), else Welch; evaluation metrics are also paired by "
                     f"problem; Holm-adjusted (Holm 1979) over {family}; "
                     "MDE = the difference a claim detects with 80% power (noncentral t, the observed spread and "
                     f"seeds) at the Holm first-step level 0.05/{m} (0.05/({m}·N) for "
                     "a cell selected from N), the level every comparison of the family is sure to be tested at; "
                     "comparisons.csv also has it at 0.05 per comparison (mde) and the exact sign-flip p (paired)")
        if tosts:
            notes.append("equivalence (--equivalence): TOST (Schuirmann 1987) at the declared margin ±M with each "
                         "comparison's own Δ, se and df, p = max of the two one-sided t p-values, Holm-adjusted in "
                         "the family above; 'equivalent within ±M' when its Holm p < 0.05 with at least "
                         f"{stats.MIN_SEEDS_SIGNIFICANCE} seeds in each group, never on a max-statistic; a row "
                         "without it shows no equivalence "
                         "(comparisons.csv: p_equivalence, p_equivalence_holm, equivalence_margin)")
        if any(r.max_statistic for r in report.comparisons):
            notes.append("max-statistics (a run's max or min over its window): skewed, so a claim on one also "
                         "needs its exact sign-flip p < 0.05 (paired seeds; its smallest value is 2/2^S, so at least 6 "
                         "seeds: 'sign-flip needs ≥ 6 seeds'); a mean difference of zero with skewed differences can "
                         "still pass both (docs/report.md, \"Skewed data\")")
        notes.append(f"* Holm-adjusted p < 0.05 with at least {stats.MIN_SEEDS_SIGNIFICANCE} seeds in each group "
                     "(and for a max-statistic the sign-flip p < 0.05); "
                     f"below {stats.MIN_SEEDS_SIGNIFICANCE} seeds no comparison is marked: t-tests on so few seeds "
                     "have little power, their validity rests on normality that so few seeds cannot check, and "
                     "the exact sign-flip test cannot confirm them (its smallest p is 2/2^S: 0.25 at 3 seeds, "
                     "0.125 at 4)")
        if any(r.selected_from for r in report.comparisons):
            notes.append("selected: the best group by mean among N groups, compared after multiplying its p by N "
                         "(Bonferroni over the cells it was picked from), then in the Holm family")
    if report.simultaneous:
        notes.append("simultaneous intervals (--simultaneous; comparisons.csv sim_low, sim_high): max-t "
                     "(Dunnett-type) on paired seeds, each column's Δ vs the baseline ± sim_crit·se with sim_crit the "
                     "95% quantile of the largest |paired t| of the column's groups (simulated under the Dunnett "
                     "model, fixed seed; never above Bonferroni's, sim_bonferroni); they cover every true difference "
                     "of a column together in 95% of repeated experiments (family-wise per column), on per-seed "
                     "scores (evaluations: the seed's mean over problems)")
    if report.interactions is not None:
        pairs = ", ".join(dict.fromkeys(" × ".join(r.keys) for r in report.interactions)) or "none tested"
        notes.append(f"interactions ({pairs}; interactions.csv): per seed, B's effect at a level of A minus "
                     f"its effect at the reference level, a paired t over the seeds common to the grid's cells, "
                     f"Holm-adjusted over all {len(report.interactions)} contrasts (a family of their own): the "
                     "chance of any false interaction claim is at most 0.05; exploratory (no protocol names them)")
    if any(g.failed for g in selection.groups) or selection.failed_only:
        notes.append("failed: seed runs that ended FAILED (non-finite loss, weights or gradients, or a crash) are "
                     "not in the means; the seeds column counts them")
    notes += selection.failed_only
    if any(e.flagged for e in report.estimates):
        notes.append(f"† fewer than {stats.MIN_SEEDS} seeds: no interval")
    if report.target_halfwidth is not None:
        notes.append(f"seeds needed: for a 95% half-width of {report.target_halfwidth:g}, from the observed spread "
                     "(evaluations: the seed, problem and residual components; '∞' when the problems alone are "
                     "wider)")
    return notes


def _stein_note(report: Report, selection: Selection) -> str:
    """The rest of an adaptive study's training-metric note: the Stein interval and test, and the groups left out."""
    n0 = report.stage_one
    assert n0 is not None
    plain = [g.label for g in selection.groups if _stein(n0, "train", g) is None]
    return (f": 95% interval X̄_N ± t_{{.975, {n0 - 1}}}·s0/√N over seeds 0..N-1, s0 the metric's SD over seeds "
            f"0..{n0 - 1} (Stein 1945), exact under normality for every metric, N being chosen from stage one only; "
            f"comparisons: paired Stein on the common seeds 0..M-1, M = min(N_a, N_b), Δ ± t_{{.975, {n0 - 1}}}·"
            f"s0(d)/√M with s0(d) the SD of the differences over seeds 0..{n0 - 1}, sign-flip p and P(improvement) "
            "over the same seeds (docs/report.md, \"Adaptive seeds\")"
            + (f"; Student t, paired t or Welch for {', '.join(plain)} (seeds not 0..N-1 with N >= {n0})"
               if plain else ""))


def best_groups(report: Report) -> dict[tuple[str, str], str]:
    """(section, metric) -> the label of the best group by mean (higher or lower by metric)."""
    best: dict[tuple[str, str], Estimate] = {}
    for c in report.estimates:
        if math.isnan(c.mean):
            continue
        key = (c.section, c.metric)
        sign = 1 if report.higher_is_better.get(c.metric, True) else -1
        if key not in best or sign * c.mean > sign * best[key].mean:
            best[key] = c
    return {k: c.group for k, c in best.items()}
