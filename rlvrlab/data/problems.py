"""The unit of data every task produces and every verifier reads (Problem), and a synthetic task as one registered
entry (Task; the registry is rlvrlab.data.tasks.TASKS).

The data layer sits below the configuration: it reads the config sections it is given through the structural
types DatasetSection and ModelSection (rlvrlab.config.schema's DatasetConfig and ModelConfig have these fields),
and the config rules read the task registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    """One prompt of a task.

    id:     stable identifier; the group id of the responses sampled for it.
    prompt: the question as text (before any template or chat template).
    answer: the reference the verifier checks a response against, in the task's own encoding
            (Countdown: "target=24;numbers=3,4,2,1"; toy: the correct response ids, "r0|r3").
    source: where the problem comes from, for per-source breakdowns: a verl file's data_source column, else the
            dataset's name (load_problems fills it in); "" when built outside load_problems.
    """

    id: str
    prompt: str
    answer: str
    source: str = ""


class DatasetSection(Protocol):
    """The fields of a dataset config section the data layer reads (rlvrlab.config.schema.DatasetConfig)."""

    name: str
    format: str
    path: str | None
    split: str
    prompt_field: str
    answer_field: str
    template: str | None
    use_chat_template: bool
    system_prompt: str | None
    fewshot: list[list[str]]
    verifier: str
    num_problems: int
    level: int
    eval_fraction: float
    expected_rows: int | None
    provide: str | None


class ModelSection(Protocol):
    """The fields of a model config section a task reads (rlvrlab.config.schema.ModelConfig): the toy task's
    problems are rows of the toy policy's table, so its candidate counts come from the model section."""

    toy_num_responses: int
    toy_num_correct: int


ProblemsFn = Callable[[DatasetSection, ModelSection, int], list[Problem]]  # (dataset, model, seed) -> problems
ResponsesFn = Callable[[Problem], Sequence[str]]  # problem -> response strings
AnswersFn = Callable[[Problem], list[str]]  # problem -> every correct response string


@dataclass(frozen=True)
class Task:
    """A synthetic task (``dataset.format=synthetic``, ``dataset.name=<name>``) and the traits the rest of rlvrlab
    reads off it. Registered once, in rlvrlab.data.tasks.TASKS; traits without a default are required keyword
    arguments, so a new task states them.

    problems:     (dataset, model, seed) -> dataset.num_problems problems, the same for the same seed (and level).
    verifier:     the rlvrlab.rewards.VERIFIERS name that grades its responses; dataset.verifier must name it
                  (config rule).
    solutions:    problem -> correct responses, at least one, each scored 1.0 by `verifier` (a registry-wide test
                  checks it on every task: the generator and the verifier agree on the answer's encoding).
    warm_start:   problem -> what the tiny tier's warm start fine-tunes on (rlvrlab.policy.tiny), sampled uniformly,
                  so repeats are weights: usually `solutions`; pairs gives a skewed mixture with wrong answers.
                  None: the tiny tier cannot train the task (a one-line ConfigError names the fix).
    levels:       dataset.level -> what that level asks, the default level 1 among them. Empty: the task has one
                  form and dataset.level is not read (config rules).
    answer_space: problem -> every response string `verifier` scores 1.0, for tasks whose correct set can be listed
                  in full; with it pass@1, q over the correct set and coverage are exact (rlvrlab.policy.exact).
    toy:          its problems are rows of the toy policy's table (rlvrlab.policy.toy): model.tier=toy trains this
                  task and no other (config rule), and every problem is trained (none is held out).
    """

    name: str
    problems: ProblemsFn
    _: KW_ONLY
    verifier: str
    solutions: ResponsesFn
    warm_start: ResponsesFn | None
    levels: Mapping[int, str] = field(default_factory=dict)
    answer_space: AnswersFn | None = None
    toy: bool = False
