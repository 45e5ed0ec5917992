"""Recompute a results folder's comparisons from the values they were computed from, with numpy and scipy only
(rlvrlab need not be installed, and nothing here imports or copies rlvrlab's code: every number is recomputed along
its own path, from scipy's tests where scipy has the test and from the published formulas elsewhere).

    python results/recompute.py results/ucpo_tau      # one line per comparison, then the largest difference

`rlvrlab report` writes, beside comparisons.csv, per_seed.csv (`group, section, seed, metric, value`: each seed
run's value after the metric's reduction and window, or for an evaluation statistic the seed's mean over the
problems) and, for evaluations, per_problem.csv (`group, section, seed, problem, metric, value`); every value is
written with repr(), which round-trips a double exactly (docs/report.md). From them this script recomputes:

- every comparison tested on per-seed values (training metrics; evaluation statistics undefined on some
  problems): Δ, the 95% interval, its standard error and df, p and P(improvement) from scipy's own results: paired t
  (Student 1908) by scipy.stats.ttest_rel when both groups ran the same seed list, else Welch (1947) by
  scipy.stats.ttest_ind(equal_var=False); Δ ± half-width is the result's confidence_interval(0.95), df its .df and
  the standard error half-width / t_{0.975, df}. Evaluation rows paired by seed and problem ("paired t (problems
  paired)") use each seed's mean over the problems defined in both arms, from per_problem.csv;
- the exact sign-flip p (Fisher 1935) of every paired row, by enumeration in integer arithmetic: the differences
  (each an exact rational: a double, or an evaluation seed's sum over problems) on a common denominator, the 2^S
  signed sums as subset sums, a pattern counted when |Σ ε d| >= |Σ d| exactly, so ties count (a float sum can miss
  one: issue 45). Beyond 16 seeds, the 2^16 patterns of numpy's default_rng(0).choice([-1.0, 1.0], (2^16, S)) plus
  the observed one, as the report draws them, summed exactly;
- in an adaptive-seed study (`seeds: {initial: n0, ...}`: trials of seeds 0..N-1, N chosen from the stage-one
  seeds 0..n0-1), "paired Stein" rows (Stein 1945): the differences d_s = a_s - b_s on the seeds both groups ran
  (0..M-1, M = min(N_a, N_b)), Δ = their mean, se = s0(d)/√M with s0(d) the SD of d over seeds 0..n0-1,
  df = n0-1, the interval Δ ± t_{0.975, n0-1} · se, p, and the sign-flip p and P(improvement) over the same seeds.
  n0 is not a column of its own: it is the written df + 1 of the study's Stein rows and cells (their df is n0-1 by
  construction), and all of them must give the same n0 (checked, as `n0`);
- every other evaluation comparison and every "crossed" cell of table.csv: the crossed seeds × problems design
  y_sp = μ + a_s + b_p + e_sp, its two-way ANOVA by the textbook sums of squares (correction term, row and column
  totals: SS_E = SS_total - SS_seeds - SS_problems), Var(ȳ) = (K̂ + B̂)/(SP) with K̂ = MS_S (unbiased for
  σe² + Pσa², on S-1 df) and B̂ = max(MS_P - MS_E, 0) on its Satterthwaite df B̂²/(MS_P²/(P-1) + MS_E²/((S-1)(P-1))),
  df = (S-1) + (df_Satt - (S-1))·(1 - K̂/(K̂+B̂))² (docs/report.md, "Numbers"). Where B̂ = 0 that is the Student-t
  interval of the seed means, and is taken from scipy.stats.ttest_1samp on them. Paired by seed and problem
  ("paired crossed"): the interval of d_sp = a_sp - b_sp, and the sign-flip p over the seeds' exact sums of
  differences. Different seeds ("Welch crossed"): each group's MS_S/(P·S) on its S-1 df, plus
  max(s²_D - MS_E,A/S_A - MS_E,B/S_B, 0)/P for the problems (D_p the difference of problem means), Satterthwaite df;
  a crossed cell's seed_low, seed_high: the t-interval of its seed means (scipy.stats.ttest_1samp);
- every row's MDE (the |Δ| a two-sided t at level α with the row's se and df detects with 80% power: the root in
  Δ/se of P(|T'| > t_{1-α/2}) = 0.8 with T' noncentral t, scipy.stats.nct and scipy.optimize.brentq) at α = 0.05
  (`mde`) and at the row's Holm level 0.05/(m·N) (`holm_level`, `mde_holm`; m the family's size, N the cells a
  selected group was picked from; a max-statistic below 6 paired seeds, or unpaired: inf);
- the family: p_family (p times the number of cells a selected group was picked from) and Holm's (1979)
  step-down adjustment over every row of comparisons.csv, by hand;
- with `rlvrlab report --equivalence` (the columns equivalence_margin, p_equivalence, p_equivalence_holm): each
  row's TOST p (Schuirmann 1987) at its margin M, max(P(T > (Δ+M)/se), P(T < (Δ-M)/se)) with T ~ t(df) from
  scipy.stats.t on the recomputed Δ, se and df, times the number of cells for a selected group, and Holm over the
  difference tests and the equivalence tests together;
- table.csv: each cell's mean, and for Student-t cells its interval, standard error and df; for crossed cells as
  above; for Stein cells (method "stein", an adaptive study's training metrics) the interval
  X̄_N ± t_{0.975, n0-1} · s0/√N over the N seeds, s0 the SD of seeds 0..n0-1, its standard error and df.

Every number of comparisons.csv is recomputed. A difference is |a - b| / max(1, |b|).
Exit status 0 when the largest difference is at most 1e-9, 1 when it is larger, 2 when a file is missing.
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import numpy as np
from scipy import optimize, stats as sps

LEVEL = 0.95
TOLERANCE = 1e-9
ALPHA, POWER = 0.05, 0.80
SIGNFLIP_SEEDS = 6  # the fewest paired seeds whose exact sign-flip p can be below 0.05 (2/2^5 = 0.0625)
MAX_EXACT_FLIPS = 16  # the report enumerates all 2^S sign flips up to here; beyond, 2^16 seeded random flips


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def number(text: str) -> float | None:
    return None if text == "" else float(text)


def per_seed(folder: Path) -> dict[tuple[str, str, str], tuple[list[int], np.ndarray]]:
    """(group, section, metric) -> (seeds in the file's order, values)."""
    found: dict[tuple[str, str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for row in read_csv(folder / "per_seed.csv"):
        seeds, values = found[(row["group"], row["section"], row["metric"])]
        seeds.append(int(row["seed"]))
        values.append(float(row["value"]))
    return {key: (seeds, np.asarray(values)) for key, (seeds, values) in found.items()}


def per_problem(folder: Path) -> dict[tuple[str, str, str], np.ndarray]:
    """(group, section, metric) -> [S, P] in the file's seed and problem order."""
    path = folder / "per_problem.csv"
    if not path.is_file():
        return {}
    cells: dict[tuple[str, str, str], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    problems: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for row in read_csv(path):
        key = (row["group"], row["section"], row["metric"])
        cells[key][int(row["seed"])][row["problem"]] = float(row["value"])
        if row["problem"] not in problems[key]:
            problems[key].append(row["problem"])
    return {key: np.asarray([[by_problem[p] for p in problems[key]] for by_problem in by_seed.values()])
            for key, by_seed in cells.items()}


def seed_means(x: np.ndarray) -> np.ndarray:
    """[S, P] -> [S]: each seed's mean over the problems where the value is defined (0 where none is)."""
    defined = ~np.isnan(x)
    total = np.where(defined, x, 0.0).sum(axis=1)
    count = defined.sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), 0.0)


def exact(values) -> list[Fraction]:
    """Doubles (or Fractions) as exact rationals: Fraction(x) of a double is its exact binary value."""
    return [v if isinstance(v, Fraction) else Fraction(float(v)) for v in values]


def signflip_p(d) -> float:
    """Exact sign-flip p (Fisher 1935) of paired differences d [S] (doubles or Fractions): the share of the 2^S
    sign patterns ε with |Σ ε_s d_s| >= |Σ d_s|, in integer arithmetic. Flipping a subset F turns Σd into
    Σd - 2·Σ_F d, so the 2^S signed sums are Σd - 2·(subset sums). Beyond MAX_EXACT_FLIPS seeds: the report's 2^16
    random patterns (numpy default_rng(0)) plus the observed one, each summed exactly."""
    values = exact(d)
    scale = math.lcm(*(v.denominator for v in values)) if values else 1
    whole = [int(v * scale) for v in values]
    total = sum(whole)
    if len(whole) <= MAX_EXACT_FLIPS:
        subsets = [0]
        for v in whole:
            subsets += [x + v for x in subsets]
        hits = sum(1 for x in subsets if abs(total - 2 * x) >= abs(total))
        return hits / len(subsets)
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=(2 ** 16, len(whole)))
    hits = sum(1 for row in signs if abs(sum(w if e > 0 else -w for e, w in zip(row, whole))) >= abs(total))
    return (hits + 1) / (len(signs) + 1)


def problem_sums(x: np.ndarray) -> list[Fraction]:
    """[S, P] differences -> each seed's exact sum over its problems (the sign-flip of an evaluation row: its
    seeds' mean differences over P problems are these sums / P, the same p)."""
    return [sum(exact(row), Fraction(0)) for row in x]


def defined_means(x: np.ndarray) -> list[Fraction]:
    """[S, P] with NaN where undefined -> each seed's exact mean over its defined problems (0 where none is)."""
    means = []
    for row in x:
        defined = exact(row[~np.isnan(row)])
        means.append(sum(defined, Fraction(0)) / len(defined) if defined else Fraction(0))
    return means


def improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) + P(X = Y)/2 over all pairs of seed values (rliable's probability of improvement)."""
    return float((x[:, None] > y[None, :]).mean() + 0.5 * (x[:, None] == y[None, :]).mean())


def two_sided_p(delta: float, se: float, df: float) -> float:
    if se > 0:
        return float(2 * sps.t.sf(abs(delta) / se, df))
    return 1.0 if delta == 0 else 0.0


def t_test(a: np.ndarray, b: np.ndarray, paired: bool, flips=None) -> dict[str, float | None]:
    """Paired t (scipy.stats.ttest_rel) or Welch (scipy.stats.ttest_ind(equal_var=False)): Δ, its 95% interval
    (the result's confidence_interval), df (.df), se = half-width / t_{0.975, df} and p; `flips`: the exact values
    of the paired differences for the sign-flip p (default a - b)."""
    delta = float(a.mean() - b.mean()) if not paired else float((a - b).mean())
    test = sps.ttest_rel(a, b) if paired else sps.ttest_ind(a, b, equal_var=False)
    df = float(test.df)
    if not math.isfinite(float(test.statistic)) or not math.isfinite(df):  # a zero spread: scipy gives nan
        df = float(len(a) - 1) if paired else float(len(a) + len(b) - 2)
        return {"delta": delta, "low": delta, "high": delta, "se": 0.0, "df": df, "p": two_sided_p(delta, 0.0, df),
                "p_signflip": signflip_p(exact_differences(a, b) if flips is None else flips) if paired else None}
    low, high = (float(v) for v in test.confidence_interval(LEVEL))
    se = (high - low) / 2 / float(sps.t.ppf(0.5 + LEVEL / 2, df))
    flip = signflip_p(exact_differences(a, b) if flips is None else flips) if paired else None
    return {"delta": delta, "low": low, "high": high, "se": se, "df": df, "p": float(test.pvalue), "p_signflip": flip}


def exact_differences(a: np.ndarray, b: np.ndarray) -> list[Fraction]:
    return [x - y for x, y in zip(exact(a), exact(b))]


def stein_test(seeds_a: list[int], a: np.ndarray, seeds_b: list[int], b: np.ndarray,
               n0: int) -> tuple[dict[str, float | None], float]:
    """Paired Stein on the common seeds: the row's numbers, and P(improvement) over the same seeds."""
    common = sorted(set(seeds_a) & set(seeds_b))
    if not set(range(n0)) <= set(common):
        raise ValueError(f"a paired Stein row needs seeds 0..{n0 - 1} in both groups")
    x = np.asarray([a[seeds_a.index(s)] for s in common])
    y = np.asarray([b[seeds_b.index(s)] for s in common])
    d = x - y
    delta, se = float(d.mean()), float(d[:n0].std(ddof=1) / math.sqrt(len(d)))  # common is sorted: d[:n0] is 0..n0-1
    return moments_test(delta, se, float(n0 - 1), exact_differences(x, y)), improvement(x, y)


def stein_cell(seeds: list[int], values: np.ndarray, n0: int) -> dict[str, float]:
    """X̄_N ± t_{0.975, n0-1} · s0/√N, s0 the SD of seeds 0..n0-1."""
    first = np.asarray([values[seeds.index(s)] for s in range(n0)])
    mean, se = float(values.mean()), float(first.std(ddof=1) / math.sqrt(len(values)))
    half = float(sps.t.ppf(0.5 + LEVEL / 2, n0 - 1)) * se
    return {"low": mean - half, "high": mean + half, "se": se, "df": float(n0 - 1)}


def mean_squares(x: np.ndarray) -> tuple[float, float, float]:
    """x [S, P]: MS_seeds, MS_problems, MS_residual of the two-way ANOVA without replication, by the textbook sums of
    squares on the data less its grand mean: C = T²/(SP), SS_S = Σ R_s²/P - C, SS_P = Σ C_p²/S - C,
    SS_E = Σ y² - C - SS_S - SS_P (R_s, C_p the seed and problem totals, T the grand total)."""
    s, p = x.shape
    y = x - x.sum() / x.size  # centred: the sums of squares lose no digits to a large mean
    correction = y.sum() ** 2 / y.size
    ss_s = float((y.sum(axis=1) ** 2).sum() / p - correction)
    ss_p = float((y.sum(axis=0) ** 2).sum() / s - correction)
    ss_e = float((y ** 2).sum() - correction - ss_s - ss_p)
    return ss_s / (s - 1), ss_p / (p - 1), max(ss_e, 0.0) / ((s - 1) * (p - 1))


def crossed(x: np.ndarray) -> tuple[float, float, float]:
    """x [S, P]: mean, se and df of the crossed interval (paired crossed: x the differences); K̂ = MS_S, B̂ =
    max(MS_P - MS_E, 0). With B̂ = 0 it is the t of the seed means: scipy.stats.ttest_1samp's se and df."""
    s, p = x.shape
    ms_s, ms_p, ms_e = mean_squares(x)
    mean = float(x.mean())
    b_hat = max(ms_p - ms_e, 0.0)
    if b_hat <= 0:
        test = sps.ttest_1samp(x.mean(axis=1), 0.0)
        if not math.isfinite(float(test.statistic)):
            return mean, 0.0, s - 1.0
        low, high = (float(v) for v in test.confidence_interval(LEVEL))
        return mean, (high - low) / 2 / float(sps.t.ppf(0.5 + LEVEL / 2, float(test.df))), float(test.df)
    b_df = b_hat ** 2 / (ms_p ** 2 / (p - 1) + ms_e ** 2 / ((s - 1) * (p - 1)))
    k_hat = ms_s
    total = k_hat + b_hat
    satterthwaite_df = total ** 2 / (k_hat ** 2 / (s - 1) + b_hat ** 2 / b_df)
    df = (s - 1) + (satterthwaite_df - (s - 1)) * (1 - k_hat / total) ** 2
    return mean, math.sqrt(total / (s * p)), df


def welch_crossed(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """a [Sa, P], b [Sb, P]: Δ, se and df of the Welch crossed comparison: MS_S,A/(P·Sa) on Sa-1 df, MS_S,B/(P·Sb)
    on Sb-1 df, and max(s²_D/P - MS_E,A/(P·Sa) - MS_E,B/(P·Sb), 0) (D_p the difference of the problem means) on its
    Satterthwaite df; df: Satterthwaite over the three (a zero term contributes nothing)."""
    p = a.shape[1]
    (ms_sa, _, ms_ea), (ms_sb, _, ms_eb) = mean_squares(a), mean_squares(b)
    sa, sb = a.shape[0], b.shape[0]
    d = a.mean(axis=0) - b.mean(axis=0)
    spread = float(((d - d.mean()) ** 2).sum() / (p - 1)) / p
    minus = [(ms_ea / (p * sa), (sa - 1.0) * (p - 1.0)), (ms_eb / (p * sb), (sb - 1.0) * (p - 1.0))]
    problems = max(spread - minus[0][0] - minus[1][0], 0.0)
    terms = [(ms_sa / (p * sa), sa - 1.0), (ms_sb / (p * sb), sb - 1.0)]
    if problems > 0:
        terms.append((problems, problems ** 2 / (spread ** 2 / (p - 1.0) + sum(m ** 2 / f for m, f in minus))))
    var = sum(v for v, _ in terms)
    denominator = sum(v ** 2 / f for v, f in terms)
    return float(a.mean() - b.mean()), math.sqrt(var), (var ** 2 / denominator if denominator > 0 else sa - 1.0)


def moments_test(delta: float, se: float, df: float, flips: list[Fraction] | None) -> dict[str, float | None]:
    half = float(sps.t.ppf(0.5 + LEVEL / 2, df)) * se
    return {"delta": delta, "low": delta - half, "high": delta + half, "se": se, "df": df,
            "p": two_sided_p(delta, se, df), "p_signflip": None if flips is None else signflip_p(flips)}


def mde(se: float, df: float, alpha: float) -> float:
    """The true |Δ| that a two-sided level-alpha t with this se and df rejects with probability POWER."""
    if not (se > 0 and df > 0) or not math.isfinite(se):
        return math.nan
    crit = float(sps.t.ppf(1 - alpha / 2, df))

    def shortfall(nc: float) -> float:
        lower = float(sps.nct.cdf(-crit, df, nc))
        return float(sps.nct.sf(crit, df, nc)) + (lower if math.isfinite(lower) else 0.0) - POWER

    high = crit + 3.0
    while shortfall(high) < 0:
        high *= 1.5
    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-12) * se)


