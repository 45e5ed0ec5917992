"""The synthetic task registry (rlvrlab.data.tasks.TASKS): every task's own targets pass its own verifier, the
config rules read the registry, and the tiny tier trains every task or refuses in one line.

Run: .venv/bin/pytest -q -p no:cacheprovider tests/data/test_tasks.py
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvrlab.config import compose, experiments_dir
from rlvrlab.config.schema import DatasetConfig, ModelConfig
from rlvrlab.data import DATA_SEED, load_problems, tasks as registry, warm_start_targets
from rlvrlab.data.problems import Task
from rlvrlab.data.tasks import TASKS
from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.rewards import VERIFIERS


def test_a_file_dataset_on_the_default_tiny_tier_is_one_line(tmp_path: Path) -> None:
    """The default experiment's tiny tier warm-starts on a registered task's targets; a file has none. (It crashed
    with a traceback, ValueError: malformed countdown answer '2', when warm-start targets were looked up by
    dataset.verifier.)"""
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{n}+{n}", "answer": str(2 * n)}) + "\n" for n in range(4)))
    result = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "train", "dataset.format=jsonl",
                             f"dataset.path={data}", "dataset.name=mine", "tracking.backend=none", "steps=1",
                             f"output_dir={tmp_path / 'out'}"], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "RLVRLAB_CACHE": str(tmp_path / "cache")})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    assert "model.tier=tiny" in lines[0] and "dataset=countdown" in lines[0] and "model.tier=real" in lines[0]


# --- every registered task ----------------------------------------------------------------------------------

TASK_LEVELS = [pytest.param(task, level, id=f"{name}-{level}") for name, task in TASKS.items()
               for level in (sorted(task.levels) or [1])]


def _overrides(task: Task) -> list[str]:
    return [f"dataset={task.name}", *(["model=toy"] if task.toy else [])]


@pytest.mark.parametrize("task", TASKS.values(), ids=list(TASKS))
def test_every_task_has_its_yaml_a_verifier_and_a_default_level(task: Task) -> None:
    """experiments/datasets/<name>.yaml selects the task with its own verifier, and composes."""
    assert task.verifier in VERIFIERS
    assert not task.levels or 1 in task.levels  # dataset.level defaults to 1
    assert (experiments_dir() / "datasets" / f"{task.name}.yaml").is_file()
    dataset = compose(None, _overrides(task)).dataset
    assert (dataset.name, dataset.format, dataset.verifier) == (task.name, "synthetic", task.verifier)


@pytest.mark.parametrize(("task", "level"), TASK_LEVELS)
def test_every_tasks_own_verifier_scores_its_solutions_and_warm_start_targets(task: Task, level: int) -> None:
    """Every problem has a solution, each solution (and each listed answer) scores 1.0 with the task's verifier, and
    the warm-start targets score 1.0 except the wrong answers a task mixes in on purpose (pairs), which still parse:
    the generator, the verifier and the warm start agree on the answer's encoding."""
    check = VERIFIERS[task.verifier].check
    dataset = DatasetConfig(name=task.name, verifier=task.verifier, num_problems=24, level=level)
    problems = task.problems(dataset, ModelConfig(), DATA_SEED)
    assert len(problems) == 24 and len({p.id for p in problems}) == 24
    for problem in problems:
        solutions = list(task.solutions(problem))
        assert solutions and all(check(s, problem.answer).score == 1.0 for s in solutions), problem
        if task.answer_space is not None:
            listed = task.answer_space(problem)
            assert set(solutions) <= set(listed) and all(check(a, problem.answer).score == 1.0 for a in listed)
        if task.warm_start is None:
            continue
        verdicts = [check(target, problem.answer) for target in task.warm_start(problem)]
        assert any(v.score == 1.0 for v in verdicts), problem
        assert all(v.reason in ("correct", "wrong") for v in verdicts), problem
        if task.warm_start is task.solutions:
            assert all(v.score == 1.0 for v in verdicts), problem


