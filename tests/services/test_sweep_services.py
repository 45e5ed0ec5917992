"""`rlvrlab sweep` against real services: two workers on one PostgreSQL study (a private cluster these tests start),
optuna-dashboard on the default journal file, and an unreachable storage URL.
Run: .venv/bin/pytest -q tests/services/test_sweep_services.py

PostgreSQL: `make test` installs the server binaries (Debian's postgresql package) when they are missing. Without
them the PostgreSQL tests skip, or fail where RLVRLAB_REQUIRE_SERVICES=1 (CI: .ci/run sets it).
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres import Cluster, free_port, server_bindir

from rlvrlab.tracking import tags as T

REQUIRE_SERVICES = os.environ.get("RLVRLAB_REQUIRE_SERVICES") == "1"
BIN = Path(sys.executable).parent

TAUS = [0.0, 0.25, 0.5, 1.0]


def _missing(reason: str) -> None:
    """Skip, or fail where the services are required (CI)."""
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (RLVRLAB_REQUIRE_SERVICES=1: required here)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A private PostgreSQL cluster for this test session: postgresql://postgres@127.0.0.1:PORT/rlvrlab."""
    bindir = server_bindir()
    if bindir is None:
        _missing("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb or initdb on PATH); "
                 "`make test` installs them (apt-get install postgresql)")
    try:  # the driver SQLAlchemy picks for postgresql:// (psycopg from SQLAlchemy 2.1 on, psycopg2 before)
        from sqlalchemy.engine import make_url

        make_url("postgresql://").get_dialect().import_dbapi()
    except ImportError as error:
        _missing(f"no PostgreSQL driver for postgresql:// URLs ({error}); install rlvrlab[postgres] (in the dev extra)")
    cluster = Cluster(bindir)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _executable(name: str) -> str:
    found = shutil.which(name, path=str(BIN))
    assert found, f"no {name} next to {sys.executable}; install the dev extra: .venv/bin/pip install -e '.[dev]'"
    return found


def _sweep_file(folder: Path, name: str, taus: list[float], seeds: int) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\nexperiment: toy\noverrides: [algorithm=ucpo, steps=20]\nsampler: grid\n"
                    f"seeds: {seeds}\nspace:\n  algorithm.tau: {json.dumps(taus)}\n"
                    "objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 5}\n")
    return path


