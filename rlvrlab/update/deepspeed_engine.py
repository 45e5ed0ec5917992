"""DeepSpeed as the update engine: ZeRO 0-2, AdamW, gradient clipping, fp32/bf16, CPU or GPU.

The optimizer is a plain torch AdamW handed to DeepSpeed: DeepSpeed's own fused/CPU Adam would compile an
extension first (~2 min on CPU, docs/platform.md). Losses arrive normalised by global token/sequence counts,
so `backward(scale_wrt_gas=False)`; DeepSpeed only averages gradients over data-parallel ranks, which the
aggregation undoes with dp_size.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch


class DeepSpeedEngine:
    def __init__(self, module: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                 grad_clip: float, zero_stage: int, bf16: bool, micro_batch_size: int,
                 accumulation_steps: int, world_size: int):
        from rlvrlab.update.dist import init_process_group

        init_process_group()
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": accumulation_steps,
            "train_batch_size": micro_batch_size * accumulation_steps * world_size,
            # clipping at a huge norm still measures it; 0 would switch the measurement off too
            "gradient_clipping": grad_clip if grad_clip > 0 else 1e30,
            "zero_optimization": {"stage": zero_stage},
            "bf16": {"enabled": bf16},  # bf16 compute, fp32 master weights in the optimizer
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
        self.engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
        if world_size == 1 and zero_stage == 0:  # averaging over one rank: a copy to a flat buffer and back, per step
            self.engine.enable_backward_allreduce = False
        self.module = self.engine.module
        self._norm = float("nan")

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)
        if self.engine.is_gradient_accumulation_boundary():
            # ZeRO-0 in fp32 clips without keeping the norm; its gradients are whole here, so measure them
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]  # empty under ZeRO-1/2
            if grads:
                self._norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        self.engine.step()  # DeepSpeed steps the optimizer itself at the accumulation boundary

    def step(self) -> float:
        """The optimizer step already happened in the last backward; report the gradient norm it used."""
        norm = self.engine.get_global_grad_norm()  # ZeRO-1/2 and bf16 keep it
        return float(norm) if norm is not None else self._norm

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self.module.state_dict().items()  # ZeRO 0-2 keep full fp32 weights on every rank

    def save(self, folder: Path) -> None:
        self.engine.save_checkpoint(str(folder / "deepspeed"), tag="latest", save_latest=False)

    def load(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder / "deepspeed"), tag="latest")
        if path is None:
            raise FileNotFoundError(folder / "deepspeed")
