"""`rlvrlab reproduce`: a toy study (2 configs x 3 seeds) reported into a folder, then re-run: on one machine the
re-run seeds are bit-identical and inside (exit 0); a committed value and interval edited to exclude the truth make
its row OUTSIDE (exit 1); bad input is one line and exit 2. docs/reproducibility.md cites this file."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))

SWEEP = """\
name: toyrep
experiment: toy
overrides: [algorithm=ucpo, steps=6, trainer.checkpoint_every=0]
sampler: grid
seeds: 3
space:
  algorithm.tau: [0.0, 1.0]
objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 3}
"""
BASE, OTHER = "ucpo tau=0.0", "ucpo tau=1.0"


def _cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([RLVRLAB, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy study's folder as `rlvrlab report --study` writes it (its runs under <tmp>/runs)."""
    here = tmp_path_factory.mktemp("reproduce")
    (here / "toyrep.yaml").write_text(SWEEP)
    ran = _cli("sweep", "toyrep.yaml", cwd=here)
    assert ran.returncode == 0, ran.stderr[-2000:]
    reported = _cli("report", "--study", "toyrep", "--baseline", BASE, "--no-plots", "--format", "csv",
                    "--out", "study", cwd=here)
    assert reported.returncode == 0, reported.stderr[-2000:]
    return here


def _rows(text: str, title: str) -> list[list[str]]:
    """The rows of one plain-text table of the output (cells split on runs of 2+ spaces), header first."""
    lines = text.splitlines()
    start = lines.index(f"{title}:") + 1
    block = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        block.append([cell for cell in line.strip().split("  ") if cell.strip()])
    return [[cell.strip() for cell in row] for row in block]


@pytest.mark.slow  # ~60 s with the study it re-runs (6 toy runs, 2 reports, 5 re-runs)
def test_a_re_run_on_one_machine_is_bit_identical_and_inside(study: Path) -> None:
    result = _cli("reproduce", "study", "--seeds", "2", "--sweep", "toyrep.yaml", "--output-dir", "again",
                  cwd=study)
    assert result.returncode == 0, result.stdout + result.stderr
    header, *rows = _rows(result.stdout, "per seed")
    assert header[:3] == ["group", "metric", "seed"]
    assert sorted((r[0], r[2]) for r in rows) == [(g, s) for g in (BASE, OTHER) for s in ("0", "1")]
    for row in rows:
        committed, rerun, difference, status = row[3], row[4], row[5], row[-1]
        assert committed == rerun and float(difference) == 0.0 and status == "inside", row
    compared = _rows(result.stdout, "per comparison")[1:]
    assert [r[0] for r in compared] == [f"{OTHER} - {BASE}"] and compared[0][-1] == "inside"
    identity = {r[0]: r for r in _rows(result.stdout, "recorded identity")[1:]}
    assert identity["commit"][-1] == "same" and identity["dirty tree"][-1] == "same"
    for label in (BASE, OTHER):
        assert identity[f"config hash {label}"][-1] == "same"
    sources = json.loads((study / "study" / "sources.json").read_text())
    digests = [r.get("initial_model") for g in sources["groups"] for r in g["runs"] if r["seed"] < 2]
    # the committed runs' initial-model digests, where they recorded them, are the re-runs' own (one machine)
    assert identity["initial model sha256"][-1] == ("same" if all(digests) else "not recorded"), identity
    environment = sources.get("environment") or {}
    verdicts = {r[-1] for what, r in identity.items() if what.startswith("environment ")}
    assert verdicts == ({"same"} if environment.get("recorded") else {"not recorded"}), identity
    assert "not a range for one seed" in result.stdout and "fewer than the study had" in result.stdout


@pytest.mark.slow
def test_a_committed_interval_that_excludes_the_re_run_flags_its_row_and_exits_1(study: Path) -> None:
    folder = study / "edited"
    shutil.copytree(study / "study", folder)
    metric = "policy/toy_correct_uniformity"
    per_seed = list(csv.DictReader((folder / "per_seed.csv").open()))
    truth = next(float(r["value"]) for r in per_seed if r["group"] == OTHER and r["seed"] == "0"
                 and r["section"] == "train" and r["metric"] == metric)
    for r in per_seed:
        if r["group"] == OTHER and r["seed"] == "0" and r["metric"] == metric:
            r["value"] = str(truth + 0.5)
    _write(folder / "per_seed.csv", per_seed)
    table = list(csv.DictReader((folder / "table.csv").open()))
    for r in table:
        if r["group"] == OTHER and r["section"] == "train" and r["metric"] == metric:
            r["mean"], r["low"], r["high"] = str(truth + 0.5), str(truth + 0.4), str(truth + 0.6)
    _write(folder / "table.csv", table)

    result = _cli("reproduce", "edited", "--seeds", "1", "--sweep", "toyrep.yaml", "--output-dir", "again",
                  "--groups", OTHER, cwd=study)
    assert result.returncode == 1, result.stdout + result.stderr
    (row,) = _rows(result.stdout, "per seed")[1:]
    assert row[0] == OTHER and row[2] == "0" and row[-1] == "OUTSIDE"
    assert float(row[3]) == pytest.approx(truth + 0.5) and float(row[4]) == pytest.approx(truth)
    assert float(row[5]) == pytest.approx(0.5)


