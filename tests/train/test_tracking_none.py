"""tracking.backend=none: a run that records nothing, in a process that never imports MLflow (a GPU node without it,
bench/device_check.sh)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlvrlab.config import compose
from rlvrlab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~6 s: a fresh process, three toy runs
def test_a_run_without_tracking_keeps_its_folder_and_never_imports_mlflow(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from rlvrlab.config import compose
        from rlvrlab.train.loop import NothingLeft, train
        from rlvrlab.train.setup import run_config
        run_id = train(compose("toy", ["tracking.backend=none", "steps=3", "trainer.checkpoint_every=1",
                                       "output_dir={tmp_path}"]))
        resumed = ["steps=5", "output_dir={tmp_path}"]  # as `rlvrlab train --resume RUN_ID steps=5` composes it
        run_id = train(run_config(None, resumed, resume=run_id), resume=run_id)
        try:  # every step is in the checkpoint: nothing left, and no MLflow status to ask for
            train(run_config(None, resumed, resume=run_id), resume=run_id)
        except NothingLeft:
            pass
        else:
            raise SystemExit("a resume of a run with every step in its checkpoint trained again")
        print(run_id, sorted(m for m in sys.modules if m.partition(".")[0] == "mlflow"))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_id, imported = result.stdout.split(maxsplit=1)
    assert imported.strip() == "[]"
    assert len(run_id) == 32 and (tmp_path / run_id / "config.yaml").is_file()
    assert "backend: none" in (tmp_path / run_id / "config.yaml").read_text()
    assert (tmp_path / run_id / "checkpoints").is_dir()
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()


def test_a_tracking_uri_without_mlflow_is_refused() -> None:
    with pytest.raises(ConfigError, match="tracking.uri"):
        compose("toy", ["tracking.backend=none", "tracking.uri=http://mlflow.example:5000"])
    with pytest.raises(ConfigError, match="tracking.backend"):
        compose("toy", ["tracking.backend=wandb"])


def test_a_sweep_refuses_runs_it_could_not_read(tmp_path: Path) -> None:
    from rlvrlab.sweep.spec import load_sweep

    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\nexperiment: toy\noverrides: [tracking.backend=none]\nseeds: 1\n"
                     "space:\n  algorithm.tau: [0.1, 0.2]\nsampler: grid\nobjective:\n  metric: train/reward\n")
    with pytest.raises(ConfigError, match="tracking.backend=none .* reads its objective from the seed runs' MLflow"):
        load_sweep(str(sweep))
