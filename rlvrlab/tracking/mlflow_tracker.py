"""MLflow through its public client, batched. Metric points collect in a list on the training thread; a flush hands
them to one background thread that writes them with `MlflowClient.log_batch`, up to 1000 points a call (one call per
point costs ~45x more: docs/platform.md). `flush(wait=True)` returns once every point logged so far is stored: a
checkpoint counts as complete only after it (rlvrlab.train.checkpoint), and a run ends only after it (`finish`), so a
killed run keeps every metric of the steps its newest complete checkpoint holds.

MLflow's own asynchronous logging (`log_batch(synchronous=False)`) is not used: its queue thread, started once per
store, polls once a second and is joined at interpreter exit, so every store a process wrote through it adds up to
1 s to that process's exit (bench/README.md, "Update engines and MLflow logging"); its errors come back wrapped in one
MlflowException, where a full disk or a held store must be told apart (rlvrlab.outputs.full_or_held).

Where the store is: `rlvrlab.tracking.store`.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from rlvrlab.errors import RlvrlabError, StorageError
from rlvrlab.outputs import file_lock, full_or_held
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.store import StoreLost, check_reachable

_BATCH = 1000  # MLflow's limit of metrics per log_batch call
_FLUSH_SECONDS = 15.0  # metrics reach the store at least this often while a run is alive
PARAM_LIMIT = 6000  # MLflow's limit on a param value's length; a longer value is kept whole as an artifact


def quiet_client(uri: str):
    """An MlflowClient whose store does not log its sqlite schema migrations at INFO. A sqlite store is opened
    (created and migrated, the first time) under a file lock next to it, `.mlflow.lock`: two processes starting
    on a fresh output_dir at once would otherwise both create its tables and one would fail. Each call on a sqlite
    store waits while another process holds the file (`_patiently`). Any store is looked at first
    (`check_reachable`: a server that does not answer, a damaged sqlite file, a file store, an unknown scheme are one
    line in seconds, not minutes of MLflow's retries and a traceback); a read-only store is fine to read."""
    import logging
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no tqdm bars on stderr
    for name in ("alembic", "mlflow"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow logs every failed sqlite statement at ERROR with its traceback, then raises it: callers get the error
    # (tried again while the store is held, one line when it is not to be had), the log was a second copy
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    check_reachable(uri, write=False)  # commands that write looked with write=True before any work
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    path = uri.removeprefix("sqlite:///")

    def open_store():
        return _Patient(MlflowClient(tracking_uri=uri), path)  # the client opens the store: creates or migrates it

    lock = Path(path).expanduser().parent / STORE_LOCK
    try:
        with file_lock(lock):
            return _patiently(open_store, path)
    except OSError:  # a read-only folder: reading runs needs no lock; writing is refused earlier
        return _patiently(open_store, path)


STORE_LOCK = ".mlflow.lock"
STORE_WAIT_SECONDS = 60.0  # how long one call on a sqlite store waits while another process holds it


def _patiently(call, path: str, identity: tuple[int, int] | None = None):
    """call() on the sqlite store `path`, tried again while another process holds the file locked (each try waits
    too: sqlite 5 s to open a store, MLflow's sessions 20 s, or not at all when two transactions would wait for
    each other) for STORE_WAIT_SECONDS in all (RLVRLAB_STORE_WAIT_SECONDS sets another wait); then a one-line
    StorageError naming the file, as for a full disk at once. A try that failed on the lock rolled its transaction
    back: trying again writes nothing twice. identity: the file's (device, inode) when the store was opened; a call
    that fails on a store no longer there, or replaced (sqlite: "attempt to write a readonly database", or a new
    empty file with no tables), raises StoreLost."""
    import os

    wait = float(os.environ.get("RLVRLAB_STORE_WAIT_SECONDS", STORE_WAIT_SECONDS))
    deadline = time.monotonic() + wait
    while True:
        try:
            return call()
        except Exception as error:
            if identity is not None and not isinstance(error, StorageError) and file_identity(path) != identity:
                raise StoreLost(path) from None
            trouble = full_or_held(error)
            if trouble is None or isinstance(error, StorageError):
                raise
            if trouble == "full":
                raise StorageError(f"the MLflow store {path} cannot be written: no space left on its device; free "
                                   "space there, then run the command again",
                                   what=f"no space left on the device of the MLflow store {path}") from None
            if time.monotonic() >= deadline:
                raise StorageError(f"the MLflow store {path} is locked by another process (still after {wait:g} s); "
                                   "wait for the process writing it to end, then run the command again",
                                   what=f"the MLflow store {path} is locked by another process") from None
            time.sleep(1.0)


class _Patient:
    """An MlflowClient of a local sqlite store whose public calls go through `_patiently`; its other attributes are
    the client's own."""

    def __init__(self, client, path: str):
        self._client, self._path, self._identity = client, path, file_identity(path)

    def __getattr__(self, name: str):
        value = getattr(self._client, name)
        if name.startswith("_") or not callable(value):
            return value

        @functools.wraps(value)
        def call(*args, **kwargs):
            return _patiently(partial(value, *args, **kwargs), self._path, self._identity)

        return call


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, None when there is none."""
    import os

    try:
        found = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    return found.st_dev, found.st_ino


# MLflow's experiment tag for what an experiment is for, and its value for model training. mlflow has no Python
# constant for either: the UI's bundle defines them (mlflow/server/js: the ExperimentKind enum,
# CUSTOM_MODEL_DEVELOPMENT = "custom_model_development", read from the tag "mlflow.experimentKind"), MLflow's
# assistant's skill mlflow-onboarding documents them (in mlflow/assistant/skills) and its demo sets the
# GenAI value (mlflow/demo/generators/traces.py). MLflow 3.17.2's UI does not pick its view by the tag: its
# experiment-kind hook returns the tag only while a feature flag is off, and its build has the flag on; it returns
# the kind of the UI's GenAI / Model training switch, set by the address (`ui_address`) or by the user's last click
# in that browser. The tag still tells MLflow's assistant, and anyone reading the store, what the experiment is.
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
UI_MODEL_TRAINING = "workflowType=machine_learning"  # the UI's URL query for its Model training view


def experiment_id_for(client, name: str, artifact_root: Path | None) -> str:
    """The id of MLflow experiment `name`, created (artifacts under artifact_root) when it does not exist yet, and
    marked as a model-training experiment (`mark_model_training`)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        mark_model_training(client, found)
        return found.experiment_id
    location = artifact_root.resolve().as_uri() if artifact_root is not None else None
    try:
        return client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND: MODEL_TRAINING})
    except MlflowException:  # another process created it in between
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        mark_model_training(client, found)
        return found.experiment_id


