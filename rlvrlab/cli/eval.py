"""`rlvrlab eval pass-at-k`: sample n responses per problem, verify them, report pass@k / maj@k / avg@n.

The pipeline is `rlvrlab.eval.pipeline`, the options are the fields of rlvrlab.eval.request.EvalRequest (the
signature below is built from them) and the printed tables come from rlvrlab.eval.view.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.progress import TaskID

from rlvrlab.cli.options import (
    AllowInitialModelChangeOpt,
    ProtocolOpt,
    print_table,
    request_values,
    say,
    with_request_options,
)
from rlvrlab.eval.request import EvalRequest

eval_app = typer.Typer(help="Evaluate a model or a training run's checkpoint on datasets.", no_args_is_help=True)


def pass_at_k(protocol: ProtocolOpt = None, allow_initial_model_change: AllowInitialModelChangeOpt = False,
              **given) -> None:
    """Unbiased pass@k, exact expected maj@k and avg@n of a model on datasets, recorded in MLflow.

    [dim]rlvrlab eval pass-at-k --run 3f2a... --dataset countdown --n 64 --k 1,4,16,64
    rlvrlab eval pass-at-k --model /models/Qwen2.5-Math-1.5B --dataset math500 --n 16 --k 1,4,16 \\
        --temperature 0.6 --top-p 0.95 --max-new-tokens 4096 --engine vllm
    rlvrlab eval pass-at-k --study tiny_algorithms --n 64 --k 1,4,16,64     # every seed run of a sweep[/dim]
    """
    from rlvrlab.eval import pipeline, view  # torch and transformers: not needed for --help
    from rlvrlab.tracking.testbed import optional

    testbed = optional(protocol, allow_initial_model_change)  # a bad protocol file: one line before anything runs
    request = EvalRequest(**request_values(EvalRequest, given), testbed=testbed)
    console, err = Console(soft_wrap=True), Console(stderr=True)
    with _progress_bar(err) as progress:
        done = []
        for outcome in pipeline.pass_at_k(request, progress=progress, announce=lambda i, of, run_id: err.print(
                f"[bold]run {i}/{of}[/]: {run_id}")):
            done.append(outcome)
            print_table(console, view.summary_table(outcome.summary, outcome.ks, outcome.n))
            say(console, view.done_lines(outcome))
    if not done:
        say(console, [view.NOTHING_LEFT])
    elif (over_seeds := view.seeds_table(done)) is not None:
        print_table(console, over_seeds)


eval_app.command("pass-at-k")(with_request_options(pass_at_k, EvalRequest))


@contextmanager
def _progress_bar(console: Console) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar per dataset, as a progress(label, done, total) callback."""
    from rlvrlab.cli.progress import bar as display  # rich's bar on a terminal, plain lines in a log file

    bar = display(console, "[bold]{task.description}", unit="problems",
                  disable=os.environ.get("RLVRLAB_NO_PROGRESS") == "1")
    tasks: dict[str, TaskID] = {}

    def update(label: str, done: int, total: int) -> None:
        if label not in tasks:
            tasks[label] = bar.add_task(label, total=total)
        bar.update(tasks[label], completed=done)

    with bar:
        yield update