def _sweep(*args: str, cwd: Path) -> subprocess.Popen:
    # COLUMNS: an error stays one line; the toy runs are small, so two workers need no more than a few threads each
    env = {**os.environ, "COLUMNS": "40", "OMP_NUM_THREADS": "2"}
    return subprocess.Popen([_executable("rlvrlab"), "sweep", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"rlvrlab sweep did not end within {timeout} s; stderr: {err[-3000:]}")
    return proc.returncode, out, err


def _wait_for(url: str, server: subprocess.Popen, timeout: float = 60.0) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{server.args[0]} exited ({server.returncode}): {server.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return response.read()
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@pytest.mark.slow
@pytest.mark.heavy
def test_two_workers_share_one_postgres_study(postgres_url: str, tmp_path: Path) -> None:
    """Two `rlvrlab sweep --storage postgresql://...` started together (as on two machines, same records folder):
    each grid point runs exactly once, and MLflow holds one study -> 4 trials -> 8 seeds tree."""
    import optuna
    from mlflow.tracking import MlflowClient

    name = f"pg_grid_{uuid.uuid4().hex[:8]}"  # the session's database may hold other studies
    path = _sweep_file(tmp_path, name, TAUS, seeds=2)
    workers = [_sweep(str(path), "--storage", postgres_url, cwd=tmp_path) for _ in range(2)]
    try:
        results = [_finish(proc) for proc in workers]
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for code, out, err in results:
        assert code == 0, f"exit {code}\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]

    study = optuna.load_study(study_name=name, storage=postgres_url)
    trials = study.get_trials(deepcopy=False)
    states = [(t.number, t.state.name, t.params) for t in trials]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials), states
    assert sorted(t.params["algorithm.tau"] for t in trials) == TAUS, states  # every point once, nothing else
    by_worker = defaultdict(list)
    for t in trials:
        by_worker[t.system_attrs.get("rlvrlab.worker", "?").split(":")[1]].append(t.number)
    print(f"trials per worker pid: {dict(by_worker)}")  # both usually run some; timing-dependent, not asserted

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    role = defaultdict(list)
    for run in runs:
        role[run.data.tags.get("rlvrlab.role")].append(run)
    assert {k: len(v) for k, v in role.items()} == {"study": 1, "trial": 4, "seed": 8}
    study_run = role["study"][0]
    assert study_run.info.status == "FINISHED"
    trial_runs = {run.info.run_id: run for run in role["trial"]}
    for run in trial_runs.values():
        assert run.data.tags[T.PARENT] == study_run.info.run_id
        assert run.data.tags["rlvrlab.study"] == name and run.info.status == "FINISHED"
    assert sorted(int(run.data.tags["rlvrlab.trial"]) for run in trial_runs.values()) == sorted(
        t.number for t in trials)
    seeds_by_hash: dict[str, set[str]] = defaultdict(set)
    for run in role["seed"]:
        assert run.info.status == "FINISHED"
        parent = trial_runs.get(run.data.tags[T.PARENT])
        assert parent is not None, f"seed run {run.info.run_id}'s parent is not a trial run"
        assert run.data.tags["config_hash"] == parent.data.tags["config_hash"]
        assert run.data.tags["rlvrlab.trial"] == parent.data.tags["rlvrlab.trial"]
        seeds_by_hash[run.data.tags["config_hash"]].add(run.data.tags["seed"])
    assert set(seeds_by_hash) == {run.data.tags["config_hash"] for run in trial_runs.values()}
    assert len(seeds_by_hash) == 4 and all(seeds == {"0", "1"} for seeds in seeds_by_hash.values()), seeds_by_hash


@pytest.mark.slow
@pytest.mark.heavy
def test_optuna_dashboard_reads_the_default_journal(tmp_path: Path) -> None:
    """What the end of `rlvrlab sweep` tells the user to run: `optuna-dashboard <output_dir>/optuna.journal`."""
    name = "dash_one_point"
    code, out, err = _finish(_sweep(str(_sweep_file(tmp_path, name, [0.5], seeds=1)), cwd=tmp_path))
    assert code == 0, f"exit {code}\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
    journal = tmp_path / "runs" / "optuna.journal"
    assert journal.is_file()
    assert f"optuna-dashboard {journal}" in out  # the printed command names this file

    port = free_port()
    dashboard = subprocess.Popen([_executable("optuna-dashboard"), str(journal), "--port", str(port), "--host",
                                  "127.0.0.1"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
    try:
        listing = json.loads(_wait_for(f"http://127.0.0.1:{port}/api/studies", dashboard))
        studies = {s["study_name"]: s for s in listing["study_summaries"]}
        assert name in studies, listing
        detail = json.loads(_wait_for(f"http://127.0.0.1:{port}/api/studies/{studies[name]['study_id']}", dashboard))
        assert [(t["number"], t["state"]) for t in detail["trials"]] == [(0, "Complete")], detail["trials"]
    finally:
        dashboard.terminate()
        try:
            dashboard.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dashboard.kill()
            dashboard.wait()


@pytest.mark.slow
@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://postgres@127.0.0.1:1/nope", "postgresql://postgres@127.0.0.1:1/nope"),
    ("postgresql://postgres:s3cret@127.0.0.1:1/nope", "postgresql://postgres:***@127.0.0.1:1/nope"),
], ids=["plain", "password"])
def test_an_unreachable_storage_is_one_error_line(tmp_path: Path, url: str, shown: str) -> None:
    """No server needed: nothing listens on port 1. Exit 1, one `error:` line naming the URL (its password masked),
    no traceback."""
    code, out, err = _finish(_sweep(str(_sweep_file(tmp_path, "unreachable", [0.5], seeds=1)), "--storage", url,
                                    cwd=tmp_path), timeout=120)
    assert code == 1, f"exit {code}\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and shown in lines[0], err
    assert "Traceback" not in out + err and "s3cret" not in out + err
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # nothing was started


@pytest.mark.slow
@pytest.mark.parametrize("change", ["role", "database", "password"])
def test_a_database_store_that_refuses_the_session_is_one_line_in_seconds(postgres_url: str, tmp_path: Path,
                                                                         change: str) -> None:
    """Issue 44: a PostgreSQL tracking.uri whose server is up but refuses the session (no such role, no such
    database, a role with a password given) is one `error:` line naming the server, its password masked, before any
    work; MLflow's engine retries took ~112 s before a traceback. The bound is against a hang, not a speed
    assertion."""
    from urllib.parse import urlsplit

    parts = urlsplit(postgres_url)
    uri = {"role": postgres_url.replace("postgres@", "nosuchrole@", 1),
           "database": postgres_url.rsplit("/", 1)[0] + "/nosuchdb",
           "password": f"postgresql://nosuchrole:s3cret@{parts.hostname}:{parts.port}/rlvrlab"}[change]
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "train", "toy", "steps=1",
                             f"output_dir={tmp_path / 'runs'}", f"tracking.uri={uri}"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "RLVRLAB_NO_PROGRESS": "1"})
    elapsed = time.monotonic() - start
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "refused the session" in lines[0] and "Traceback" not in result.stderr and "s3cret" not in result.stderr
    assert ("nosuchrole" if change != "database" else "nosuchdb") in lines[0]
    assert elapsed < 15, elapsed
    assert not (tmp_path / "runs").exists()  # nothing was started


