"""verl on a pre-started Ray cluster, swept by rlvrlab: the MLflow variables a command sweep hands its command reach
verl's logger only when the command forwards them to Ray (docs/sweeps.md, "verl"; docs/scaling.md).

A command sweep creates each seed's MLflow run and starts the command with MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_ID
and MLFLOW_RUN_ID in its environment. verl's MLflow logger runs in the TaskRunner actor, not in the command's
process. When verl's own `ray.init` starts Ray, the actors are children of the command and inherit them; when it
joins a cluster started before (`ray start --head` on each node), the actors are children of that cluster's raylet
and have *its* environment. Here the cluster is started (its own temp dir and free ports, a 100 MB object store, 1
CPU, no dashboard) with an environment whose MLFLOW_TRACKING_URI names another store, as a node set up for a
lab-wide MLflow server would be. It is joined at 127.0.0.1, but Ray 2.60 does not stay there: it turns a loopback
`--node-ip-address` into the host's address (ray._private.services.resolve_ip_for_localhost) and its GCS and raylet
listen on all interfaces, so the flag is not given; the own ports and temp dir keep it apart from any other cluster. Two command sweeps run `tests/integrations/ray_cluster_check.py` with the verl environment's
python: verl's own config and `main_ppo.run_ppo` (its ray.init, with `+ray_kwargs.ray_init.address=auto`), and a
TaskRunner that logs through verl's own `Tracking` as verl's trainer does.

- forwarded (`+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID="'$MLFLOW_RUN_ID'"`, and the same for the
  other two): the actor sees the seed run's coordinates, verl's logger re-attaches to the seed run, the metrics land
  there under verl's names, the run ends FINISHED and the seed has its objective;
- not forwarded: the actor sees the cluster's store and no MLFLOW_RUN_ID, so verl's logger opens a new run in
  experiment `trainer.project_name` of that store, un-nested and untagged; the seed run stays empty and the seed
  fails ("logged no 'critic/score/mean'").

The cluster is stopped by signalling the process group of the `ray start --head --block` this test started (never
`ray stop`, which stops every Ray cluster of the machine's user). It needs ray, verl and mlflow in the verl
environment (`make verl-env`); like tests/integrations/test_verl.py, a missing environment is a failure, and the
test skips only where that environment's python cannot import ray.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlvrlab.tracking import tags as T

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "integrations" / "ray_cluster_check.py"
RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))
START_TIMEOUT = 180  # s for `ray start` on a busy 2-core machine (measured ~15 s idle)
SWEEP_TIMEOUT = 420  # s per sweep: rlvrlab's start, verl's imports in the driver and again in the actor
# the three variables, forwarded through verl's `ray_kwargs.ray_init.runtime_env` (Hydra's `+`: `env_vars` is not
# in verl's schema); quoted for Hydra ("'...'") so that MLFLOW_EXPERIMENT_ID stays a string: unquoted, Hydra reads
# `1` as an int, and Ray refuses env_vars values that are not strings
FORWARD = " ".join(f""""+ray_kwargs.ray_init.runtime_env.env_vars.{name}='${name}'\""""
                   for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID"))
OBJECTIVE = "critic/score/mean"


