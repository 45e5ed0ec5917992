"""A run's life around its steps: how it ends (stopped, interrupted, nothing left) and what `rlvrlab train` says
then, its --tag options, where a resume starts and the command that does it, what an extension records, what a full
disk or a held store says, and the toy tier's one torch thread."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rlvrlab import outputs, rundir
from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import RlvrlabError, StorageError
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.store import StoreLost, store
from rlvrlab.train import checkpoint
from rlvrlab.train.setup import Run

EXTENSION_NOTE = "# resume: steps extended from"


class RunStopped(Exception):
    """Raised by an on_step callback to end a run early on purpose (a sweep's pruner); the MLflow run ends KILLED."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (rlvrlab.procs.install_stop_handlers) stopped a run: its MLflow run ended KILLED and its
    checkpoints stay; `rlvrlab train --resume run_id` continues it from `checkpoint_step` (None: none saved yet)."""

    def __init__(self, run_id: str, step: int, checkpoint_step: int | None):
        super().__init__(run_id)
        self.run_id, self.step, self.checkpoint_step = run_id, step, checkpoint_step


class NothingLeft(Exception):
    """`--resume` of a FINISHED run (or, tracking.backend=none, any run) that has trained all its steps: nothing was
    done and its records are unchanged."""

    def __init__(self, run_id: str, steps: int):
        super().__init__(run_id)
        self.run_id, self.steps = run_id, steps


def stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def resume_point(run_folder: Path, run_id: str, warn: Callable[[str], None]) -> Path:
    """Where `--resume` continues: the run's newest intact checkpoint (rundir.newest_intact)."""
    return rundir.newest_intact(run_folder, run_id, purpose="resumed", warn=warn,
                                fix="it cannot be resumed (set trainer.checkpoint_every > 0 for future runs)")


def nothing_left_or_extension(cfg: RunConfig, run_id: str, folder: Path, run_folder: Path) -> int | None:
    """Raise NothingLeft for a FINISHED run whose checkpoint holds all its steps; else the steps the run had before
    this resume when steps= extends it (None when it keeps its steps)."""
    from rlvrlab.config.compose import compose

    saved = compose(rundir.config_file(run_folder)).steps
    if rundir.step_of(folder) >= cfg.steps:
        if cfg.tracking.backend == "none":  # no records a resume could finish: the checkpoint holds every step
            raise NothingLeft(run_id, cfg.steps)
        from rlvrlab.tracking.mlflow_tracker import quiet_client

        try:
            status = quiet_client(store(cfg.output_dir, cfg.tracking.uri).uri).get_run(run_id).info.status
        except Exception:  # no such run: build() says so in one line
            status = None
        if status == "FINISHED":
            raise NothingLeft(run_id, cfg.steps)
    return saved if cfg.steps > saved else None


def extension_notes(run_folder: Path) -> list[str]:
    """The comment lines earlier extensions left above the run's config.yaml."""
    return [line for line in rundir.config_file(run_folder).read_text().splitlines()
            if line.startswith(EXTENSION_NOTE)]


def record_extension(run: Run, notes: list[str], extended_from: int | None) -> None:
    """A run extended by --resume steps=N: the MLflow run says from how many steps (its steps param stays the
    one it started with), and config.yaml keeps one comment line per extension above the config (build() has just
    rewritten it with the new steps)."""
    if extended_from is not None:
        notes = [*notes, f"{EXTENSION_NOTE} {extended_from} to {run.cfg.steps} at "
                         f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}"]
    if not notes or run.rank != 0:
        return
    config = rundir.config_file(run.run_dir)
    outputs.write_replacing(config, "\n".join(notes) + "\n" + config.read_text())  # whole or as it was
    if extended_from is not None:
        froms = [line.removeprefix(EXTENSION_NOTE).split()[0] for line in notes]
        run.tracker.set_tags({T.STEPS_EXTENDED_FROM: ",".join(froms), T.STEPS: str(run.cfg.steps)})


def _store_lost(error: BaseException | None) -> StoreLost | None:
    """The StoreLost that `error` is or was raised while handling, if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, StoreLost):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def storage_trouble(error: BaseException) -> str | None:
    """What stopped a run in its store: "lost" (its sqlite store was deleted or replaced while it trained), "full"
    or "held" (rlvrlab.outputs.full_or_held); None for anything else."""
    return "lost" if _store_lost(error) is not None else outputs.full_or_held(error)


def stopped_by_storage(run: Run, error: Exception, trouble: str) -> StorageError:
    """A full disk, a held store or a store that vanished stopped the run: one line saying what, from where it
    continues and how. What is stored stays: a checkpoint is COMPLETE only once the metrics of its steps are stored,
    and its files are checked before a resume reads them. A store that vanished took the run's record with it: the
    line says so and where the checkpoints are, which a resume can use only once the store is back."""
    lost = _store_lost(error) if trouble == "lost" else None
    if lost is not None:
        last = checkpoint.latest(run.run_dir)
        command = shlex.join(["rlvrlab", "train", "--resume", run.tracker.run_id, f"output_dir={run.cfg.output_dir}"])
        then = (f"newest complete checkpoint step {checkpoint.step_of(last)}); `--resume` needs the run's record: "
                f"put {lost.path} back (from a backup), then `{command}` continues it, or train it again"
                if last else "no checkpoint was complete); train it again")
        return StorageError(f"run {run.tracker.run_id} stopped: {lost.what}; its checkpoints and config.yaml are in "
                            f"{run.run_dir} ({then}", what=lost.what)
    what = error.what if isinstance(error, StorageError) else (
        ("no space left on the device" if trouble == "full" else "the MLflow store is locked by another process")
        + f" ({type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''})")
    last = checkpoint.latest(run.run_dir)
    command = shlex.join(["rlvrlab", "train", "--resume", run.tracker.run_id, f"output_dir={run.cfg.output_dir}"])
    then = (f"`{command}` continues it from step {checkpoint.step_of(last)}, its newest complete checkpoint"
            if last else "train it again (no checkpoint was complete)")
    fix = "free space there" if trouble == "full" else "wait for the process holding it to end"
    return StorageError(f"run {run.tracker.run_id} stopped: {what}; {fix}, then {then}", what=what)


def tag_failure(run: Run, error: BaseException) -> None:
    """Tag a run that is about to end FAILED with why (failure_reason), whatever raised. Best effort: a store that
    cannot take the tag (full, held) must not hide the error that failed the run, which is raised on."""
    try:
        run.tracker.set_tags({T.FAIL_REASON: T.failure_reason(error)})
    except Exception:  # noqa: BLE001 - the run's own error matters more than its tag
        pass


@contextmanager
def toy_threads(cfg: RunConfig) -> Iterator[None]:
    """The toy tier's tensors are a few hundred numbers: one torch thread. More threads only wake and spin for every
    op, 2-100x slower per op, worst on a loaded machine (bench/README.md, toy-tier sweeps)."""
    if cfg.model.tier != "toy" or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def kill_after_step() -> str | None:
    """RLVRLAB_KILL_AFTER_STEP=k: SIGKILL this process right after step k (tests of resume after a crash); read
    once per run, not at every step."""
    return os.environ.get("RLVRLAB_KILL_AFTER_STEP")


def fault_injection(step: int, kill_after: str | None) -> None:
    if kill_after == str(step):
        os.kill(os.getpid(), signal.SIGKILL)


def parse_tags(pairs: list[str]) -> dict[str, str]:
    """`--tag KEY=VALUE` options as a dict; a malformed one is a one-line error."""
    tags = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise RlvrlabError(f"--tag {pair}: give KEY=VALUE, e.g. --tag team=rl")
        tags[key.strip()] = value
    return tags


def resume_command(cfg: RunConfig, run_id: str) -> str:
    """The command that continues a run, shell-quoted for copy and paste."""
    words = ["rlvrlab", "train", "--resume", run_id]
    if cfg.output_dir != RunConfig.output_dir:
        words.append(f"output_dir={cfg.output_dir}")
    if cfg.tracking.uri:
        words.append(f"tracking.uri={cfg.tracking.uri}")
    return shlex.join(words)


def interrupted_error(cfg: RunConfig, stopped: RunInterrupted) -> RlvrlabError:
    """The one line after Ctrl-C or SIGTERM stopped a run: where it stopped and how it continues."""
    saved = (f"continue it from step {stopped.checkpoint_step} with `{resume_command(cfg, stopped.run_id)}`"
             if stopped.checkpoint_step is not None else "no checkpoint was saved yet (trainer.checkpoint_every)")
    return RlvrlabError(f"stopped at step {stopped.step}: MLflow run {stopped.run_id} ended KILLED; {saved}")


def nothing_left_line(cfg: RunConfig, finished: NothingLeft) -> str:
    """What `--resume` of a run that has trained all its steps says (nothing was done), and how to extend it."""
    return (f"nothing to do: run {finished.run_id} is FINISHED and has trained all its {finished.steps} steps; its "
            f"records are unchanged (to train it further: `{resume_command(cfg, finished.run_id)} "
            f"steps={2 * finished.steps}`)")


def done_lines(cfg: RunConfig, run_id: str) -> list[str]:
    """Where a finished run is recorded and its files are; none under torchrun but on rank 0 (the others have no
    run id)."""
    from rlvrlab.tracking.mlflow_tracker import ui_hint

    if os.environ.get("RANK", "0") != "0":
        return []
    output_dir = Path(cfg.output_dir).expanduser().resolve()
    files = f"  checkpoints and resolved config: {output_dir / run_id}"
    if cfg.tracking.backend == "none":
        return [f"done: run {run_id}, not recorded (tracking.backend=none)", files]
    uri = store(output_dir, cfg.tracking.uri).uri
    return [f"done: MLflow run {run_id} (experiment {cfg.experiment!r}) in {uri}",
            f"  look at it: {ui_hint(uri, run_id)}", files]
