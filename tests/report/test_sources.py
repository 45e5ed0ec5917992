"""`rlvrlab report --source csv:FILE` and `--source tensorboard:DIR` (rlvrlab.report.files): the same runs read from
a CSV of per-seed values, or as TensorBoard runs, give the MLflow report's comparisons.csv byte for byte, TensorBoard
runs the same events and curves too, and a protocol's verdicts work from every source; the report's options are
ReportRequest's fields, one definition (rlvrlab.report.request)."""

from __future__ import annotations

import csv
import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from rlvrlab.errors import RlvrlabError
from rlvrlab.report import collect, request as R
from rlvrlab.report.columns import REDUCTIONS, reduce_series
from rlvrlab.report.command import ReportRequest, make_report
from rlvrlab.report.tensorboard import TBRun

STEPS, LAST = 12, 4
METRIC = f"reward:mean:{LAST}"
PLAN = {"1e-05": (0.5, [1, 2, 3, 4, 5]), "3e-05": (0.62, [1, 2, 3, 4, 5]), "0.0001": (0.55, [11, 12, 13, 14, 15])}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An MLflow experiment `toy` of runs with params lr and seed and a reward history, as another trainer logs."""
    import mlflow

    folder = tmp_path_factory.mktemp("sources")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    rng = np.random.default_rng(7)
    histories: dict[tuple[str, int], list[float]] = {}
    try:
        experiment = mlflow.create_experiment("toy", artifact_location=str(folder / "artifacts"))
        for lr, (level, seeds) in PLAN.items():
            for seed in seeds:
                reward = (level * (1 - np.exp(-np.arange(STEPS) / 4)) + rng.normal(0, 0.03, STEPS)).tolist()
                with mlflow.start_run(experiment_id=experiment, run_name=f"lr={lr},seed={seed}"):
                    mlflow.log_params({"lr": lr, "seed": seed})
                    mlflow.set_tag("mlflow.source.git.commit", "0123456789abcdef0123456789abcdef01234567")
                    for step in range(STEPS):
                        mlflow.log_metric("reward", reward[step], step=step)
                histories[(lr, seed)] = reward
    finally:
        mlflow.set_tracking_uri(previous)
    return {"uri": uri, "histories": histories}


def _mlflow_report(store: dict, out: Path, metric: str = METRIC) -> Path:
    make_report(ReportRequest(experiment="toy", group_by="lr", tracking_uri=store["uri"], metric=(metric,),
                              baseline="lr=1e-05", compare=("best:lr=1e-05",), plots=False, out=out))
    return out


def test_a_csv_of_the_runs_per_seed_values_gives_the_same_comparisons(store: dict, tmp_path: Path) -> None:
    first = _mlflow_report(store, tmp_path / "mlflow")
    rows = [r for r in csv.DictReader((first / "per_seed.csv").open()) if r["section"] == "train"]
    table = tmp_path / "runs.csv"
    with table.open("w", newline="") as f:  # one row per seed run: group key, seed, the metric's final value
        writer = csv.writer(f)
        writer.writerow(["lr", "seed", "reward", "commit"])
        for r in reversed(rows):  # any row order
            writer.writerow([r["group"].removeprefix("lr="), r["seed"], r["value"], "0123456"])
    again = make_report(ReportRequest(source=f"csv:{table}", metric=(METRIC,), baseline="lr=1e-05",
                                      compare=("best:lr=1e-05",), plots=False, out=tmp_path / "csv"))
    assert (tmp_path / "csv" / "comparisons.csv").read_bytes() == (first / "comparisons.csv").read_bytes()
    assert (tmp_path / "csv" / "table.csv").read_bytes() == (first / "table.csv").read_bytes()
    assert any(f"{METRIC}: the value in runs.csv" in note for note in again.result.notes)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_tensorboard_runs_are_reduced_as_mlflow_histories_are(store: dict, tmp_path: Path, reduce: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    metric = f"reward:{reduce}:{LAST}"
    first = _mlflow_report(store, tmp_path / "mlflow", metric)
    runs = [TBRun(f"lr={lr},seed={seed}", {"lr": lr}, seed, {"reward": list(enumerate(history))})
            for (lr, seed), history in store["histories"].items()]
    from rlvrlab.report import tensorboard

    monkeypatch.setattr(tensorboard, "read_runs", lambda directory: runs)
    make_report(ReportRequest(source=f"tensorboard:{tmp_path}", metric=(metric,), baseline="lr=1e-05",
                              compare=("best:lr=1e-05",), plots=False, out=tmp_path / "tb"))
    assert (tmp_path / "tb" / "comparisons.csv").read_bytes() == (first / "comparisons.csv").read_bytes()
    client = collect.client_for(store["uri"])
    run = client.search_runs([client.get_experiment_by_name("toy").experiment_id], max_results=1)[0]
    series = collect.metric_series(client, run.info.run_id, "reward")
    one = collect.Group("x", [collect.SeedRun(run.info.run_id, 0, {}, "", "FINISHED")], "x")
    assert collect.final_values(client, one, "reward", LAST, reduce)[0] == reduce_series(series, LAST, reduce)


def test_the_command_is_built_from_the_request() -> None:
    from rlvrlab.cli.main import app

    command = typer.main.get_command(app).commands["report"]  # type: ignore[attr-defined]
    declared = {f.name: f.metadata["cli"] for f in dataclasses.fields(ReportRequest) if "cli" in f.metadata}
    by_name = {p.name: p for p in command.params}
    assert set(by_name) == set(declared)
    for name, option in declared.items():
        assert by_name[name].opts[0] == option.flags[0] and by_name[name].help == option.help


def test_the_cli_reports_a_csv(store: dict, tmp_path: Path) -> None:
    from rlvrlab.cli.main import app

    table = tmp_path / "runs.csv"
    table.write_text("lr,seed,reward\n" + "".join(f"{lr},{s},{0.1 * s + float(lr)}\n" for lr in ("0.1", "0.2")
                                                   for s in range(5)))
    result = CliRunner().invoke(app, ["report", "--source", f"csv:{table}", "--metric", "reward", "--format", "csv",
                                      "--no-plots", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert [r["group"] for r in csv.DictReader((tmp_path / "out" / "table.csv").open())] == ["lr=0.1", "lr=0.2"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"source": "parquet:x"}, "give csv:FILE or tensorboard:DIR"),
    ({"source": "csv:"}, "give csv:FILE or tensorboard:DIR"),
    ({"source": "csv:x.csv", "experiment": "toy"}, "drop --experiment"),
    ({"source": "csv:x.csv", "events": ("a: reward < 0",)}, "--event reads each run's per-step series and a CSV "
                                                            "has one value per seed run; drop it"),
    ({"source": "csv:x.csv", "smooth": 5}, "--smooth reads each run's per-step series"),
    ({"source": "tensorboard:x", "seed_key": "s"}, "drop --seed-key"),
    ({"source": "csv:x.csv", "heatmap_keys": "a,b"}, "drop --heatmap"),
])
def test_bad_sources_are_one_line_errors(kwargs: dict, fragment: str, tmp_path: Path) -> None:
    with pytest.raises(RlvrlabError, match=fragment) as e:
        make_report(ReportRequest(out=tmp_path / "o", **kwargs))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, fragment", [
    ("lr,reward\n0.1,1\n", "no 'seed' column"),
    ("lr,seed,reward\n0.1,x,1\n", "is not an integer"),
    ("lr,seed,reward\n0.1,1,high\n", "is not a number"),
    ("lr,seed,reward\n0.1,1,1\n0.1,1,2\n", "seed 1 twice"),
    ("lr,seed,rewrd\n0.1,1,1\n", "unknown column 'reward'"),
])
def test_bad_csv_files_are_one_line_errors(text: str, fragment: str, tmp_path: Path) -> None:
    table = tmp_path / "runs.csv"
    table.write_text(text)
    with pytest.raises(RlvrlabError, match=fragment) as e:
        make_report(ReportRequest(source=f"csv:{table}", metric=("reward",), out=tmp_path / "o", plots=False))
    assert "\n" not in str(e.value)


def test_every_option_takes_a_value_or_is_a_switch_and_every_source_kind_is_registered() -> None:
    from rlvrlab.report.command import SOURCES

    halves = {flag for _, o in R.options() for flag in o.flags}
    assert set(R.value_options()) | set(R.switch_flags()) == halves
    assert not set(R.value_options()) & set(R.switch_flags())
    assert set(SOURCES) == set(R.SOURCES)


def test_a_csv_sourced_folder_reanalyses_to_the_same_comparisons(tmp_path: Path) -> None:
    table = tmp_path / "runs.csv"
    rng = np.random.default_rng(3)
    table.write_text("lr,seed,reward\n" + "".join(f"{lr},{s},{level + rng.normal(0, 0.05)!r}\n"
                                                   for lr, level in (("0.1", 0.5), ("0.2", 0.6)) for s in range(6)))
    out = tmp_path / "out"
    args = ("--source", f"csv:{table}", "--metric", "reward", "--baseline", "lr=0.1", "--no-plots", "--out", str(out))
    make_report(ReportRequest(source=f"csv:{table}", metric=("reward",), baseline="lr=0.1", plots=False, out=out,
                              command=("rlvrlab", "report", *args)))
    first = (out / "comparisons.csv").read_bytes()
    again = make_report(ReportRequest(reanalyse=out))
    assert (out / "comparisons.csv").read_bytes() == first
    assert any(note.startswith("training metrics, per run: reward: the value in runs.csv")
               for note in again.result.notes)


def _tensorboard_runs(store: dict, monkeypatch: pytest.MonkeyPatch, started: float = 1.7e9) -> list[TBRun]:
    """The store's runs as TensorBoard runs (read_runs replaced): the same histories, named by folder, started at
    `started` + the run's index (s)."""
    runs = [TBRun(f"lr={lr},seed={seed}", {"lr": lr}, seed, {"reward": list(enumerate(history))}, started + i)
            for i, ((lr, seed), history) in enumerate(store["histories"].items())]
    from rlvrlab.report import tensorboard

    monkeypatch.setattr(tensorboard, "read_runs", lambda directory: runs)
    return runs