def verl_python() -> Path:
    return Path(os.environ.get("RLVRLAB_VERL_PYTHON") or REPO / ".venv-verl" / "bin" / "python")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST", "MLFLOW_", "RAY_")) and k != "VERL_PYTHON"}


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of our `ray start --block` (it shuts its processes down), then SIGKILL to what
    is left of that group; only processes this test started."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.wait(timeout=5)
                return
            proc.poll()
            time.sleep(0.5)


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[dict]:
    """A one-node Ray cluster started as `ray start --head` on a node: its address, and the MLflow store its
    environment names (a node's own, not the sweep's)."""
    python = verl_python()
    if not python.exists():
        pytest.fail(f"no verl environment at {python}: run `make verl-env` (or set RLVRLAB_VERL_PYTHON)")
    probe = subprocess.run([str(python), "-c", "import ray, mlflow, verl.utils.tracking"], capture_output=True,
                           text=True, timeout=300, env={**_clean_env(), "OMP_NUM_THREADS": "1"})
    if probe.returncode != 0 and "No module named 'ray'" in probe.stderr:
        pytest.skip(f"ray cannot be imported by {python}")
    assert probe.returncode == 0, probe.stderr[-4000:]
    temp = Path(tempfile.mkdtemp(prefix="rlvrlab-ray-", dir="/tmp"))  # short: Ray's socket paths must be
    gcs, client, agent_grpc, agent_http, metrics, runtime_env, manager, objects = _free_ports(8)
    cluster_store = f"sqlite:///{tmp_path / 'cluster.db'}"
    env = {**_clean_env(), "MLFLOW_TRACKING_URI": cluster_store, "RAY_USAGE_STATS_ENABLED": "0",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "VERL_USE_EXTERNAL_MODULES": ""}
    command = [str(python.parent / "ray"), "start", "--head", "--block",
               f"--port={gcs}", f"--ray-client-server-port={client}", f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--dashboard-agent-listen-port={agent_http}", f"--metrics-export-port={metrics}",
               f"--runtime-env-agent-port={runtime_env}", f"--node-manager-port={manager}",
               f"--object-manager-port={objects}", "--num-cpus=1", "--num-gpus=0",
               "--object-store-memory=100000000", "--include-dashboard=false", "--disable-usage-stats",
               f"--temp-dir={temp}"]
    log = (tmp_path / "ray_start.log").open("w")
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: stopped by its id, nothing else
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not (temp / "ray_current_cluster").exists():  # written once the head node is up
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`ray start --head` did not come up (exit {proc.returncode}):\n"
                            + (tmp_path / "ray_start.log").read_text()[-4000:])
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{gcs}", "store": cluster_store, "python": python}
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _sweep(tmp_path: Path, cluster: dict, name: str, forward: str) -> subprocess.CompletedProcess:
    """`rlvrlab sweep` (rlvrlab's environment) of one seed whose command is the check in verl's environment."""
    command = (f'"$VERL_PYTHON" {shlex.quote(str(SCRIPT))} --report-dir {shlex.quote(str(tmp_path))} '
               f"+ray_kwargs.ray_init.address=auto {forward} 'trainer.logger=[console,mlflow]' "
               "actor_rollout_ref.actor.optim.lr={lr} "
               "trainer.project_name={study} trainer.experiment_name={study}-seed{seed}")
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "command": command, "seeds": [0], "space": {"lr": [1.0e-6]},
                                "objective": {"metric": OBJECTIVE, "direction": "maximize", "window": 1}}))
    env = {**_clean_env(), "VERL_PYTHON": str(cluster["python"]), "RAY_ADDRESS": cluster["address"],
           "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "VERL_USE_EXTERNAL_MODULES": ""}
    return subprocess.run([str(RLVRLAB), "sweep", str(path), f"output_dir={tmp_path}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=SWEEP_TIMEOUT)


def _seed_run(client, study: str):
    experiment = client.get_experiment_by_name(study)
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{T.ROLE}` = 'seed'")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


@pytest.mark.heavy
@pytest.mark.slow
def test_verl_logs_into_the_seed_run_on_a_ray_cluster_only_when_the_mlflow_variables_are_forwarded(
        tmp_path: Path, ray_cluster: dict) -> None:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    cluster = mlflow.MlflowClient(ray_cluster["store"])

    # forwarded: verl's logger, in the TaskRunner actor, re-attaches to the seed run rlvrlab created
    forwarded = _sweep(tmp_path, ray_cluster, "ray_forwarded", FORWARD)
    output = forwarded.stdout[-6000:] + forwarded.stderr[-6000:]
    assert forwarded.returncode == 0, output
    seed = _seed_run(client, "ray_forwarded")
    seen = json.loads((tmp_path / "ray_forwarded-seed0.json").read_text())
    assert seen["seen"]["MLFLOW_RUN_ID"] == seed.info.run_id == seen["run_id"], (seen, output)
    assert seen["seen"]["MLFLOW_EXPERIMENT_ID"] == seed.info.experiment_id
    assert seen["seen"]["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert seed.info.status == "FINISHED"  # verl's Tracking.finish() ended it
    history = client.get_metric_history(seed.info.run_id, OBJECTIVE)
    assert sorted((m.step, m.value) for m in history) == [(0, 0.25), (1, 0.75)]
    assert "val-core/openai/gsm8k/acc/mean_at_4" in seed.data.metrics  # verl's sanitiser ran: its logger wrote
    assert seed.data.params.get("trainer/project_name") == "ray_forwarded"  # verl logged its config there
    assert seed.data.tags[T.PARENT] and seed.data.tags[T.STUDY] == "ray_forwarded"  # nested study -> trial -> seed
    assert seed.data.tags.get(T.OBJECTIVE) == "0.75", seed.data.tags
    assert cluster.search_experiments(filter_string="name = 'ray_forwarded'") == []  # nothing in the cluster's

    # not forwarded: the actor has the cluster's environment, and verl's logger opens a run of its own there
    plain = _sweep(tmp_path, ray_cluster, "ray_plain", "")
    output = plain.stdout[-6000:] + plain.stderr[-6000:]
    seed = _seed_run(client, "ray_plain")
    seen = json.loads((tmp_path / "ray_plain-seed0.json").read_text())
    assert seen["seen"] == {"MLFLOW_TRACKING_URI": ray_cluster["store"], "MLFLOW_EXPERIMENT_ID": None,
                            "MLFLOW_RUN_ID": None}, (seen, output)
    assert seed.info.status == "FAILED" and seed.data.metrics == {}, output
    assert f"logged no {OBJECTIVE!r}" in seed.data.tags.get(T.FAIL_REASON, ""), seed.data.tags
    stray = cluster.get_run(seen["run_id"])  # the run verl's logger opened: other store, un-nested, untagged
    assert stray.info.run_name == "ray_plain-seed0" and stray.info.status == "FINISHED"
    assert cluster.get_experiment(stray.info.experiment_id).name == "ray_plain"  # trainer.project_name
    assert sorted((m.step, m.value) for m in cluster.get_metric_history(stray.info.run_id, OBJECTIVE)) == \
        [(0, 0.25), (1, 0.75)]
    assert T.PARENT not in stray.data.tags and T.ROLE not in stray.data.tags
