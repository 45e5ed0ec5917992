"""rlvrlab.update.base.full_weights: the checkpoint's full weights under ZeRO-3 are drawn on every rank (each entry is
a collective gather) and kept only on the rank that writes them; the others release each one before the next."""

import weakref

import torch

from rlvrlab.update.base import full_weights


def _copy(value: float, produced: list[weakref.ref]) -> torch.Tensor:
    tensor = torch.full((2, 3), value)
    produced.append(weakref.ref(tensor))
    return tensor


def _gathered(released: list[bool], produced: list[weakref.ref]):
    """Three entries as DeepSpeedEngine.weights() yields them under ZeRO-3: a fresh copy each, which the generator
    does not hold once yielded; before producing the next, it records whether the consumer released the last."""
    for i in range(3):
        if produced:
            released.append(produced[-1]() is None)
        yield f"layer{i}.weight", _copy(float(i), produced)


def test_other_ranks_draw_every_entry_and_release_each_before_the_next():
    released: list[bool] = []
    produced: list[weakref.ref] = []
    assert full_weights(_gathered(released, produced), keep=False) is None
    assert len(produced) == 3  # every gather took place: the keeping rank's gathers would wait for this one
    assert released == [True, True]
    assert produced[-1]() is None


def test_the_writing_rank_keeps_every_entry_on_the_cpu():
    released: list[bool] = []
    produced: list[weakref.ref] = []
    kept = full_weights(_gathered(released, produced), keep=True)
    assert kept is not None and list(kept) == ["layer0.weight", "layer1.weight", "layer2.weight"]
    for i, tensor in enumerate(kept.values()):
        assert tensor.device.type == "cpu" and torch.equal(tensor, torch.full((2, 3), float(i)))
