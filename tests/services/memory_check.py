"""Measured peak memory of one optimizer step on the CPU against rlvrlab.config.memory's estimate.

    python tests/services/memory_check.py OUT.json [override ...]

Composes the run config from the overrides (default experiment), with trainer.mini_batches set so that one
mini-batch is one micro-batch (trainer.micro_batch_size rows): every backward is then an optimizer step, which is
what the estimate sizes (gradients and AdamW states present while one micro-batch's activations are alive; more
micro-batches per mini-batch accumulate into the same gradients). It builds the model and the update engine as
training does (rlvrlab.components), copies the weights out of the memory-mapped safetensors file into anonymous
memory (as they are on a GPU; left mapped, the first step would page them in and copy-on-write them, and the
measure would count the weights it is not about), and fills one micro-batch of full-length rows
(rollout.max_prompt_tokens + rollout.max_new_tokens). A first step creates the optimizer's states; the check fails
if it did not change the weights (an optimizer that did not step would leave its states out of the measure). The
resident-set high-water mark is then reset (Linux: "5" into /proc/self/clear_refs) and a second forward, backward
and optimizer step runs through rlvrlab.train.logprobs.logp_and_entropy.

measured = peak RSS of the second step - RSS before the first - the file-backed pages (RssFile) that appeared in
between: what the update adds in anonymous memory on top of the weights (gradients, AdamW states, activations,
logits); the first step pages in parts of libtorch's and DeepSpeed's libraries (13-27 MB by install), which are
not what the estimate sizes. estimate = the same parts of memory.update_parts (gradients, AdamW states, buffers,
activations, logits and what the logged entropy adds to them), with the model's own config.json.
Run in a fresh process with MALLOC_MMAP_THRESHOLD_ fixed (glibc then returns every large freed block at once
instead of keeping it in the heap): nothing else may allocate while it measures. The model folder is therefore
built (a tiny model's warm start, into a cold cache) by a child process first: built here, its freed training
memory would be reused by the measured step and the measure would come out low.
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


def one_micro_batch_per_step(overrides: list[str]) -> list[str]:
    """The overrides plus trainer.mini_batches such that a mini-batch is one micro-batch (no accumulation)."""
    from rlvrlab.config import compose, memory

    cfg = compose(None, overrides)
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    return [*overrides, f"trainer.mini_batches={rows // memory.micro_batch_rows(cfg, 1)}"]


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
    from rlvrlab.train.batch import RolloutBatch
    from rlvrlab.train.logprobs import logp_and_entropy

    torch.set_num_threads(1)
    cfg = compose(None, one_micro_batch_per_step(overrides))
    folder = components.model_folder(cfg, load_split(cfg.dataset, cfg.model))
    arch = memory.Architecture.from_hf(json.loads((folder / "config.json").read_text()))
    model = components.load_model(folder, torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():  # tied weights are one Parameter: they stay tied
            parameter.data = parameter.data.clone()
    update = components.update_engine(cfg, model, 1)
    rows, p, t = memory.micro_batch_rows(cfg, 1), cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, arch.vocab, (rows, p + t), generator=generator)
    batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids), mask=torch.ones(rows, t), prompt_width=p,
                         group_ids=["g"] * rows, rewards=torch.zeros(rows), engine_logp=torch.zeros(rows, t),
                         texts=[""] * rows, version=0, batch_index=0,
                         scores=torch.zeros(rows), truncated=torch.zeros(rows, dtype=torch.bool))
    def one_step() -> None:
        logp, _ = logp_and_entropy(update.module, batch, temperature=cfg.rollout.temperature)
        update.backward(-(logp.sum() / batch.mask.sum()), last=True)
        update.step()

    gc.collect()
    start, start_file = _rss_kib("VmRSS"), _rss_kib("RssFile")
    probe = next(model.parameters()).detach().clone()
    one_step()  # the first step creates AdamW's states (and whatever else the engine keeps between steps)
    if torch.equal(probe, next(update.module.parameters()).detach()):
        raise SystemExit("the first step did not change the weights: the optimizer did not step, so its states "
                         "would be left out of the measure")
    gc.collect()
    before = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    one_step()  # a step in the steady state: its peak is the run's
    peak = _rss_kib("VmHWM")
    paged_in = _rss_kib("RssFile") - start_file  # library pages the first step paged in (file-backed, not tensors)
    parts = memory.update_parts(cfg, arch, 1)
    expected = {k: parts[k] for k in ("gradients", "optimizer", "buffers", "activations", "logits", "entropy")}
    kept = (before - start) * 1024  # what stays between steps
    Path(out).write_text(json.dumps({"measured": (peak - start - paged_in) * 1024, "kept": kept,
                                     "file_backed_paged_in": paged_in * 1024,
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
