"""`rlvrlab model import` never deletes what it did not write (issue 39): the target must be new, empty or an earlier
import; an earlier import is replaced only with --force and only when it holds nothing but its own files. The
success path runs on a tiny llama GGUF written here with the `gguf` package (2 layers, hidden 16, a byte-level BPE
with a ChatML template), which transformers' GGUF loader reads like any other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.policy.gguf_import import MARKER, import_model


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})


def _one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tiny_gguf(path: Path) -> Path:
    """A 2-layer llama (hidden 16, 2 heads) with a 261-token GPT-2-style byte-level BPE and a ChatML chat template;
    float32 weights drawn from a fixed seed."""
    import gguf

    # GPT-2's byte -> character map (its bytes_to_unicode): printable bytes stand for themselves, the rest for 256+
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    extra = iter(range(256, 512))
    merges = ["Ġ t", "Ġ a"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    tokens += [m.replace(" ", "") for m in merges] + specials
    vocab, hidden, layers, heads, ffn = len(tokens), 16, 2, 2, 32
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - len(specials)) + [3] * len(specials))  # normal, then control tokens
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, hidden), "output.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        shapes |= {f"blk.{i}.{name}.weight": (hidden, hidden) for name in ("attn_q", "attn_k", "attn_v", "attn_output")}
        shapes |= {f"blk.{i}.ffn_gate.weight": (ffn, hidden), f"blk.{i}.ffn_up.weight": (ffn, hidden),
                   f"blk.{i}.ffn_down.weight": (hidden, ffn), f"blk.{i}.attn_norm.weight": (hidden,),
                   f"blk.{i}.ffn_norm.weight": (hidden,)}
    for name, shape in shapes.items():
        weights = np.ones(shape) if len(shape) == 1 else rng.standard_normal(shape) * 0.1
        writer.add_tensor(name, weights.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_import_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    """`--out ..` from a subfolder (which held the current directory) and a folder of the user's own files are
    refused in one line before the GGUF is even read, with --force too; nothing is deleted or added."""
    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"not read: the target is refused first")
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "notes.txt").write_text("mine\n")
    before = _tree(tmp_path)
    _one_line_error(_cli("model", "import", str(gguf_file), "--out", "..", cwd=project / "sub"),
                    "--out ..", "no rlvrlab_import.json", "never deletes what it did not write")
    with pytest.raises(RlvrlabError, match="no rlvrlab_import.json, so not a model rlvrlab imported"):
        import_model(str(gguf_file), project, dtype="float32", downloads=tmp_path / "downloads", stage=print,
                     force=True)
    assert _tree(tmp_path) == before and sorted(p.name for p in project.iterdir()) == ["notes.txt", "sub"]


@pytest.mark.slow  # three conversions of a tiny model (transformers' GGUF loader, save_pretrained)
def test_an_earlier_import_is_replaced_only_with_force_and_only_its_own_files(tmp_path: Path) -> None:
    source = tiny_gguf(tmp_path / "tiny.gguf")
    out, stages = tmp_path / "models" / "tiny", []

    def run(dtype: str, force: bool = False) -> tuple[Path, bool]:
        return import_model(str(source), out, dtype=dtype, downloads=tmp_path / "downloads", stage=stages.append,
                            force=force)

    assert run("float32") == (out, True)
    record = json.loads((out / MARKER).read_text())
    assert record["dtype"] == "float32" and record["logit_gap_vs_gguf"] < 1e-3
    assert sorted(record["files"]) == sorted(p.name for p in out.iterdir() if p.name != MARKER)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(record["files"])
    assert run("float32") == (out, False)  # the same file and dtype: found, nothing done
    first = _tree(out)

    with pytest.raises(RlvrlabError, match="holds an earlier import of .*tiny.gguf \\(float32\\); add --force"):
        run("bfloat16")
    assert _tree(out) == first
    assert run("bfloat16", force=True) == (out, True)
    assert json.loads((out / MARKER).read_text())["dtype"] == "bfloat16" and _tree(out) != first
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]  # no partial or replaced folder left beside it

    (out / "my_notes.md").write_text("mine\n")
    replaced = _tree(out)
    with pytest.raises(RlvrlabError, match="holds my_notes.md, which the earlier import did not write"):
        run("float32", force=True)
    assert _tree(out) == replaced and sorted(p.name for p in out.parent.iterdir()) == ["tiny"]

