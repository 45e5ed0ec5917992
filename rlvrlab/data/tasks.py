"""The synthetic task registry: every Task (rlvrlab.data.problems) by name, the one list of synthetic tasks.

The config rules read it (dataset.name, dataset.verifier, dataset.level, the toy tier), the data layer generates
problems through it, the tiny tier warm-starts on its targets and held-out evaluation lists its answer spaces; the
registry-wide tests (tests/data/test_tasks.py) check and train every entry. A new task is a module here that
defines TASK, one entry in the tuple below, and its experiments/datasets/<name>.yaml (docs/training.md).
"""

from __future__ import annotations

from rlvrlab.data import arith, countdown, pairs, toy
from rlvrlab.data.problems import DatasetSection, Task

TASKS: dict[str, Task] = {task.name: task for task in (toy.TASK, countdown.TASK, arith.TASK, pairs.TASK)}


def synthetic_task(dataset: DatasetSection) -> Task | None:
    """The registered task a synthetic dataset section names; None for a file's data or a name not registered
    (which the config rules refuse)."""
    return TASKS.get(dataset.name) if dataset.format == "synthetic" else None