def mark_model_training(client, experiment) -> None:
    """Tag an MLflow experiment (an mlflow.entities.Experiment) as model training, unless it says what it is for
    already: one made before rlvrlab set the tag gets it on its next use; a kind a user chose is kept."""
    if EXPERIMENT_KIND not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)


def ui_address(experiment_id: str, host: str = "http://127.0.0.1:5000") -> str:
    """The page of an experiment's runs in the MLflow UI served at `host`, in its Model training view. MLflow 3.17's
    UI opens an experiment in its GenAI view, where training runs do not show, unless the address asks for the
    Model training view or the user switched to it before in that browser (bench/mlflow_ui_check.py checks both in
    a headless browser)."""
    return f"{host}/#/experiments/{experiment_id}/runs?{UI_MODEL_TRAINING}"


def ui_hint(uri: str, run_id: str) -> str:
    """How to see the experiment of run `run_id` of store `uri` in the MLflow UI, in its Model training view: a
    tracking server is its own UI; a local store needs `mlflow ui` first (the command shell-quoted)."""
    import shlex

    experiment_id = quiet_client(uri).get_run(run_id).info.experiment_id
    if uri.startswith(("http://", "https://")):
        return ui_address(experiment_id, host=uri.rstrip("/"))
    return f"{shlex.join(['mlflow', 'ui', '--backend-store-uri', uri])}  then open {ui_address(experiment_id)}"


def _file_name(key: str) -> str:
    import re

    return re.sub(r"[^\w.=+-]", "_", key) + ".txt"


