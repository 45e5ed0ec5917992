"""`rlvrlab report --reanalyse FOLDER` (issue 45, items 4-5): every committed results folder re-analysed from its
recorded values reproduces its committed comparisons.csv and table.csv, except where the crossed seeds × problems
interval of the evaluation columns enters (rows tested "crossed", evaluation cells with per-problem values, and the
Holm p and claims of a family that holds such rows); a protocol's ```verdict block is printed in table.md; the
folder's values, plots and records are kept; errors are one line. Every folder on disk is checked (none named)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import typer

from rlvrlab.errors import RlvrlabError
from rlvrlab.report import reanalyse as R, render
from rlvrlab.report.collect import Group, SeedRun, Selection
from rlvrlab.report.columns import parse_metrics
from rlvrlab.report.command import ReportRequest, make_report
from rlvrlab.report.table import analyse

RESULTS = Path(__file__).resolve().parents[2] / "results"
FOLDERS = sorted(p.parent for p in RESULTS.rglob("comparisons.csv"))
# columns of a row that the crossed rows of its Holm family move (the others' p enter its Holm p; the claim reads it)
FAMILY = ("p_holm", "significant")
# columns of an evaluation cell that do not rest on the crossed interval: its mean, seeds, problems, seed-only interval
EVAL_KEPT = ("baseline", "group", "section", "metric", "mean", "seed_low", "seed_high", "n_seeds", "n_problems",
             "config_hash", "seeds", "failed_seeds")


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_there_are_committed_folders_to_reanalyse() -> None:
    assert len(FOLDERS) >= 10 and any((f / "per_problem.csv").is_file() for f in FOLDERS)


@pytest.mark.parametrize("folder", FOLDERS, ids=[str(f.relative_to(RESULTS)) for f in FOLDERS])
def test_a_committed_folder_reanalyses_to_its_committed_numbers(folder: Path, tmp_path: Path) -> None:
    done = R.reanalyse(folder, out=tmp_path)
    committed, again = _rows(folder / "comparisons.csv"), _rows(tmp_path / "comparisons.csv")
    assert [(r["a"], r["b"], r["section"], r["metric"]) for r in again] == \
        [(r["a"], r["b"], r["section"], r["metric"]) for r in committed]
    crossed = any("crossed" in r["test"] for r in committed)
    for old, new in zip(committed, again):
        if "crossed" in old["test"]:
            assert new["test"] == old["test"] and new["delta"] == old["delta"]  # the same means, paired by problem
            continue
        keep = [k for k in old if not (crossed and k in FAMILY)]
        assert {k: new[k] for k in keep} == {k: old[k] for k in keep}, (old["a"], old["b"], old["metric"])
    evaluated = {r["section"] for r in _rows(folder / "per_problem.csv")} if (folder / "per_problem.csv").is_file() \
        else set()
    committed, again = _rows(folder / "table.csv"), _rows(tmp_path / "table.csv")
    assert [(r["group"], r["section"], r["metric"]) for r in again] == \
        [(r["group"], r["section"], r["metric"]) for r in committed]
    for old, new in zip(committed, again):
        keep = EVAL_KEPT if old["section"] in evaluated else [k for k in old if not (crossed and k in FAMILY)]
        assert {k: new[k] for k in keep} == {k: old[k] for k in keep}, (old["group"], old["metric"])
    assert done.result.notes[-1].startswith(R.REANALYSED)


def test_an_adaptive_studys_folder_reanalyses_with_steins_stage_one(tmp_path: Path) -> None:
    """No committed folder is an adaptive study: one is written here from per-seed values (groups a and b ran
    seeds 0..N-1, Stein's; c lost seed 4, Student t), and its n0 comes back from the recorded training note."""
    rng = np.random.default_rng(3)
    seeds = {"a": list(range(9)), "b": list(range(12)), "c": [0, 1, 2, 3, 5, 6, 7]}
    groups = [Group(label, [SeedRun(f"{label}{s}", s, {}, "abc", "FINISHED") for s in run], label=label)
              for label, run in seeds.items()]
    selection = Selection("memory", "study", groups, [], study="study", all_groups=groups)
    specs = parse_metrics(["train/reward,loss/kl"], reduce="mean", last=1)
    values = {("train", m.label): {g: 0.5 + 0.01 * rng.normal(size=len(run)) for g, run in seeds.items()}
              for m in specs}
    report = analyse(selection, values, metrics=specs, eval_stats=[], baseline="b", stage_one=5)
    assert {c.method for c in report.estimates} == {"stein", "t"}
    (tmp_path / "per_seed.csv").write_text(render.per_seed_csv(report, values))
    (tmp_path / "sources.json").write_text(json.dumps({
        "command": ["rlvrlab", "report", "--study", "study", "--baseline", "b", "--metric", "train/reward,loss/kl",
                    "--last", "1"], "source": "study", "study": "study", "notes": report.notes, "events": [],
        "groups": [{"label": g.label, "config_hash": g.config_hash, "values": {},
                    "runs": [{"run_id": r.run_id, "seed": r.seed} for r in g.runs]} for g in groups]}))
    R.reanalyse(tmp_path, out=tmp_path / "again")
    assert (tmp_path / "again" / "table.csv").read_bytes() == render.to_csv(report).encode()
    assert (tmp_path / "again" / "comparisons.csv").read_bytes() == render.comparisons_csv(report).encode()


def _copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / "folder"
    shutil.copytree(RESULTS / name, folder)
    return folder


SMALL = "ucpo_pairs/control"  # 20 runs, a recorded protocol, training metrics only


def test_a_protocols_verdict_block_is_printed_in_table_md(tmp_path: Path) -> None:
    folder = _copy(SMALL, tmp_path)
    row = _rows(folder / "comparisons.csv")[0]
    delta = float(row["delta"])
    protocol = tmp_path / "protocol.md"
    protocol.write_text(f"""# A protocol

```verdict
question: the first comparison of {SMALL}
precedence: first
rules:
  - verdict: above its own delta
    all:
      - {{comparison: {row['a']} vs {row['b']}, metric: "{row['metric']}", where: delta > {delta + 1}}}
  - verdict: at its own delta
    all:
      - {{comparison: {row['a']} vs {row['b']}, metric: "{row['metric']}", where: delta == {delta!r}}}
  - verdict: not shown
```
""")
    values = (folder / "per_seed.csv").read_bytes()
    recorded = json.loads((folder / "sources.json").read_text())
    done = R.reanalyse(folder, protocol=protocol)
    text = (folder / "table.md").read_text()
    assert f"**the first comparison of {SMALL}: at its own delta**" in text
    assert "| above its own delta | no |" in text and "| not shown | yes |" in text
    assert done.verdicts is not None and done.verdicts.questions[0].verdict == "at its own delta"
    assert (folder / "per_seed.csv").read_bytes() == values  # the values stay as first written
    sources = json.loads((folder / "sources.json").read_text())
    assert {k: v for k, v in sources.items() if k not in ("notes", "reanalysed")} == \
        {k: v for k, v in recorded.items() if k not in ("notes", "reanalysed")}
    assert sources["reanalysed"]["protocol"] == str(protocol) and sources["notes"] == done.result.notes
    assert sources["reanalysed"]["statistics"] == R.statistics_version() and not sources["reanalysed"]["date"] < \
        recorded["protocol"]["first_run_start"][:10]
    assert [n for n in recorded["notes"] if n.startswith(("provenance", "protocol"))] == \
        [n for n in done.result.notes if n.startswith(("provenance", "protocol"))]


def test_a_reanalysed_folder_reanalyses_to_the_same_tables(tmp_path: Path) -> None:
    folder = _copy("up_pairs/noclip", tmp_path)  # events and a protocol recorded
    R.reanalyse(folder)
    first = {name: (folder / name).read_text() for name in ("table.md", "table.tex", "table.csv", "comparisons.csv")}
    make_report(ReportRequest(reanalyse=folder))  # the command's library call
    assert {name: (folder / name).read_text() for name in first} == first
    assert first["table.md"].count(R.REANALYSED) == 1 and first["table.md"].count(R.EVENTS_KEPT) == 1
    assert "### Event `failure: " in first["table.md"]


def test_values_that_do_not_match_the_groups_are_refused(tmp_path: Path) -> None:
    folder = _copy(SMALL, tmp_path)
    lines = (folder / "per_seed.csv").read_text().splitlines(keepends=True)
    (folder / "per_seed.csv").write_text("".join(lines[:-1]))
    with pytest.raises(RlvrlabError, match="do not match the groups") as caught:
        R.reanalyse(folder)
    assert "\n" not in str(caught.value)
    (folder / "per_seed.csv").write_text("".join(lines) + "x" + lines[-1])  # a group sources.json does not list
    with pytest.raises(RlvrlabError, match="do not match the groups"):
        R.reanalyse(folder)
    (folder / "per_seed.csv").unlink()
    with pytest.raises(RlvrlabError, match="no per_seed.csv there"):
        R.reanalyse(folder)


def test_reanalyse_takes_no_option_the_folder_records(tmp_path: Path) -> None:
    with pytest.raises(RlvrlabError, match="drop --baseline"):
        make_report(ReportRequest(reanalyse=RESULTS / SMALL, baseline="grpo", out=tmp_path))


def test_the_recorded_command_parser_knows_every_option_of_rlvrlab_report() -> None:
    from rlvrlab.cli.main import app

    command = typer.main.get_command(app).commands["report"]  # type: ignore[attr-defined]
    flags, valued = set(), set()
    for param in command.params:
        names = [*param.opts, *getattr(param, "secondary_opts", [])]
        (flags if getattr(param, "is_flag", False) else valued).update(n for n in names if n.startswith("--"))
    assert flags == set(R.FLAGS) and valued == set(R.VALUE_OPTIONS) | {"--reanalyse"}
    assert R.parse_command(["rlvrlab", "report", "--metric", "a", "--metric=b", "--no-eval"]) == \
        {"--metric": ["a", "b"], "--no-eval": []}
    with pytest.raises(RlvrlabError, match="--bogus"):
        R.parse_command(["rlvrlab", "report", "--bogus"])