@pytest.mark.slow
def test_at_the_recorded_commit_the_seeds_run_its_code_in_a_clone_that_is_removed(study: Path, tmp_path: Path) -> None:
    from rlvrlab.tracking.provenance import git_state

    sha = git_state()[0]
    sources = json.loads((study / "study" / "sources.json").read_text())
    assert {r["git_sha"] for g in sources["groups"] for r in g["runs"]} == {sha}
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    result = _cli("reproduce", "study", "--seeds", "1", "--groups", OTHER, "--sweep", "toyrep.yaml",
                  "--output-dir", "at-commit", "--at-recorded-commit", cwd=study, env={"TMPDIR": str(temporary)})
    if sha == "unknown":  # not a git checkout: no commit to run, one line and exit 2
        assert result.returncode == 2 and "--at-recorded-commit" in result.stderr
        return
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert f"RE-RUN WITH THE CODE OF THE RECORDED COMMIT {sha[:12]}" in result.stdout
    identity = {r[0]: r for r in _rows(result.stdout, "recorded identity")[1:]}
    assert identity["commit"][1:] == [sha, sha, "same"]
    assert identity["dirty tree"][2] == "false"  # the clone is the commit itself, whatever this checkout holds
    (row,) = _rows(result.stdout, "per seed")[1:]
    assert row[0] == OTHER and row[2] == "0" and row[4] != "-"
    assert list(temporary.glob("rlvrlab-*")) == []  # the clone (rlvrlab.sweep.at_commit.checkout's folder) is gone


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A study folder as a report writes it, written by hand (no run): two groups of the toy sweep, seeds 0-2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toyrep.yaml").write_text(SWEEP)
    folder = tmp_path / "study"
    folder.mkdir()
    groups = [{"label": label, "config_hash": "0" * 12, "values": {"algorithm.tau": tau},
               "runs": [{"run_id": f"{i}{seed}", "seed": seed, "git_sha": "a" * 40, "git_dirty": False,
                         "initial_model": None} for seed in range(3)]}
              for i, (label, tau) in enumerate([(BASE, "0.0"), (OTHER, "1.0")])]
    (folder / "sources.json").write_text(json.dumps({"study": "toyrep", "command": ["rlvrlab", "report"],
                                                     "groups": groups}))
    metric = "policy/toy_correct_uniformity"
    (folder / "per_seed.csv").write_text("group,section,seed,metric,value\n" + "".join(
        f"{g['label']},train,{seed},{metric},0.6\n" for g in groups for seed in range(3)))
    (folder / "table.csv").write_text("group,section,metric,mean,low,high,n_seeds\n" + "".join(
        f"{g['label']},train,{metric},0.6,0.5,0.7,3\n" for g in groups))
    return tmp_path


@pytest.mark.parametrize("args, env, says", [
    (["nowhere"], {}, "has no sources.json"),
    (["study", "--groups", "ucpo tau=9"], {}, "no group 'ucpo tau=9'"),
    (["study", "--seeds", "4"], {}, "give --seeds 3 or fewer"),
    (["study", "--seeds", "0"], {}, "give a number of seeds >= 1"),
    (["study"], {"RLVRLAB_SWEEPS_DIR": "empty"}, "pass --sweep FILE"),
    (["study", "--sweep", "missing.yaml"], {}, "--sweep missing.yaml does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(written: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                          env: dict, says: str) -> None:
    from typer.testing import CliRunner

    from rlvrlab.cli.main import app

    (written / "empty").mkdir()
    for key, value in env.items():
        monkeypatch.setenv(key, str(written / value))
    sweep = [] if env or "--sweep" in args else ["--sweep", "toyrep.yaml"]
    result = CliRunner().invoke(app, ["reproduce", *args, *sweep, "--output-dir", "again"])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
    assert not (written / "again").exists()  # nothing ran


def test_a_group_is_found_by_its_config_hash_else_by_its_recorded_values(written: Path) -> None:
    """The sweep's own composition rebuilds each group's config; a hash that no longer matches (the config
    composes differently today) falls back to the grid point that agrees with every recorded group value."""
    from rlvrlab.sweep.reproduce import InputError, find_sweep, trial_params

    spec = find_sweep("toyrep", Path("toyrep.yaml"))
    hashes = {point["algorithm.tau"]: spec.trial_hash(point) for point in spec.grid()}
    assert trial_params(spec, {"config_hash": hashes[1.0], "values": {}}) == ({"algorithm.tau": 1.0}, hashes[1.0])
    by_values = trial_params(spec, {"label": OTHER, "config_hash": "0" * 12, "values": {"algorithm.tau": "1.0"}})
    assert by_values == ({"algorithm.tau": 1.0}, hashes[1.0])
    with pytest.raises(InputError, match="none of the trials"):
        trial_params(spec, {"label": "x", "config_hash": "0" * 12, "values": {"algorithm.tau": "0.5"}})
    with pytest.raises(InputError, match="more than one"):
        trial_params(spec, {"label": "x", "config_hash": "0" * 12, "values": {}})


def test_values_are_read_with_the_recorded_report_command_metrics() -> None:
    from rlvrlab.sweep.reproduce import recorded_metrics

    specs = recorded_metrics(["rlvrlab", "report", "--metric", "a:max:5,b", "--metric=c:auc", "--last", "7",
                              "--reduce=min"], "objective", 3)
    assert [(s.name, s.reduce, s.last, s.label) for s in specs] == [
        ("a", "max", 5, "a:max:5"), ("b", "min", 7, "b"), ("c", "auc", 7, "c:auc")]
    (default,) = recorded_metrics(["rlvrlab", "report", "--study", "s"], "objective", 3)
    assert (default.name, default.reduce, default.last) == ("objective", "mean", 3)