class MlflowTracker:
    def __init__(self, uri: str, experiment: str, *, artifact_root: Path | None, run_id: str | None = None,
                 run_name: str | None = None, tags: Mapping[str, str] | None = None):
        self.client = quiet_client(uri)
        self.prior_status = "RUNNING"  # a resumed run's status before this process took it up
        if run_id is None:
            experiment_id = experiment_id_for(self.client, experiment, artifact_root)
            run_id = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {})).info.run_id
        else:
            try:
                info = self.client.get_run(run_id).info
            except Exception as error:  # mlflow raises its own MlflowException for unknown ids
                raise RlvrlabError(f"--resume {run_id}: no such MLflow run in {uri} ({error})") from None
            self.prior_status = info.status
            mark_model_training(self.client, self.client.get_experiment(info.experiment_id))
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self._buffer: list = []
        self._last_flush = time.monotonic()
        self._written: threading.Event | None = None  # set once the points of the last flush are stored
        self._error: BaseException | None = None

    def log_params(self, params: Mapping[str, object]) -> None:
        from mlflow.entities import Param

        items, cut = [], []
        for key, value in params.items():
            text = str(value)
            if len(text) > PARAM_LIMIT:  # never cut silently: the whole value is an artifact the param names
                note = f"... [truncated: {len(text)} characters; full value in artifact params/{_file_name(key)}]"
                self.client.log_text(self.run_id, text, f"params/{_file_name(key)}")
                text = text[: PARAM_LIMIT - len(note)] + note
                cut.append(key)
            items.append(Param(key, text))
        self.client.log_batch(self.run_id, params=items)  # in calls of MLflow's 100 params
        if cut:
            from rlvrlab.tracking.tags import TRUNCATED_PARAMS

            self.set_tags({TRUNCATED_PARAMS: ",".join(cut)})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # MLflow stores NaN but not +-inf portably; non-finite values are logged as NaN
        self._buffer += [Metric(k, v if math.isfinite(v) else math.nan, now, step) for k, v in metrics.items()]
        if time.monotonic() - self._last_flush > _FLUSH_SECONDS:
            self.flush(wait=False)

    def log_texts(self, files: Mapping[str, str]) -> None:
        """One log_artifacts call for all of them (each log_text call costs ~6 ms of store lookups here)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="rlvrlab-artifacts-") as folder:
            for name, text in files.items():
                path = Path(folder, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            self.client.log_artifacts(self.run_id, folder)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def flush(self, wait: bool = True) -> None:
        """Write the buffered metrics on the background thread (one writer at a time, in order). A KeyboardInterrupt
        (a second Ctrl-C or SIGTERM, rlvrlab.procs) cannot lose points: the buffer is emptied only once its writer
        has started, and a wait for the writer goes on to its end before the interrupt is raised (points written
        twice are stored once: MLflow drops a metric identical in key, value, step and timestamp)."""
        self._join()
        metrics = self._buffer
        self._last_flush = time.monotonic()
        if not metrics:
            return
        written = threading.Event()

        def write() -> None:
            try:
                self._write(metrics)
            finally:  # whatever _write does: a waiter is never left waiting
                written.set()

        threading.Thread(target=write, name="rlvrlab-mlflow", daemon=True).start()
        self._written, self._buffer = written, []
        if wait:
            self._join()

    def _write(self, metrics: list) -> None:
        try:
            for i in range(0, len(metrics), _BATCH):
                retry_locked(partial(self.client.log_batch, self.run_id, metrics=metrics[i : i + _BATCH]))
        except BaseException as error:  # re-raised on the training thread by the next flush
            self._error = error

    def _join(self) -> None:
        """Wait for the writer's points to be stored. It waits on an Event, not Thread.join: a join interrupted by
        KeyboardInterrupt marks a running thread as stopped (CPython 3.11's bpo-45274 handling releases the lock the
        thread holds), after which nothing could wait for it."""
        interrupted: KeyboardInterrupt | None = None
        while self._written is not None:
            try:
                self._written.wait()
                self._written = None
            except KeyboardInterrupt as signal:  # the points being written are written first
                interrupted = signal
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if interrupted is not None:
            raise interrupted

    def finish(self, status: str) -> None:
        """Write every buffered metric, then end the run with `status`. The status is written even when the metrics
        could not be (a run left RUNNING reads as alive to `sweep status` and to liveness checks): FINISHED turns
        FAILED then, and the write's error is raised."""
        try:
            self.flush(wait=True)
        except BaseException as error:
            if status == "FINISHED":  # a FAILED run says why (best effort: the store may refuse this too)
                status = "FAILED"
                try:
                    self.client.set_tag(self.run_id, T.FAIL_REASON, T.failure_reason(error))
                except Exception:  # noqa: BLE001 - the flush's own error is raised below
                    pass
            retry_locked(partial(self.client.set_terminated, self.run_id, status=status))
            raise
        retry_locked(partial(self.client.set_terminated, self.run_id, status=status))


LOCK_RETRIES = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds between tries


def retry_locked(write):
    """`write()`, tried again while a sqlite store answers "database is locked". Several processes write one file:
    a sweep's workers all end their runs at one signal, beside readers. MLflow's sessions wait 20 s for a lock,
    which a loaded machine can outlast, and sqlite answers at once, without waiting, when two transactions would
    wait for each other. In 1 of 14 runs of tests/sweep/test_sweep.py's killed-sweep test on 2 loaded cores, a
    stopping worker logged this error and left its seed run RUNNING."""
    for wait in (*LOCK_RETRIES, None):
        try:
            return write()
        except Exception as error:
            if wait is None or "database is locked" not in str(error):
                raise
            time.sleep(wait)