@pytest.mark.slow
@pytest.mark.heavy
def test_slurm_launcher_workers_share_postgres_and_an_mlflow_server(postgres_url: str, tmp_path: Path) -> None:
    """`rlvrlab sweep --launcher slurm --workers 2` through submitit's local executor (the same pickled job path as
    sbatch, on this machine): two worker jobs claim the trials from one PostgreSQL study and log to an `mlflow
    server` this test starts; each seed run is a child `rlvrlab train` of 2 gloo ranks (torchrun, DeepSpeed)."""
    import optuna
    from mlflow.tracking import MlflowClient

    name = f"slurm_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nexperiment: toy\noverrides: [algorithm=ucpo, steps=6, trainer.engine=deepspeed, "
                    "trainer.checkpoint_every=6]\nsampler: grid\nseeds: 1\nspace:\n  algorithm.tau: [0.0, 1.0]\n"
                    "objective: {metric: policy/toy_correct_uniformity, direction: maximize, window: 3}\n"
                    "launcher: {type: slurm, nproc: 2}\nslurm: {cluster: local, time: 20}\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination",
         str(tmp_path / "server-artifacts")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{uri}/health", server, timeout=120)
        code, out, err = _finish(_sweep(str(path), "--workers", "2", "--storage", postgres_url,
                                        f"tracking.uri={uri}", "output_dir=out", cwd=tmp_path), timeout=900)
        assert code == 0, f"exit {code}\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
        assert "2/2 trials done" in out

        study = optuna.load_study(study_name=name, storage=postgres_url)
        trials = study.get_trials(deepcopy=False)
        assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
        assert sorted(t.params["algorithm.tau"] for t in trials) == [0.0, 1.0]
        jobs = tmp_path / "out" / "slurm" / name
        assert len(list(jobs.glob("*_result.pkl"))) == 2, sorted(p.name for p in jobs.iterdir())
        results = [pickle.loads(p.read_bytes()) for p in jobs.glob("*_result.pkl")]
        assert [outcome for outcome, _ in results] == ["success", "success"], results
        assert sum(ran for _, ran in results) == 2  # the jobs' workers ran the two trials between them

        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(name)
        runs = client.search_runs([experiment.experiment_id], max_results=100)
        role = defaultdict(list)
        for run in runs:
            role[run.data.tags.get("rlvrlab.role")].append(run)
        assert {k: len(v) for k, v in role.items()} == {"study": 1, "trial": 2, "seed": 2}
        trial_ids = {run.info.run_id for run in role["trial"]}
        for run in role["seed"]:
            assert run.info.status == "FINISHED" and run.data.tags[T.PARENT] in trial_ids
            history = client.get_metric_history(run.info.run_id, "train/reward")
            assert sorted(m.step for m in history) == list(range(6))  # rank 0 alone logs
            checkpoint = tmp_path / "out" / run.info.run_id / "checkpoints" / "step_000006"
            assert {p.name for p in checkpoint.glob("state_rank*.pt")} == {"state_rank0.pt", "state_rank1.pt"}
        assert not (tmp_path / "out" / "mlflow.db").exists()  # every record went to the server
    finally:
        server.terminate()
        server.wait(timeout=30)

