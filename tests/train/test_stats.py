"""rlvrlab.train.stats: a step's loss diagnostics do not depend on how its rows were grouped into micro-batches."""

import dataclasses
import math

import pytest
import torch

from rlvrlab.algorithms import POLICY_LOSSES, Aggregation, LossInputs, LossStats, bind_algorithm
from rlvrlab.config.compose import compose
from rlvrlab.train.stats import LossStatsMean, sign_counts


def _inputs(rows: slice | None = None) -> LossInputs:
    """6 rows x 5 tokens: ratios spread around 1 (some beyond every clip), advantages of both signs and zero,
    ragged masks and an empty row."""
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(6, 5, generator=g) * 3
    old = logp + torch.randn(6, 5, generator=g) * 0.4
    adv = torch.randn(6, 1, generator=g).expand(6, 5).clone()
    adv[2] = 0.0
    mask = (torch.arange(5) < torch.tensor([5, 3, 4, 0, 2, 5]).unsqueeze(1)).float()
    x = LossInputs(logp, old, adv, mask)
    if rows is None:
        return x
    return LossInputs(logp[rows], old[rows], adv[rows], mask[rows])


@pytest.mark.parametrize("name", sorted(n for n, loss in POLICY_LOSSES.items() if loss.micro_batch_exact))
def test_loss_diagnostics_of_micro_batches_combine_to_the_whole_batchs(name):
    """Every registered loss that sums over micro-batches (the micro_batch_exact trait): its LossStats over the whole
    batch equal LossStatsMean over the same rows cut into micro-batches of 1, 2 and 3 rows, field by field (the
    *_max fields by their max); the plain mean over micro-batches, which the step logged before, does not."""
    loss = bind_algorithm(compose("toy", [f"algorithm.loss={name}"]).algorithm).loss
    whole = loss(_inputs(), Aggregation()).stats
    plain_differs = False
    for cut in ([slice(0, 1), slice(1, 6)], [slice(0, 2), slice(2, 3), slice(3, 6)]):
        merged = LossStatsMean()
        plain: list[LossStats] = []
        for rows in cut:
            x = _inputs(rows)
            stats = loss(x, Aggregation()).stats
            merged.add(stats, **sign_counts(x.adv, x.mask))
            plain.append(stats)
        got = merged.result()
        for field in dataclasses.fields(LossStats):
            want, value = getattr(whole, field.name), getattr(got, field.name)
            if want is None:
                assert value is None, field.name
                continue
            assert value == pytest.approx(want, rel=1e-5, abs=1e-6), (name, field.name)
            values = [getattr(s, field.name) for s in plain if getattr(s, field.name) is not None]
            if not field.name.startswith("ratio_max") and not math.isclose(sum(values) / len(values), want,
                                                                              rel_tol=1e-3, abs_tol=1e-4):
                plain_differs = True
    assert plain_differs  # the inputs are ragged enough that the grouping mattered to the old mean
