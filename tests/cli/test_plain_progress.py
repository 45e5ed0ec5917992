"""Progress without a terminal: whole plain lines at a modest rate, never rich's cut columns (`200/2… 0:00…`), and
no tqdm bars from transformers in the output."""

import io
import re
import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

from rlvrlab.cli import progress as plain
from rlvrlab.cli.progress import PlainProgress, progress_display

LINE = re.compile(r"^train \S+ \S+/\S+ seed \d+: (\d+)/(\d+) steps \((\d+)%\), \d+:\d\d:\d\d elapsed"
                  r"(, ~\d+:\d\d:\d\d left)?(, reward -?\d+\.\d{3} entropy \d+\.\d{3})?$")


def test_a_file_gets_plain_lines_every_tenth_and_a_terminal_gets_the_bar(library_bars):
    out = io.StringIO()
    console = Console(file=out, width=40)  # narrow, and not a terminal
    bar = progress_display(console, unit="steps")
    assert isinstance(bar, PlainProgress)
    task = bar.add_task("train grpo toy/toy seed 0", total=200, status="")
    bar.start()
    for step in range(200):
        bar.update(task, completed=step + 1, status=f"reward {step / 200:.3f} entropy 1.000")
    bar.stop()
    lines = out.getvalue().splitlines()
    # the first move, then each 10% (20, 40, ..., 200): not one line per step
    assert [int(LINE.match(line).group(1)) for line in lines] == [1, *range(20, 201, 20)], lines  # type: ignore
    assert "…" not in out.getvalue() and all(len(line) > 40 for line in lines)  # never cut to the console width
    assert lines[5].startswith("train grpo toy/toy seed 0: 100/200 steps (50%), 0:00:00 elapsed, ~0:00:00 left, ")
    assert not isinstance(progress_display(Console(file=io.StringIO(), force_terminal=True)), PlainProgress)


def test_a_long_quiet_stretch_prints_a_line_and_stop_prints_the_last_state():
    out, now = io.StringIO(), [0.0]
    bar = PlainProgress(Console(file=out), unit="problems", get_time=lambda: now[0])
    task = bar.add_task("math500", total=1000)
    for seconds, done in [(0, 1), (1, 2), (1 + plain.PLAIN_EVERY_SECONDS, 3), (32, 4)]:
        now[0] = seconds
        bar.update(task, completed=done)  # printed: the first move, and the one 30 s after the last line
    bar.stop()  # and the last state
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[1].split()[0] for line in lines] == ["1/1000", "3/1000", "4/1000"], lines
    # 3 problems in 32 s since the first: ~10.7 s each, 996 left
    assert lines[-1] == "math500: 4/1000 problems (0%), 0:00:32 elapsed, ~2:57:04 left"


def test_an_unknown_total_and_a_task_that_never_moved(library_bars):
    out = io.StringIO()
    bar = progress_display(Console(file=out))
    task = bar.add_task("sweep", total=None, status="")
    idle = bar.add_task("idle", total=5)
    bar.update(task, completed=0, status="2 workers")  # nothing done yet: nothing printed
    bar.update(task, completed=3, status="2 workers")
    bar.update(idle, completed=0)
    bar.stop()
    assert out.getvalue().splitlines() == ["sweep: 3, 0:00:00 elapsed, 2 workers"]


@pytest.fixture
def library_bars(monkeypatch):
    """A plain display turns library bars off for its process: undone after the test."""
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    yield
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.enable_progress_bar()


def test_train_without_a_terminal_prints_readable_progress_lines(tmp_path, library_bars):
    """`rlvrlab train` through typer's CliRunner (stderr is not a terminal): plain lines, whole, and the last one at
    the total; the run's experiment is marked as model training and the closing hint opens it in MLflow's Model
    training view."""
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from rlvrlab.cli.main import app

    result = CliRunner().invoke(app, ["train", "toy", "steps=20", f"output_dir={tmp_path}"])
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert lines and all(LINE.match(line) for line in lines), result.stderr
    assert "…" not in result.stderr and "━" not in result.stderr
    assert LINE.match(lines[-1]).groups()[:3] == ("20", "20", "100")  # type: ignore[union-attr]
    assert 2 <= len(lines) <= 12  # the first move, every 10%: not one per step
    assert re.search(r"then open http://127\.0\.0\.1:5000/#/experiments/\d+/runs\?workflowType=machine_learning",
                     result.stdout), result.stdout
    experiment = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_experiment_by_name("toy")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_no_transformers_bars_once_a_plain_display_is_made(tmp_path):
    """transformers draws a "Loading weights" tqdm bar on stderr for each from_pretrained (a sweep: one per seed
    run); a plain display turns those off in its process and, through HF_HUB_DISABLE_PROGRESS_BARS, in the
    processes it starts. The control load before it shows the bar, so the check can fail."""
    script = textwrap.dedent(f"""
        import io, os, subprocess, sys
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        from rich.console import Console
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging
        path = {str(tmp_path / "model")!r}
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=16, n_positions=8)).save_pretrained(path)
        GPT2LMHeadModel.from_pretrained(path)
        sys.stderr.write("@@ plain display\\n"); sys.stderr.flush()
        from rlvrlab.cli.progress import progress_display
        progress_display(Console(file=io.StringIO()))
        assert not logging.is_progress_bar_enabled()
        GPT2LMHeadModel.from_pretrained(path)
        sys.stderr.write("@@ child\\n"); sys.stderr.flush()
        subprocess.run([sys.executable, "-c", "from transformers import GPT2LMHeadModel; "
                        "GPT2LMHeadModel.from_pretrained({str(tmp_path / "model")!r})"], check=True)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = result.stderr.split("@@ plain display")
    assert "Loading weights" in before
    assert "Loading weights" not in after, after
