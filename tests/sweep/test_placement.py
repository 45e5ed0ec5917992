"""GPU placement of sweep workers (rlvrlab/sweep/placement.py), on CPU with device lists given explicitly.
Run: .venv/bin/pytest -q tests/sweep/test_placement.py"""

import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.sweep.placement import assign, visible_devices


def test_workers_own_disjoint_sets_of_devices() -> None:
    assert assign(2, 4, [str(i) for i in range(8)]) == ["0,1,2,3", "4,5,6,7"]
    assert assign(3, 1, ["4", "5", "6", "7"]) == ["4", "5", "6"]  # an inherited CUDA_VISIBLE_DEVICES subset
    sets = [set(s.split(",")) for s in assign(4, 2, [str(i) for i in range(8)])]
    assert all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1:])


@pytest.mark.parametrize(("workers", "k", "devices", "message"), [
    (3, 4, [str(i) for i in range(8)], "needs 12 GPUs, but this machine shows 8"),
    (1, 1, [], "needs 1 GPUs, but this machine shows 0 (none)"),
    (2, 1, ["0", "0"], "names a device twice"),
    (0, 1, ["0"], "must both be at least 1"),
])
def test_placements_that_do_not_fit_are_one_line_errors(workers, k, devices, message) -> None:
    with pytest.raises(RlvrlabError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        assign(workers, k, devices)
    assert "\n" not in str(error.value)


def test_visible_devices_follow_cuda_visible_devices() -> None:
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2, 5,7"}) == ["2", "5", "7"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
