"""`rlvrlab report --peak METRIC` (issue 48, item 5) on TensorBoard runs: peaks.csv has, for every group against
the baseline, each arm's peak of the mean curve over the shared seeds and the step it was logged at, D, the
swap-permutation p and the naive p, and table.md a note with the error the test controls; without the option no file
or note changes; a CSV source (no per-step series) and a --peak without anything to compare are one-line errors."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.command import ReportRequest, make_report

STEPS = (10, 20, 30, 40, 50)


def _runs(folder: Path) -> dict[str, np.ndarray]:
    """Event files of lr=0.1 (seeds 0-5) and lr=0.2 (seeds 0-6, 0.3 higher at every step); their curves [S, T]."""
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(4895)
    curves = {}
    for lr, shift, seeds in (("0.1", 0.0, 6), ("0.2", 0.3, 7)):
        values = (np.linspace(0.2, 0.5, len(STEPS)) + shift + rng.normal(0, 0.02, size=(seeds, len(STEPS))))
        curves[lr] = values.astype(np.float32).astype(np.float64)  # what an event file keeps
        for seed in range(seeds):
            with SummaryWriter(str(folder / f"lr={lr}" / f"seed={seed}")) as writer:
                for step, value in zip(STEPS, values[seed], strict=True):
                    writer.add_scalar("reward", float(value), step)
    return curves


def _report(tmp_path: Path, name: str, **options) -> Path:
    source = tmp_path / "tb"
    if not source.exists():
        _runs(source)
    out = tmp_path / name
    make_report(ReportRequest(source=f"tensorboard:{source}", metric=("reward",), baseline="lr=0.1", out=out,
                              plots=False, **options))
    return out


def test_peaks_csv_compares_each_group_with_the_baseline_on_shared_seeds(tmp_path: Path) -> None:
    curves = _runs(tmp_path / "tb")
    out = _report(tmp_path, "with", peak=("reward",))
    rows = list(csv.DictReader((out / "peaks.csv").open()))
    assert len(rows) == 1
    row = rows[0]
    a, b = curves["0.2"][:6], curves["0.1"]  # the seeds both logged: 0-5
    assert (row["a"], row["b"], row["metric"], row["n_seeds"]) == ("lr=0.2", "lr=0.1", "reward", "6")
    assert float(row["peak_a"]) == pytest.approx(a.mean(0).max()) and int(row["step_a"]) == STEPS[a.mean(0).argmax()]
    assert float(row["peak_b"]) == pytest.approx(b.mean(0).max()) and int(row["step_b"]) == STEPS[b.mean(0).argmax()]
    assert float(row["D"]) == pytest.approx(a.mean(0).max() - b.mean(0).max())
    assert float(row["p_permutation"]) == pytest.approx(2 / 64)  # 0.3 higher everywhere: only the mirror ties
    assert float(row["naive_p"]) < 1e-4
    assert "with identical arms it is below 0.05 with probability ≤ 0.05" in (out / "table.md").read_text()


def test_without_peak_nothing_changes(tmp_path: Path) -> None:
    without, with_peak = _report(tmp_path, "without"), _report(tmp_path, "with", peak=("reward",))
    assert not (without / "peaks.csv").exists()
    assert "peaks.csv" not in (without / "table.md").read_text()
    for name in ("comparisons.csv", "per_seed.csv", "table.csv"):
        assert (without / name).read_bytes() == (with_peak / name).read_bytes()


def test_peak_needs_per_step_series_and_something_to_compare(tmp_path: Path) -> None:
    table = tmp_path / "runs.csv"
    table.write_text("lr,seed,reward\n0.1,0,1.0\n0.1,1,1.1\n0.2,0,1.2\n0.2,1,1.3\n")
    for request, message in ((ReportRequest(source=f"csv:{table}", metric=("reward",), baseline="lr=0.1",
                                            peak=("reward",), out=tmp_path / "a"), "--peak"),
                             (ReportRequest(source=f"tensorboard:{tmp_path}", metric=("reward",), peak=("reward",),
                                            out=tmp_path / "b"), "--baseline")):
        with pytest.raises(RlvrlabError, match=message) as error:
            make_report(request)
        assert "\n" not in str(error.value)