@pytest.mark.parametrize(("task", "level"), TASK_LEVELS)
def test_the_config_rules_read_the_registry(task: Task, level: int) -> None:
    cfg = compose(None, [*_overrides(task), *([f"dataset.level={level}"] if task.levels else [])])
    assert cfg.dataset.level == level
    with pytest.raises(RlvrlabError, match=f"cannot grade the {task.name} task"):
        compose(None, [*_overrides(task), f"dataset.verifier={next(v for v in VERIFIERS if v != task.verifier)}"])
    if task.levels:
        with pytest.raises(RlvrlabError, match=f"dataset.level=9 is not a level of the {task.name} task; use one of 1"):
            compose(None, [*_overrides(task), "dataset.level=9"])
    else:
        with pytest.raises(RlvrlabError, match="dataset.level has no effect"):
            compose(None, [*_overrides(task), "dataset.level=2"])
    with pytest.raises(RlvrlabError, match="the toy policy answers only the toy dataset"):
        compose(None, [f"dataset={task.name}", "model=tiny" if task.toy else "model=toy"])


BARE_PROMPTS = ["dataset.template=null", "dataset.use_chat_template=false", "dataset.system_prompt=null",
                "dataset.fewshot=[]"]


def test_the_tiny_tier_refuses_formatted_prompts_naming_the_overrides_that_make_them_bare() -> None:
    """The warm start fine-tunes on bare prompts; arith's YAML formats them for a chat model."""
    with pytest.raises(ConfigError) as caught:
        warm_start_targets(compose(None, ["dataset=arith"]).dataset)
    assert str(caught.value).endswith("formats them (dataset.use_chat_template, dataset.system_prompt, "
                                      "dataset.fewshot); add dataset.use_chat_template=false dataset.system_prompt="
                                      "null dataset.fewshot=[] to train the tiny tier on it, or use a pretrained "
                                      "model (model.tier=real model.path=...)")
    assert warm_start_targets(compose(None, ["dataset=arith", *BARE_PROMPTS]).dataset) is TASKS["arith"].warm_start
    with pytest.raises(ConfigError, match=r"formats them \(dataset.template\); add dataset.template=null "):
        warm_start_targets(compose(None, ["dataset.template=Q: {prompt}"]).dataset)


def test_a_task_without_warm_start_targets_on_the_tiny_tier_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.TASKS, "countdown", dataclasses.replace(TASKS["countdown"], warm_start=None))
    with pytest.raises(ConfigError) as caught:
        warm_start_targets(compose(None, []).dataset)
    message = str(caught.value)
    assert "\n" not in message and "task countdown has none (its Task has warm_start=None)" in message
    others = " or ".join(f"dataset={name}" for name, task in TASKS.items() if task.warm_start is not None)
    assert "dataset=countdown" not in others and f"{others}, or a pretrained model (model.tier=real" in message


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS.values(), ids=list(TASKS))
def test_the_tiny_tier_trains_every_task(task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two steps of every registered task on the tiny tier (the toy task on its own tier), from its YAML with bare
    prompts: the warm start on the task's targets, its prompts, its verifier. A small model and a short warm start
    keep it cheap; the cache is this test's own, so the model is built here."""
    from rlvrlab.train.loop import train

    monkeypatch.setenv("RLVRLAB_CACHE", str(tmp_path / "cache"))
    small = [] if task.toy else ["model.tiny_layers=1", "model.tiny_hidden=32", "model.tiny_heads=2",
                                 "model.warmstart_steps=4", *BARE_PROMPTS]
    cfg = compose(None, [*_overrides(task), *small, "dataset.num_problems=16", "rollout.prompts_per_step=2",
                         "rollout.group_size=4", "rollout.max_new_tokens=8", "trainer.engine=torch", "steps=2",
                         "trainer.checkpoint_every=0", "tracking.backend=none", f"output_dir={tmp_path / 'runs'}"])
    steps: list[int] = []
    train(cfg, on_step=lambda step, *_: steps.append(step))
    assert steps == [0, 1]
    if not task.toy:  # built here, warm-started on this task's training problems
        [info] = [json.loads(f.read_text()) for f in (tmp_path / "cache" / "tiny").glob("*/rlvrlab_tiny.json")]
        assert (info["warmstart_steps"], info["num_problems"]) == (4, len(load_problems(cfg.dataset, cfg.model)[0]))
