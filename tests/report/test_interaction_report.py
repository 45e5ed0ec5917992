"""`rlvrlab report --interaction A,B` and `--simultaneous` (issue 48, items 2 and 4) on a CSV source: the interaction
rows go to interactions.csv and a table.md section, labelled exploratory, with a heat map; a planted interaction is
found in every stratum and a null one is not; --simultaneous adds joint intervals to comparisons.csv that contain
the per-comparison ones; without the options the outputs are those of a report without them (no new file, column
or section)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.command import ReportRequest, make_report

BASE = "tau=0.0 staleness=0 eps=0.2"


def _runs(path: Path) -> Path:
    """A 2 (tau) x 3 (staleness) x 2 (eps) grid of 5 seeds with a seed effect; tau=1.0 at staleness=2 adds 0.5."""
    rng = np.random.default_rng(4890)
    rows = [{"tau": tau, "staleness": st, "eps": eps, "seed": seed,
             "reward": 1 + 0.1 * float(tau) + 0.05 * int(st) + 0.3 * seed + rng.normal(0, 0.05)
             + (0.5 if (tau, st) == ("1.0", "2") else 0.0)}
            for tau in ("0.0", "1.0") for st in ("0", "2", "4") for eps in ("0.2", "inf") for seed in range(5)]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _report(tmp_path: Path, name: str, **options) -> Path:
    out = tmp_path / name
    make_report(ReportRequest(source=f"csv:{_runs(tmp_path / 'runs.csv')}", group_by="tau,staleness,eps",
                              metric=("reward",), baseline=BASE, out=out, **options))
    return out


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_interaction_rows_heat_map_and_section_find_the_planted_cell_only(tmp_path: Path) -> None:
    out = _report(tmp_path, "with", interaction=("tau,staleness",))
    rows = _rows(out / "interactions.csv")
    assert [(r["stratum"], r["a"], r["b"]) for r in rows] == \
        [("eps=0.2", "1.0", "2"), ("eps=0.2", "1.0", "4"), ("eps=inf", "1.0", "2"), ("eps=inf", "1.0", "4")]
    assert [r["significant"] for r in rows] == ["True", "False", "True", "False"]
    assert {r["status"] for r in rows} == {"exploratory"} and all(float(r["p_holm"]) >= float(r["p"]) for r in rows)
    assert abs(float(rows[0]["contrast"]) - 0.5) < 0.15
    assert (out / "interaction_tau_staleness.png").stat().st_size > 0
    text = (out / "table.md").read_text()
    assert "### Interactions (exploratory)" in text and "Holm-adjusted over all 4 contrasts" in text


def test_simultaneous_adds_joint_intervals_wider_than_each_one(tmp_path: Path) -> None:
    out = _report(tmp_path, "sim", simultaneous=True)
    rows = [r for r in _rows(out / "comparisons.csv") if r["b"] == BASE]
    assert len(rows) == 11 and len({r["sim_crit"] for r in rows}) == 1
    for r in rows:
        assert float(r["sim_low"]) < float(r["low"]) <= float(r["delta"]) <= float(r["high"]) < float(r["sim_high"])
        assert float(r["sim_crit"]) <= float(r["sim_bonferroni"])
    assert "max-t (Dunnett-type) on paired seeds" in (out / "table.md").read_text()


def test_without_the_options_nothing_is_added(tmp_path: Path) -> None:
    plain, both = _report(tmp_path, "plain"), _report(tmp_path, "both", simultaneous=True,
                                                      interaction=("tau,staleness",))
    assert not (plain / "interactions.csv").exists() and not list(plain.glob("interaction_*.png"))
    assert "sim_low" not in (plain / "comparisons.csv").read_text().splitlines()[0]
    assert "Interactions" not in (plain / "table.md").read_text()
    assert (plain / "table.csv").read_text() == (both / "table.csv").read_text()


@pytest.mark.parametrize("options, message", [
    ({"interaction": ("tau",)}, "give two different config keys"),
    ({"interaction": ("tau,nope",)}, "'nope' is not a config key of every group"),
])
def test_bad_interaction_keys_are_one_line_errors(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(RlvrlabError, match=message) as caught:
        _report(tmp_path, "bad", **options)
    assert "\n" not in str(caught.value)


def test_simultaneous_needs_a_baseline(tmp_path: Path) -> None:
    with pytest.raises(RlvrlabError, match="--simultaneous compares every group with --baseline"):
        make_report(ReportRequest(source=f"csv:{_runs(tmp_path / 'runs.csv')}", group_by="tau,staleness,eps",
                                  metric=("reward",), simultaneous=True, out=tmp_path / "x"))


def test_two_pairs_share_one_holm_family_and_get_a_map_each(tmp_path: Path) -> None:
    out = _report(tmp_path, "two", interaction=("tau,staleness", "eps,staleness", "tau,staleness"))
    rows = _rows(out / "interactions.csv")
    assert [(r["a_key"], r["b_key"]) for r in rows] == [("tau", "staleness")] * 4 + [("eps", "staleness")] * 4
    assert not any(r["significant"] == "True" for r in rows if r["a_key"] == "eps")  # no eps × staleness planted
    assert {p.name for p in out.glob("interaction_*.png")} == {"interaction_tau_staleness.png",
                                                               "interaction_eps_staleness.png"}
    assert "Holm-adjusted over all 8 contrasts" in (out / "table.md").read_text()


def test_reanalyse_adds_interaction_rows_and_keeps_them(tmp_path: Path) -> None:
    """A committed folder re-analysed with --interaction gains the exploratory rows, its own tables unchanged; a
    later plain --reanalyse keeps them (they are recorded in sources.json)."""
    import shutil

    from rlvrlab.report.provenance import results_dir

    folder = tmp_path / "grid"
    shutil.copytree(results_dir() / "tiny_tau_eps_staleness_grid", folder)
    before = {name: (folder / name).read_bytes() for name in ("comparisons.csv", "table.csv")}
    proto = results_dir() / "protocols" / "tiny_tau_eps_staleness_grid.md"
    make_report(ReportRequest(reanalyse=folder, protocol=proto, interaction=("algorithm.tau,trainer.staleness",)))
    first = (folder / "table.md").read_text()
    assert (folder / "interactions.csv").is_file() and "### Interactions (exploratory)" in first
    assert {name: (folder / name).read_bytes() for name in before} == before
    make_report(ReportRequest(reanalyse=folder, protocol=proto))
    assert (folder / "table.md").read_text() == first
