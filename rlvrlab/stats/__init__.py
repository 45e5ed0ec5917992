"""The statistics of a report, valid at the 3-10 seeds RLVR studies can afford (docs/report.md, "Numbers": a
percentile bootstrap over 3 seeds is [min, max] of the seeds and covers 75%, hence t-based intervals).
Pure numpy/scipy functions with typed results; no resampling, so a table is the same on every machine.

- intervals: Student-t seed intervals, the crossed seeds × problems interval, curve bands, their moments.
- comparisons: paired t / Welch (crossed for evaluations), sign-flip p, MDE, TOST, Holm, the claim rule.
- seeds: seeds needed for a target half-width.
- design: variance components of a pilot and the smallest seeds × samples × problems design for a target MDE.
- stein: Stein's two-stage intervals and paired comparisons of an adaptive-seed study.
- sequential: seed-by-seed comparison of a trial with the incumbent, a β-spending futility bound (prune) and an
  α-spending efficacy bound.
- diversity: rarefied and expected distinct correct forms.
- peak: max-over-steps peak difference of two arms' per-seed curves, a swap-permutation null, the naive peak t.
- confirm: the selected cell against the baseline on fresh seeds disjoint from the search (the interval to quote),
  beside the naive search-phase one and the shrinkage.
- simultaneous: joint (family-wise 95%) max-t intervals of every cell against the baseline on paired seeds.
- interaction: A × B interaction contrasts on paired seeds, Holm over the family, analytic power.

Every public name of the submodules is importable from here (`from rlvrlab import stats; stats.compare`).
None of them imports scipy.stats at import time (a sweep worker scores trials with t_interval alone).
"""

from rlvrlab.stats.comparisons import (
    ALPHA,
    MAX_EXACT_FLIPS,
    MIN_SEEDS_SIGNIFICANCE,
    POWER,
    TIE_TOLERANCE,
    Claim,
    Comparison,
    claim,
    compare,
    equivalence_p,
    holm,
    holm_level,
    mde,
    paired_crossed,
    paired_t,
    probability_of_improvement,
    seed_scores,
    selected,
    signflip_p,
    signflip_seeds,
    welch,
    welch_crossed,
)
from rlvrlab.stats.confirm import Confirmation, check_seeds, confirm, fresh_seeds
from rlvrlab.stats.design import (
    Components,
    Design,
    bernoulli_variance,
    components,
    design_mde,
    noncentrality,
    pooled,
    problems_needed,
    seeds_only,
    smallest_design,
)
from rlvrlab.stats.diversity import distinct_combinations, expected_distinct, rarefied_distinct
from rlvrlab.stats.interaction import (
    Contrast,
    Grid as InteractionGrid,
    contrasts,
    grids as interaction_grids,
    holm_rejects,
    interaction,
    power as interaction_power,
)
from rlvrlab.stats.intervals import (
    LEVEL,
    MIN_SEEDS,
    Interval,
    MeanSquares,
    Moments,
    crossed_interval,
    crossed_moments,
    crossed_var_df,
    curve_band,
    difference_term,
    interval,
    mean_squares,
    satterthwaite,
    scipy_stats,
    t_interval,
    t_moments,
    t_ppf,
    welch_crossed_moments,
    welch_moments,
)
from rlvrlab.stats.peak import (
    MAX_EXACT_SWAPS,
    RANDOM_SWAPS,
    Peak,
    naive_peak_p,
    peak_p,
    peak_statistic,
    peak_test,
    swap_patterns,
)
from rlvrlab.stats.seeds import seeds_for_halfwidth, seeds_for_halfwidth_crossed
from rlvrlab.stats.sequential import (
    BETA,
    BETTER,
    COMPLETE,
    CONTINUE,
    MIN_LOOK,
    PRUNE,
    SEQUENTIAL_DECISIONS,
    SPENDING_RHO,
    SequentialDesign,
    running_t,
    sequential_decision,
    sequential_stops,
)
from rlvrlab.stats.simultaneous import (
    Simultaneous,
    bonferroni_critical,
    critical_values,
    dunnett_correlation,
    max_t_critical,
    simultaneous,
)
from rlvrlab.stats.stein import (
    PAIRED_STEIN,
    STEIN,
    paired_stein,
    paired_stein_moments,
    stage_one_size,
    stein_interval,
    stein_moments,
    stein_seeds,
)

__all__ = [
    "MAX_EXACT_SWAPS", "RANDOM_SWAPS", "Peak", "naive_peak_p", "peak_p", "peak_statistic", "peak_test", "swap_patterns",
    "Confirmation", "check_seeds", "confirm", "fresh_seeds",
    "Components", "Design", "bernoulli_variance", "components", "design_mde", "noncentrality", "pooled",
    "problems_needed", "seeds_only", "smallest_design",
    "Contrast", "InteractionGrid", "contrasts", "interaction_grids", "holm_rejects", "interaction", "interaction_power",
    "Simultaneous", "bonferroni_critical", "critical_values", "dunnett_correlation", "max_t_critical", "simultaneous",
    "BETA", "BETTER", "COMPLETE", "CONTINUE", "MIN_LOOK", "PRUNE", "SEQUENTIAL_DECISIONS", "SPENDING_RHO",
    "SequentialDesign", "running_t", "sequential_decision", "sequential_stops",
    "ALPHA", "LEVEL", "MAX_EXACT_FLIPS", "MIN_SEEDS", "MIN_SEEDS_SIGNIFICANCE", "PAIRED_STEIN", "POWER",
    "STEIN", "TIE_TOLERANCE",
    "Claim", "Comparison", "Interval", "MeanSquares", "Moments", "claim", "compare", "crossed_interval",
    "crossed_moments", "crossed_var_df", "curve_band", "difference_term", "distinct_combinations", "equivalence_p",
    "expected_distinct", "holm", "holm_level", "interval", "mde", "mean_squares",
    "paired_crossed", "paired_stein", "paired_stein_moments", "paired_t",
    "probability_of_improvement", "rarefied_distinct", "satterthwaite", "scipy_stats", "seed_scores",
    "seeds_for_halfwidth", "seeds_for_halfwidth_crossed", "selected", "signflip_p", "signflip_seeds", "stage_one_size",
    "stein_interval", "stein_moments", "stein_seeds", "t_interval",
    "t_moments", "t_ppf", "welch", "welch_crossed", "welch_crossed_moments", "welch_moments",
]