def _events(folder: Path) -> list[dict]:
    """sources.json's events without the run ids (MLflow's ids, TensorBoard's folder names)."""
    found = json.loads((folder / "sources.json").read_text())["events"]
    return [{**event, "groups": {group: [{k: v for k, v in run.items() if k != "run_id"} for run in runs]
                                 for group, runs in event["groups"].items()}} for event in found]


def test_tensorboard_runs_give_the_same_events_and_curves_as_mlflow(store: dict, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    events = ("reach: reward >= 0.5 for 2", "fall: reward < 0.3*initial | nonfinite")
    common = dict(metric=(METRIC,), baseline="lr=1e-05", events=events, smooth=3)
    make_report(ReportRequest(experiment="toy", group_by="lr", tracking_uri=store["uri"], out=tmp_path / "mlflow",
                              **common))
    _tensorboard_runs(store, monkeypatch)
    make_report(ReportRequest(source=f"tensorboard:{tmp_path}", out=tmp_path / "tb", **common))
    found = _events(tmp_path / "tb")
    assert found == _events(tmp_path / "mlflow") and len(found) == 2
    assert any(run["step"] is not None for group in found[0]["groups"].values() for run in group)  # it happened
    assert (tmp_path / "tb" / "comparisons.csv").read_bytes() == (tmp_path / "mlflow" / "comparisons.csv").read_bytes()
    assert (tmp_path / "tb" / "per_seed.csv").read_text().count("\n") == \
        (tmp_path / "mlflow" / "per_seed.csv").read_text().count("\n")
    assert (tmp_path / "tb" / "curve_reward.png").stat().st_size > 0  # from the runs' series, as from MLflow's


PROTOCOL = """# Does a larger learning rate help?

```verdict
precedence: first
rules:
  - verdict: helps
    all:
      - {comparison: lr=3e-05 vs lr=1e-05, metric: "reward:mean:4", where: delta > 0}
  - verdict: not shown
```
"""


def test_a_protocol_s_verdicts_come_from_every_source(store: dict, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvrlab.report.verdict import lines

    protocol = tmp_path / "protocol.md"
    protocol.write_text(PROTOCOL)
    common = dict(metric=(METRIC,), baseline="lr=1e-05", plots=False, protocol=protocol)
    by_mlflow = make_report(ReportRequest(experiment="toy", group_by="lr", tracking_uri=store["uri"],
                                          out=tmp_path / "mlflow", **common))
    rows = [r for r in csv.DictReader((tmp_path / "mlflow" / "per_seed.csv").open()) if r["section"] == "train"]
    table = tmp_path / "runs.csv"
    table.write_text("lr,seed,reward\n" + "".join(f"{r['group'].removeprefix('lr=')},{r['seed']},{r['value']}\n"
                                                  for r in rows))
    by_csv = make_report(ReportRequest(source=f"csv:{table}", out=tmp_path / "csv", **common))
    runs = _tensorboard_runs(store, monkeypatch, started=1.7e9)
    by_tb = make_report(ReportRequest(source=f"tensorboard:{tmp_path}", out=tmp_path / "tb", **common))
    shown = lines(by_mlflow.verdicts)
    assert ": helps (" in shown[-1] and lines(by_csv.verdicts) == shown and lines(by_tb.verdicts) == shown
    recorded = {name: json.loads((tmp_path / name / "sources.json").read_text())["protocol"]
                for name in ("mlflow", "csv", "tb")}
    first = datetime.fromtimestamp(min(run.started for run in runs), tz=timezone.utc).isoformat()
    assert recorded["tb"]["first_run_start"] == first  # the first event's wall time
    assert recorded["csv"]["first_run_start"] == "unknown" and not recorded["csv"]["pre_registered"]
    assert recorded["csv"]["reason"].startswith("the runs' start times are unknown (a CSV has none)")
    assert "the file is not committed" in recorded["csv"]["reason"]  # the file's own state still checked
    assert any("NOT pre-registered: the runs' start times are unknown" in n for n in by_csv.result.notes)
