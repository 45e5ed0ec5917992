"""A × B interaction tests on paired seeds (rlvrlab.stats.interaction, issue 48 item 4): with no interaction the
Holm family rejects anything in [0.035, 0.06] of repeated experiments (a 2 × 2 grid, one contrast, and a 3 × 3 grid,
a family of four); with a planted interaction the rejection rate is within ±0.05 of the analytic noncentral-t power.
Grids have a seed effect shared by every cell, as real sweeps do."""

from __future__ import annotations

import numpy as np
import pytest

from rlvrlab.stats.interaction import contrasts, holm_rejects, interaction, power, t_tests


def grids(rng: np.random.Generator, reps: int, seeds: int, shape: tuple[int, int], planted: float = 0.0,
          noise: str = "normal") -> np.ndarray:
    """reps grids [reps, S, I, J]: additive main effects, a shared seed effect (sd 2), per-cell noise (sd 1, or a
    centred lognormal scaled to sd 1), and `planted` added to the cell (a_1, b_1) only."""
    a, b = np.linspace(0, 1, shape[0])[:, None], np.linspace(0, 0.5, shape[1])[None, :]
    if noise == "normal":
        e = rng.normal(size=(reps, seeds, *shape))
    else:
        e = (rng.lognormal(0, 0.5, (reps, seeds, *shape)) - np.exp(0.125)) / np.sqrt((np.e ** 0.25 - 1) * np.e ** 0.25)
    y = a + b + rng.normal(0, 2.0, (reps, seeds, 1, 1)) + e
    y[..., 1, 1] += planted
    return y


def family_rejects(y: np.ndarray) -> np.ndarray:
    """Whether the Holm family of each grid rejects any contrast."""
    c = contrasts(y)
    _, _, p = t_tests(c.reshape(*c.shape[:2], -1))
    return holm_rejects(p).any(axis=-1)


@pytest.mark.parametrize("seeds", [3, 5, 10])
@pytest.mark.parametrize("shape", [(2, 2), (3, 3)])
def test_type_one_error_with_no_interaction_is_within_0035_006(seeds: int, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(4840 + seeds + 10 * shape[0])
    rate = family_rejects(grids(rng, 20000, seeds, shape)).mean()
    assert 0.035 <= rate <= 0.06


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_power_with_a_planted_interaction_is_within_005_of_the_analytic_power(seeds: int) -> None:
    rng = np.random.default_rng(4860 + seeds)
    planted = 2.0 * 2.5 / np.sqrt(seeds)  # contrast sd 2 (four cells of sd 1): 30-60% power
    rate = family_rejects(grids(rng, 20000, seeds, (2, 2), planted)).mean()
    assert abs(rate - power(planted, 2.0, seeds)) <= 0.05


def test_the_contrast_is_the_difference_of_bs_effects_and_holm_orders_the_family() -> None:
    rng = np.random.default_rng(4870)
    y = rng.normal(size=(5, 2, 3))
    rows = interaction(y)
    assert [(r.i, r.j) for r in rows] == [(1, 1), (1, 2)]
    by_seed = (y[:, 1, 2] - y[:, 1, 0]) - (y[:, 0, 2] - y[:, 0, 0])
    assert rows[1].estimate == pytest.approx(by_seed.mean())
    assert all(r.p_holm >= r.p and r.low < r.estimate < r.high for r in rows)


def test_holm_rejects_matches_the_stepdown_rule() -> None:
    p = np.array([[0.01, 0.04, 0.03], [0.02, 0.5, 0.001], [0.2, 0.3, 0.4]])
    assert holm_rejects(p).tolist() == [[True, False, False], [True, False, True], [False, False, False]]


def test_a_grid_without_two_levels_is_refused() -> None:
    with pytest.raises(ValueError, match="levels of A >= 2"):
        interaction(np.zeros((4, 1, 3)))


@pytest.mark.slow
def test_type_one_and_power_measured_for_the_docs(capsys) -> None:
    """Prints the docs' figures (docs/report.md, "Interactions"): 100,000 grids a row, normal and lognormal noise."""
    lines = []
    for noise in ("normal", "lognormal"):
        for seeds in (3, 5, 10):
            rng = np.random.default_rng(4880 + seeds)
            i22 = family_rejects(grids(rng, 100000, seeds, (2, 2), noise=noise)).mean()
            i33 = family_rejects(grids(rng, 100000, seeds, (3, 3), noise=noise)).mean()
            planted = 2.0 * 2.5 / np.sqrt(seeds)
            hit = family_rejects(grids(rng, 100000, seeds, (2, 2), planted, noise=noise)).mean()
            lines.append(f"{noise} seeds={seeds} type-I 2x2 {i22:.4f} 3x3 {i33:.4f} power {hit:.4f} analytic "
                         f"{power(planted, 2.0, seeds):.4f}")
            if noise == "normal":
                assert 0.035 <= i22 <= 0.06 and 0.035 <= i33 <= 0.06 and abs(hit - power(planted, 2.0, seeds)) <= 0.05
    with capsys.disabled():
        print("\n".join(lines))
