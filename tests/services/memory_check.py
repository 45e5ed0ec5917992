"""Measured peak memory of one update micro-batch on the CPU against rlvrlab.config.memory's estimate.

    python tests/services/memory_check.py OUT.json [override ...]

Composes the run config from the overrides (default experiment), builds the model and the update engine as
training does (rlvrlab.components), and fills one micro-batch of full-length rows (rollout.max_prompt_tokens +
rollout.max_new_tokens). The process's resident-set high-water mark is reset (Linux: "5" into
/proc/self/clear_refs) after a first step (which creates the optimizer's states), then a second forward, backward and
optimizer step runs through rlvrlab.train.batch.logp_and_entropy. measured = peak RSS of the second step - RSS
before the first: what the update adds on top of the weights in the steady state (gradients, AdamW states,
activations, logits). estimate = the same parts of memory.update_parts, with the model's own config.json. Run in
a fresh process with MALLOC_MMAP_THRESHOLD_ fixed (glibc then returns every large freed block at once instead of
keeping it in the heap): nothing else may allocate while it measures. The tiny model is therefore built (warm start,
into a cold cache) by a child process first: built here, its freed training memory would be reused by the measured
step and the measure would come out low.
"""

import json
import os
import sys
from pathlib import Path


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def build(overrides: list[str]) -> None:
    """The model folder the measure will load, built and cached (nothing is measured in this process)."""
    from rlvrlab import components
    from rlvrlab.config import compose
    from rlvrlab.data import load_split

    cfg = compose(None, overrides)
    components.model_folder(cfg, load_split(cfg.dataset, cfg.model))


def main(out: str, overrides: list[str]) -> None:
    import gc

    import torch

    from rlvrlab import components
    from rlvrlab.config import compose, memory
    from rlvrlab.data import load_split
    from rlvrlab.train.batch import RolloutBatch, logp_and_entropy

    torch.set_num_threads(1)
    cfg = compose(None, overrides)
    folder = components.model_folder(cfg, load_split(cfg.dataset, cfg.model))
    arch = memory.Architecture.from_hf(json.loads((folder / "config.json").read_text()))
    model = components.load_model(folder, torch.float32)
    update = components.update_engine(cfg, model, 1)
    rows, p, t = memory.micro_batch_rows(cfg, 1), cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, arch.vocab, (rows, p + t), generator=generator)
    batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids), mask=torch.ones(rows, t), prompt_width=p,
                         group_ids=["g"] * rows, rewards=torch.zeros(rows), engine_logp=torch.zeros(rows, t),
                         texts=[""] * rows, version=0, batch_index=0)
    def one_step() -> None:
        logp, _ = logp_and_entropy(update.module, batch, temperature=cfg.rollout.temperature)
        update.backward(-(logp.sum() / batch.mask.sum()))
        update.step()

    gc.collect()
    start = _rss_kib("VmRSS")
    one_step()  # the first step creates AdamW's states (and whatever else the engine keeps between steps)
    gc.collect()
    before = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    one_step()  # a step in the steady state: its peak is the run's
    peak = _rss_kib("VmHWM")
    parts = memory.update_parts(cfg, arch, 1)
    expected = {k: parts[k] for k in ("gradients", "optimizer", "buffers", "activations", "logits")}
    kept = (before - start) * 1024  # what stays between steps
    Path(out).write_text(json.dumps({"measured": (peak - start) * 1024, "kept": kept,
                                     "estimate": sum(expected.values()),
                                     "parts": expected, "params": arch.params, "rows": rows, "tokens": p + t}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.argv[1] == "--build":
        build(sys.argv[2:])
        sys.exit(0)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # read by glibc at start: build, then run again with it set
        import subprocess

        subprocess.run([sys.executable, __file__, "--build", *sys.argv[2:]], check=True)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})
    main(sys.argv[1], sys.argv[2:])
