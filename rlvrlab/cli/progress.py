"""Progress displays of the commands: rich's bar on a terminal, plain lines elsewhere.

A rich bar written to a file or a pipe is drawn once, at 80 columns, and its columns are cut to fit
(`200/2… 0:00… 0:00:…`). Without a terminal a command prints instead one whole line now and then:

    train grpo tiny/countdown seed 0: 120/200 steps (60%), 0:01:10 elapsed, ~0:00:47 left, reward 0.312

and keeps libraries' own tqdm bars (transformers' "Loading weights", Hugging Face downloads) out of that output.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Optional

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rlvrlab.procs import quiet_library_bars

PLAIN_EVERY_PERCENT = 10  # a plain line each time the done share crosses a multiple of this ...
PLAIN_EVERY_SECONDS = 30.0  # ... or once this long has passed since the last line, whichever comes first


def progress_display(console: Console, *columns: str | ProgressColumn, unit: str = "", disable: bool = False,
                     **options: Any) -> Progress:
    """rich's `Progress(*columns, console=console, **options)` where `console` is a terminal (or a notebook);
    elsewhere a `PlainProgress` on the same console, the same calls. `unit` names what is counted in the plain
    lines ("steps"). `disable` silences either."""
    if console.is_terminal or console.is_jupyter:
        return Progress(*columns, console=console, disable=disable, **options)
    quiet_library_bars()
    return PlainProgress(console, unit=unit, disable=disable)


def bar(console: Console, label: str, *, left: bool = False, status: bool = False, **options: Any) -> Progress:
    """The commands' bar (progress_display): the label, the bar, done/total and the time elapsed; with `left` the
    time left, with `status` the task's `status` field."""
    return progress_display(console, TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            *([TimeRemainingColumn()] if left else []),
                            *([TextColumn("{task.fields[status]}")] if status else []), **options)


def _step(done: float, total: float) -> float:
    """How many multiples of PLAIN_EVERY_PERCENT `done` of `total` is (in whole numbers: 9 of 30 is 3, not 2.99...)."""
    return (done * 100) // (total * PLAIN_EVERY_PERCENT)


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=max(0, int(seconds))))


class PlainProgress(Progress):
    """rich's Progress without its live display: a task's state is printed as one plain line, never cut, when the
    done count has moved and crossed a multiple of PLAIN_EVERY_PERCENT, or reached the total, or
    PLAIN_EVERY_SECONDS have passed since the task's last line (its first move is printed at once); `stop` prints
    the last state not printed yet. The task's description names it, its field `status` (if any) ends the line.
    The time left is the average time per unit since the task's first update, times the units left."""

    def __init__(self, console: Console, *, unit: str = "", disable: bool = False,
                 get_time: Optional[Callable[[], float]] = None):
        # rich draws nothing; the tasks and their times (from get_time: monotonic by default) are kept as usual
        super().__init__(console=console, disable=True, get_time=get_time)
        self.unit, self.silent = unit, disable
        self._printed: dict[TaskID, tuple[float, float]] = {}  # task -> (completed, time) of its last line
        self._first: dict[TaskID, tuple[float, float]] = {}  # task -> (completed, time) at its first update

    def update(self, task_id: TaskID, **changes: Any) -> None:
        super().update(task_id, **changes)
        task = self._task(task_id)
        now = self.get_time()
        self._first.setdefault(task_id, (task.completed, now))
        last_done, last_time = self._printed.get(task_id, (0.0, now))
        if task.completed == last_done:
            return
        crossed = bool(task.total) and _step(task.completed, task.total) != _step(last_done, task.total)
        complete = task.total is not None and task.completed >= task.total
        if task_id not in self._printed or crossed or complete or now - last_time >= PLAIN_EVERY_SECONDS:
            self._print(task_id, now)

    def stop(self) -> None:
        for task in self.tasks:  # a task that never moved (setup failed) prints nothing
            printed = self._printed.get(task.id)
            if printed is not None and task.completed != printed[0]:
                self._print(task.id, self.get_time())
        super().stop()

    def line(self, task_id: TaskID) -> str:
        """The plain line of a task as it stands."""
        task = self._task(task_id)
        done = _count(task.completed)
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"{task.description}: {done}{unit}" if task.total is None else
                 f"{task.description}: {done}/{_count(task.total)}{unit} ({task.percentage:.0f}%)"]
        if task.elapsed is not None:
            parts.append(f"{_clock(task.elapsed)} elapsed")
        left = self._left(task_id)
        if left is not None and task.total is not None and task.completed < task.total:
            parts.append(f"~{_clock(left)} left")
        status = str(task.fields.get("status") or "").strip()
        if status:
            parts.append(status)
        return ", ".join(parts)

    def _left(self, task_id: TaskID) -> Optional[float]:
        task = self._task(task_id)
        if task.total is None or task_id not in self._first:
            return None
        first_done, first_time = self._first[task_id]
        if task.completed <= first_done:
            return None
        per_unit = (self.get_time() - first_time) / (task.completed - first_done)
        return per_unit * (task.total - task.completed)

    def _print(self, task_id: TaskID, now: float) -> None:
        self._printed[task_id] = (self._task(task_id).completed, now)
        if not self.silent:
            self.console.print(self.line(task_id), markup=False, highlight=False, soft_wrap=True)

    def _task(self, task_id: TaskID):
        return next(task for task in self.tasks if task.id == task_id)