def equivalence_p(delta: float, se: float, df: float, margin: float) -> float:
    """TOST: the larger of the one-sided p of H0: Δ <= -M and of H0: Δ >= M (0 or 1 for a zero spread)."""
    if se > 0:
        return float(max(sps.t.sf((delta + margin) / se, df), sps.t.cdf((delta - margin) / se, df)))
    return 0.0 if abs(delta) < margin else 1.0


def holm(p_values: list[float]) -> list[float]:
    """Holm (1979): the i-th smallest p times (m - i + 1), made monotone, capped at 1; in the input order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def difference(got: float | None, written: float | None) -> float:
    if got is None or written is None:
        return 0.0 if got is None and written is None else math.inf
    if math.isnan(got) or math.isnan(written):
        return 0.0 if math.isnan(got) and math.isnan(written) else math.inf
    if got == written:  # equal infinities too
        return 0.0
    return abs(got - written) / max(1.0, abs(written))


def comparison_name(row: dict[str, str]) -> str:
    selected = f" (selected: best of {row['selected_from']})" if row["selected_from"] else ""
    return f"{row['a']} vs {row['b']}{selected}, {row['section']}: {row['metric']}"


def tost(name: str, row: dict[str, str], delta: float, se: float, df: float,
         checks: list[tuple[str, str, float]]) -> float:
    """Check a row's p_equivalence; its TOST p entering Holm (times the cells a selected group was picked from)."""
    p = equivalence_p(delta, se, df, float(row["equivalence_margin"]))
    checks.append((name, "p_equivalence", difference(p, float(row["p_equivalence"]))))
    return min(1.0, p * int(row["selected_from"])) if row["selected_from"] else p


