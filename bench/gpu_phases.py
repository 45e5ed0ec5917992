"""Training steps with the GPU memory of each phase measured on every rank, next to rlvrlab.config.memory's estimate.

    torchrun --nproc_per_node N bench/gpu_phases.py [override ...]     # bench/gpu_smoke.sh runs it

Builds the run as `rlvrlab train` does (rlvrlab.train.setup.build: device and process group first, then the engines)
and runs cfg.steps steps of the loop's own train_step, logging the same metrics. The real engines are wrapped by
decorators that only mark phase boundaries:

    rollout  generate() (vLLM awake: its pool is device memory outside PyTorch's allocator)
    logp     from the engine's sleep() to the first backward (the trainer's separate log-prob pass)
    update   from the first backward to sync_weights()
    sync     sync_weights() (vLLM's weights woken, the trainer's weights copied in)

At each boundary the phase's peak is PyTorch's max_memory_reserved() since the last boundary plus the memory held
outside PyTorch (device used - PyTorch reserved, read at the boundary: vLLM's pool, CUDA context, NCCL). The
table per rank ends with the estimate's update and rollout phases. Needs CUDA; on CPU it exits with a message.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

GIB = 2**30


def main(overrides: list[str]) -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/gpu_phases.py measures GPU memory: no CUDA device here")
    from rlvrlab.config import compose, memory
    from rlvrlab.train.loop import TrainState, train_step
    from rlvrlab.train.metrics import step_metrics
    from rlvrlab.train.setup import build

    cfg = compose(None, overrides)
    run = build(cfg)
    peaks: dict[str, float] = defaultdict(float)
    current = {"phase": "setup"}

    def boundary(next_phase: str) -> None:
        free, total = torch.cuda.mem_get_info()
        outside = (total - free) - torch.cuda.memory_reserved()
        peak = torch.cuda.max_memory_reserved() + outside
        peaks[current["phase"]] = max(peaks[current["phase"]], peak)
        torch.cuda.reset_peak_memory_stats()
        current["phase"] = next_phase

    rollout, update = run.rollout, run.update
    generate, sleep, sync, backward = rollout.generate, rollout.sleep, rollout.sync_weights, update.backward

    def generate_marked(*args, **kwargs):
        boundary("rollout")
        out = generate(*args, **kwargs)
        boundary("after rollout")
        return out

    def sleep_marked(*args, **kwargs):
        sleep(*args, **kwargs)
        boundary("logp")

    def backward_marked(loss, *, last):
        if current["phase"] != "update":
            boundary("update")
        backward(loss, last=last)

    def sync_marked(weights):
        boundary("sync")
        sync(weights)
        boundary("idle")

    rollout.generate, rollout.sleep, rollout.sync_weights = generate_marked, sleep_marked, sync_marked
    update.backward = backward_marked

    state = TrainState()
    for step in range(cfg.steps):
        stats, _ = train_step(run, state, step)
        state.step = step + 1
        run.tracker.log_metrics(step, step_metrics(stats))
        print(f"rank {run.rank} step {step}: reward {stats.reward:.3f} response length {stats.response_length:.0f} "
              f"logp gap max {stats.logp_gap_max:.2e}", flush=True)
    run.tracker.finish("FINISHED")

    device = torch.cuda.get_device_properties(torch.cuda.current_device())
    arch = memory.architecture(cfg)
    estimate = memory.estimate(cfg, arch, world_size=run.world_size, device_bytes=device.total_memory) if arch \
        else None
    lines = [f"rank {run.rank} ({device.name}, {device.total_memory / GIB:.1f} GiB): peak memory per phase (GiB)"]
    for phase in ("rollout", "logp", "update", "sync"):
        lines.append(f"  {phase:<8} measured {peaks[phase] / GIB:7.2f}")
    if estimate is not None:
        lines.append(f"  estimate: update {estimate.update / GIB:.2f}, rollout {estimate.rollout / GIB:.2f} "
                     f"(rlvrlab config show --memory itemises it)")
        lines.append("  " + json.dumps({name: round(gib, 2) for name, gib in estimate.rows()}))
    print("\n".join(lines), flush=True)
    run.rollout.close()
    run.verifier.close()


if __name__ == "__main__":
    main(sys.argv[1:])
