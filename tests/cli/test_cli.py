"""The `rlvrlab` command, run as a real process.  Run: .venv/bin/pytest -q tests/cli/test_cli.py"""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def _bad_overrides() -> list:
    """tests/config/test_config.py's BAD_OVERRIDES: the same bad inputs, now through the real command."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "config" / "test_config.py"
    spec = importlib.util.spec_from_file_location("rlvrlab_tests_config_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BAD_OVERRIDES


BAD_OVERRIDES = _bad_overrides()


WriteTree = Callable[[Path, dict[str, str]], Path]  # the conftest fixture


def rlvrlab(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # COLUMNS=40: an error line must stay one line even in a narrow terminal
    environment = {**os.environ, "COLUMNS": "40", **env}
    command = [sys.executable, "-m", "rlvrlab.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=60)


def test_console_script_help_lists_the_config_commands() -> None:
    script = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))
    assert script, "install the package: .venv/bin/pip install -e . --no-deps"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "config" in result.stdout


def test_config_show_prints_yaml_then_the_hash(experiments: Path) -> None:
    result = rlvrlab("config", "show", "algorithm=ucpo", "algorithm.tau=0.3", "seed=3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  tau: 0.3" in lines and "seed: 3" in lines
    assert lines[-1].startswith("# config hash (without seed): ") and len(lines[-1].split()[-1]) == 12


def test_config_show_takes_an_experiment_path_before_the_overrides(experiments: Path) -> None:
    result = rlvrlab("config", "show", str(experiments / "default.yaml"), "model=toy", "dataset=toy")
    assert result.returncode == 0, result.stderr
    assert "  tier: toy" in result.stdout.splitlines()


def test_config_show_up_dapo_turns_on_unbounded_positive() -> None:
    result = rlvrlab("config", "show", "algorithm=up_dapo")
    assert result.returncode == 0, result.stderr
    assert "  unbounded_positive: true" in result.stdout.splitlines()


def test_config_validate_passes_on_the_shipped_files() -> None:
    result = rlvrlab("config", "validate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "default.yaml" in result.stdout and "failed" not in result.stdout


def test_config_validate_fails_with_each_broken_files_reason(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(experiments, {"algorithms/typo.yaml": "tua: 0.3\n"})
    result = rlvrlab("config", "validate")
    assert result.returncode == 1
    assert "algorithms/typo.yaml: unknown key 'algorithm.tua'" in result.stdout


@pytest.mark.parametrize(
    "overrides",
    [overrides for overrides, _ in BAD_OVERRIDES] + [["nosuchexperiment"]],
    ids=[" ".join(overrides) for overrides, _ in BAD_OVERRIDES] + ["nosuchexperiment"],
)
def test_a_user_error_is_one_red_line_without_traceback(experiments: Path, overrides: list[str]) -> None:
    result = rlvrlab("config", "show", *overrides)
    assert result.returncode == 1
    output = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(output) == 1 and output[0].startswith("error: "), output
    assert "Traceback" not in result.stderr


def test_rlvrlab_debug_shows_the_traceback(experiments: Path) -> None:
    result = rlvrlab("config", "show", "algorithm.tua=0.3", RLVRLAB_DEBUG="1")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "ConfigError: unknown key 'algorithm.tua'" in result.stderr


def test_usage_errors_keep_exit_code_2() -> None:
    assert rlvrlab("config", "show", "--no-such-option").returncode == 2