def recompute(folder: Path) -> tuple[list[tuple[str, str, float]], list[str]]:
    """[(what, field, difference)] for every recomputed number, and the rows recomputed only in part."""
    seeds = per_seed(folder)
    matrices = per_problem(folder)
    rows = read_csv(folder / "comparisons.csv")
    checks: list[tuple[str, str, float]] = []
    partial: list[str] = []
    family: list[float] = []
    tosts: list[tuple[str, dict[str, str], float]] = []  # (name, row, TOST p entering Holm)
    kept: list[tuple[str, dict[str, str], dict[str, float | None] | None]] = []  # each row and what was recomputed
    tested = bool(rows) and "p_equivalence" in rows[0]
    stage_ones: set[int] = set()  # n0 of every Stein row and cell: one study, one n0
    names = [comparison_name(row) for row in rows]
    for name, row in zip(names, rows):
        seeds_a, a = seeds[(row["a"], row["section"], row["metric"])]
        seeds_b, b = seeds[(row["b"], row["section"], row["metric"])]
        test = row["test"]
        # the report pairs groups that ran the same seed list, and in an adaptive study every Stein pair
        paired = seeds_a == seeds_b or test == "paired Stein"
        checks.append((name, "paired", 0.0 if str(paired) == row["paired"] else math.inf))
        better = improvement(a, b)  # P(improvement) over every seed of both groups; paired Stein: the common seeds
        if test == "paired Stein":
            n0 = round(float(row["df"])) + 1
            stage_ones.add(n0)
            got, better = stein_test(seeds_a, a, seeds_b, b, n0)
        elif test in ("paired t", "Welch"):
            got = t_test(a, b, paired)
        elif test == "paired t (problems paired)":  # each seed's mean difference over the problems both define
            both = (matrices[(row["a"], row["section"], row["metric"])]
                    - matrices[(row["b"], row["section"], row["metric"])])
            d = seed_means(both)
            got = t_test(d, np.zeros_like(d), True, flips=defined_means(both))
        elif test in ("paired crossed", "Welch crossed"):
            x_a = matrices[(row["a"], row["section"], row["metric"])]
            x_b = matrices[(row["b"], row["section"], row["metric"])]
            if test == "paired crossed":
                got = moments_test(*crossed(x_a - x_b), problem_sums(x_a - x_b))
            else:
                got = moments_test(*welch_crossed(x_a, x_b), None)
        else:
            checks.append((name, "prob_improvement", difference(better, number(row["prob_improvement"]))))
            partial.append(f"{name}: {test} (unknown to this script), not recomputed")
            family.append(float(row["p_family"]))
            kept.append((name, row, None))
            continue
        checks.append((name, "prob_improvement", difference(better, number(row["prob_improvement"]))))
        for field, value in got.items():
            checks.append((name, field, difference(value, number(row[field]))))
        p = got["p"]
        assert p is not None
        selected = int(row["selected_from"]) if row["selected_from"] else None
        p_family = min(1.0, p * selected) if selected else p
        checks.append((name, "p_family", difference(p_family, float(row["p_family"]))))
        family.append(p_family)
        kept.append((name, row, got))
        if "mde" in row:
            assert got["se"] is not None and got["df"] is not None
            checks.append((name, "mde", difference(mde(got["se"], got["df"], ALPHA), number(row["mde"]))))
        if tested and row["equivalence_margin"]:
            assert got["delta"] is not None and got["se"] is not None and got["df"] is not None
            tosts.append((name, row, tost(name, row, got["delta"], got["se"], got["df"], checks)))
    adjusted = holm(family + [p for _, _, p in tosts])  # one family: the difference tests, then the TOSTs
    for name, row, p_holm in zip(names, rows, adjusted):
        checks.append((name, "p_holm", difference(p_holm, float(row["p_holm"]))))
    for name, row, kept_got in kept:  # the MDE at the Holm first-step level of the family (difference tests + TOSTs)
        if kept_got is None or "mde_holm" not in row:
            continue
        level = ALPHA / (len(adjusted) * (int(row["selected_from"]) if row["selected_from"] else 1))
        checks.append((name, "holm_level", difference(level, float(row["holm_level"]))))
        assert kept_got["se"] is not None and kept_got["df"] is not None
        detectable = mde(kept_got["se"], kept_got["df"], level)
        if row.get("max_statistic") == "True" and (row["paired"] != "True" or
                                                   min(int(row["n_a"]), int(row["n_b"])) < SIGNFLIP_SEEDS):
            detectable = math.inf  # a max-statistic's claim needs the sign-flip too: impossible here
        checks.append((name, "mde_holm", difference(detectable, number(row["mde_holm"]))))
    for (name, row, _), p_holm in zip(tosts, adjusted[len(rows):]):
        checks.append((name, "p_equivalence_holm", difference(p_holm, float(row["p_equivalence_holm"]))))
    table = folder / "table.csv"
    for cell in read_csv(table) if table.is_file() else []:
        key = (cell["group"], cell["section"], cell["metric"])
        if key not in seeds:
            continue
        name = f"cell {cell['group']}, {cell['section']}: {cell['metric']}"
        x = matrices.get(key)
        values = seeds[key][1]
        mean = float(x.mean()) if x is not None and not np.isnan(x).any() else float(values.mean())
        checks.append((name, "mean", difference(mean, number(cell["mean"]))))
        if cell["method"] == "crossed" and x is not None:  # the crossed interval, and the seed means' t
            mean_, se, df = crossed(x)
            half = float(sps.t.ppf(0.5 + LEVEL / 2, df)) * se
            seed_only = sps.ttest_1samp(x.mean(axis=1), 0.0).confidence_interval(LEVEL)
            for key_, value in (("low", mean_ - half), ("high", mean_ + half), ("se", se), ("df", df),
                                ("seed_low", float(seed_only.low)), ("seed_high", float(seed_only.high))):
                checks.append((name, key_, difference(value, number(cell[key_]))))
        elif cell["method"] == "t" and len(values) >= 2:  # a t-interval on the per-seed values
            se, df = float(values.std(ddof=1) / math.sqrt(len(values))), float(len(values) - 1)
            half = float(sps.t.ppf(0.5 + LEVEL / 2, df)) * se
            for key_, value in (("low", mean - half), ("high", mean + half), ("se", se), ("df", df)):
                checks.append((name, key_, difference(value, number(cell[key_]))))
        elif cell["method"] == "stein":
            n0 = round(float(cell["df"])) + 1
            stage_ones.add(n0)
            for key_, value in stein_cell(seeds[key][0], values, n0).items():
                checks.append((name, key_, difference(value, number(cell[key_]))))
    if stage_ones:
        checks.append(("the adaptive study", "n0", 0.0 if len(stage_ones) == 1 else math.inf))
    return checks, partial


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python results/recompute.py RESULTS_FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    missing = [name for name in ("comparisons.csv", "per_seed.csv") if not (folder / name).is_file()]
    if missing:
        print(f"{folder} has no {' or '.join(missing)}: re-run `rlvrlab report` with the csv format "
              "(the folder's README command) to write it", file=sys.stderr)
        return 2
    checks, partial = recompute(folder)
    worst: dict[str, tuple[float, str]] = {}
    for what, field, diff in checks:
        if what not in worst or diff > worst[what][0]:
            worst[what] = (diff, field)
    for what, (diff, field) in worst.items():
        print(f"{diff:.1e}  {what}" + (f" (largest in {field})" if diff else ""))
    for line in partial:
        print(f"partly: {line}")
    largest = max(checks, key=lambda c: c[2]) if checks else ("nothing", "", 0.0)
    print(f"largest difference: {largest[2]:.3g} ({largest[0]}, {largest[1]}) over {len(checks)} numbers")
    return 0 if largest[2] <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
