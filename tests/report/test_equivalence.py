"""`rlvrlab report --equivalence M` (issue 37, item 4): a TOST at the declared margin on each comparison's own Δ, se
and df, in the report's Holm family. An exact case by hand, the type-I error at the margin by seeded Monte Carlo,
the joint family, and the option's parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlvrlab import stats
from rlvrlab.errors import RlvrlabError
from rlvrlab.report.columns import parse_equivalence
from rlvrlab.report.table import Comparison, Equivalence, adjust_family


def test_tost_by_hand_at_two_df() -> None:
    """d = (0, 1, 2): Δ = 1, sd = 1, se = 1/√3, df = 2, whose t CDF is F(t) = 1/2 + t / (2√(2 + t²)). At M = 1 + √2
    the upper test's t is (1 - M)/se = -√6, so p_upper = F(-√6) = 1/2 - √6/(2√8) = (2 - √3)/4 = 0.0670; the lower
    test's t is (2 + √2)√3 = 5.91, p_lower = 1 - F(5.91) = 0.0137; the TOST p is the larger."""
    result = stats.paired_t(np.array([0.0, 1.0, 2.0]), np.zeros(3))
    assert (result.delta, result.se, result.df) == pytest.approx((1.0, 1 / math.sqrt(3), 2.0), rel=1e-14)
    margin = 1 + math.sqrt(2)
    t_lower = (2 + math.sqrt(2)) * math.sqrt(3)
    p_lower = 0.5 - t_lower / (2 * math.sqrt(2 + t_lower ** 2))
    assert p_lower == pytest.approx(0.013712, abs=1e-6)
    assert stats.equivalence_p(result.delta, result.se, result.df, margin) == pytest.approx((2 - math.sqrt(3)) / 4,
                                                                                            rel=1e-12)
    # symmetric in the sign of Δ; a zero spread decides by |Δ| < M alone
    assert stats.equivalence_p(-1.0, result.se, 2.0, margin) == pytest.approx((2 - math.sqrt(3)) / 4, rel=1e-12)
    assert stats.equivalence_p(0.5, 0.0, 4.0, 1.0) == 0.0 and stats.equivalence_p(1.0, 0.0, 4.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        stats.equivalence_p(0.0, 1.0, 4.0, 0.0)


@pytest.mark.parametrize("seeds", [5, 10])
def test_tost_type_one_error_at_the_margin_is_at_most_alpha(seeds: int) -> None:
    """Paired t, per-seed differences N(±M, 1), 40,000 data sets per cell (Monte Carlo sd 0.0011). With the true
    difference on the margin (the null's boundary, where its rejection rate is largest) the TOST at 0.05 rejects
    0.0505-0.0508 at 5 seeds and 0.0491-0.0493 at 10 when M is 6 standard errors (one one-sided test decides: α
    exactly), 0.042 and 0.039 at 2 standard errors, 0.008 and 0.001 at 1 (the two tests both must reject: the test is
    conservative when the margin is narrow against the noise)."""
    rng = np.random.default_rng(37 + seeds)
    draws, slack = 40_000, 3 * math.sqrt(0.05 * 0.95 / 40_000)
    for ratio in (6.0, 2.0, 1.0):  # M in standard errors of Δ
        margin = ratio / math.sqrt(seeds)
        for sign in (1.0, -1.0):
            m = stats.t_moments(rng.normal(sign * margin, 1.0, (draws, seeds)))
            rejected = float((stats.equivalence_p(m.estimate, m.se, m.df, margin) < stats.ALPHA).mean())
            assert rejected <= stats.ALPHA + slack, (ratio, sign, rejected)
            if ratio == 6.0:
                assert rejected >= stats.ALPHA - slack, (sign, rejected)  # at the boundary: the level, not less
            if ratio == 1.0:
                assert rejected < 0.01


def test_equivalence_tests_join_the_holm_family() -> None:
    """adjust_family with margins: the TOST p of each row with a margin (times N for a cell selected from N) is
    Holm-adjusted with the difference tests, m = rows + TOSTs, and the claims' level is 0.05/m; a row with 3 seeds is
    never called equivalent; rows without a margin have no TOST."""
    rng = np.random.default_rng(4)
    shared = rng.normal(0, 0.05, 5)
    rows = []
    for index, shift in enumerate((0.0, 0.001, 0.1, 0.0)):
        seeds = 3 if index == 3 else 5
        a = 0.5 + shift + shared[:seeds] + rng.normal(0, 0.002, seeds)
        b = 0.5 + shared[:seeds] + rng.normal(0, 0.002, seeds)
        rows.append(Comparison(f"g{index}", "base", "train", "m" if index != 2 else "other", stats.compare(a, b, paired=True),
                        selected_from=3 if index == 1 else None, margin=None if index == 2 else 0.02))
    adjust_family(rows)
    tested = [r for r in rows if r.margin is not None]
    for r in tested:
        c = r.result
        assert r.p_equivalence == pytest.approx(stats.equivalence_p(c.delta, c.se, c.df, 0.02), abs=1e-15)
    assert rows[1].p_equivalence_family == pytest.approx(min(1.0, 3 * rows[1].p_equivalence))
    family = stats.holm([r.p_family for r in rows] + [r.p_equivalence_family for r in tested])
    assert [r.p_holm for r in rows] == family[:4] and [r.p_equivalence_holm for r in tested] == family[4:]
    assert all(r.claim is not None and r.claim.level == pytest.approx(0.05 / 7 / (r.selected_from or 1))
               for r in rows)
    assert rows[0].equivalent and rows[1].equivalent
    assert not rows[2].equivalent and math.isnan(rows[2].p_equivalence)
    assert rows[3].p_equivalence_holm < 0.05 and not rows[3].equivalent  # 3 seeds: no verdict
    # without margins the family is the difference tests alone, as before --equivalence existed
    for r in rows:
        r.margin = None
    adjust_family(rows)
    assert [r.p_holm for r in rows] == stats.holm([r.p_family for r in rows])
    assert all(r.claim is not None and r.claim.level == pytest.approx(0.05 / 4 / (r.selected_from or 1)) for r in rows)


def test_the_option_is_a_margin_or_named_margins() -> None:
    assert parse_equivalence(None) is None
    assert parse_equivalence("0.02") == Equivalence(0.02, ())
    both = parse_equivalence("0.02, pass@1=0.05,loss/grad_norm:max:60=1.5")
    assert both is not None and both.margin("pass@1") == 0.05 and both.margin("loss/grad_norm:max:60") == 1.5
    assert both.margin("train/reward") == 0.02
    named = parse_equivalence("pass@1=0.05")
    assert named is not None and named.margin("train/reward") is None
    for bad in ("0", "-0.1", "nan", "inf", "x", "0.1,0.2", "pass@1=0.1,pass@1=0.2", "=0.1", "pass@1=", ""):
        with pytest.raises(RlvrlabError, match="--equivalence"):
            parse_equivalence(bad)
