"""DeepSpeed as the update engine: ZeRO 0-3, AdamW (optionally offloaded), gradient clipping, fp32/bf16 (with fp32
gradient accumulation as an option at ZeRO 1-3: DeepSpeed 0.19.8 has none at ZeRO-0), CPU or GPU. Under bf16 it
casts the module's parameters to bf16 and builds fp32 master weights from them.

The optimizer is a plain torch AdamW handed to DeepSpeed: DeepSpeed's own fused/CPU Adam would compile an
extension first (~2 min on CPU, docs/platform.md). Losses arrive normalised by global token/sequence counts,
so `backward(scale_wrt_gas=False)`; DeepSpeed only averages gradients over data-parallel ranks, which the
aggregation undoes with dp_size. Under ZeRO-3 each rank holds a shard of every weight: `weights()` gathers them
one parameter at a time (deepspeed.zero.GatheredParameters) for the rollout engine's sync, as verl and TRL do.
With offload_optimizer the plain torch AdamW steps on the CPU copies (zero_force_ds_cpu_optimizer off: DeepSpeed's
CPUAdam would be faster but compiles an extension first).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from rlvrlab.update.base import total_norm
from rlvrlab.update.dist import all_sum


class DeepSpeedEngine:
    def __init__(self, module: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                 grad_clip: float, zero_stage: int, bf16: bool, micro_batch_size: int,
                 accumulation_steps: int, world_size: int, offload_optimizer: bool = False,
                 grad_accum_fp32: bool = False, bucket_elements: int | None = None):
        from rlvrlab.update.dist import init_process_group

        init_process_group()
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": accumulation_steps,
            "train_batch_size": micro_batch_size * accumulation_steps * world_size,
            # clipping at a huge norm still measures it; 0 would switch the measurement off too
            "gradient_clipping": grad_clip if grad_clip > 0 else 1e30,
            "zero_optimization": self.zero_config(zero_stage, offload_optimizer, bucket_elements),
            "bf16": {"enabled": bf16},  # bf16 compute, fp32 master weights in the optimizer
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        if grad_accum_fp32:
            config["data_types"] = {"grad_accum_dtype": "fp32"}
        if offload_optimizer:
            config["zero_force_ds_cpu_optimizer"] = False
        optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
        # ZeRO-3 replaces torch.nn.functional.linear process-wide by its memory-efficient version ("This will persist
        # unless manually reset"): kept for this run, put back by close(), so that a later run in the same process
        # (a sweep worker, a notebook, the test suite) computes its linear layers as before
        self._linear = torch.nn.functional.linear
        self.engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
        if world_size == 1 and zero_stage == 0:  # averaging over one rank: a copy to a flat buffer and back, per step
            self.engine.enable_backward_allreduce = False
        self.module = self.engine.module
        self.zero_stage = zero_stage
        self._norm = float("nan")
        self._stepped = False  # the last backward ended an accumulation, so DeepSpeed stepped the optimizer

    @staticmethod
    def zero_config(stage: int, offload_optimizer: bool, bucket_elements: int | None) -> dict:
        """DeepSpeed's zero_optimization section (bucket sizes explicit: the memory estimate counts them)."""
        zero: dict = {"stage": stage}
        if bucket_elements is not None and stage in (1, 2):
            zero.update(reduce_bucket_size=bucket_elements, allgather_bucket_size=bucket_elements)
        if offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu"}
        return zero

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        # the caller says where the accumulation ends (DeepSpeed's set_gradient_accumulation_boundary), so a step may
        # have any number of micro-batches (trainer.micro_batch_tokens); DeepSpeed reduces and steps at that one
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)
        if self.zero_stage == 3 and not self.engine.is_gradient_accumulation_boundary():
            # ZeRO-3 counts micro-batches in DeepSpeedEngine.forward, which rlvrlab bypasses (it calls the module
            # itself, with logits_to_keep): without this each micro-batch's gradient replaced the last one's instead
            # of adding to it (measured: the gradient norm of the last micro-batch alone)
            self.engine.optimizer.clear_backward_seen_flag()
        self._stepped = self.engine.is_gradient_accumulation_boundary()
        if self._stepped:
            # ZeRO-0 in fp32 clips without keeping the norm; its gradients are whole here, so measure them
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]  # empty under ZeRO-1/2
            if grads:
                self._norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        self.engine.step()  # DeepSpeed steps the optimizer itself at the accumulation boundary

    def step(self) -> float:
        """The optimizer step already happened in the last backward; report the gradient norm it used. Called
        when no backward(last=True) ended the accumulation, the optimizer did not step: an error, not a silent
        no-op."""
        if not self._stepped:
            raise RuntimeError("step() before a backward(last=True): DeepSpeed's gradient accumulation did not end, "
                               "so the optimizer did not step; mark the last micro-batch of each step")
        self._stepped = False
        norm = self.engine.get_global_grad_norm()  # ZeRO-1/2 and bf16 keep it
        return float(norm) if norm is not None else self._norm

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        if self.zero_stage < 3:
            return self.module.state_dict().items()  # ZeRO 0-2 keep full weights on every rank
        return self._gathered()

    def weight_norm(self) -> float:
        """The 2-norm of the trained weights (requires_grad: what the optimizer updates). ZeRO 0-2 keep them whole on
        every rank. Under ZeRO-3 module.parameters() are empty placeholders between forwards, so each rank squares
        its own fp32 partition (deepspeed.utils.safe_get_local_fp32_param, the optimizer's copy the module's is
        taken from; the padding of the last rank's partition left out) and the ranks add them in one all-reduce of
        one number: no weight is gathered."""
        trained = [p for p in self.module.parameters() if p.requires_grad]
        if self.zero_stage < 3:
            return float(total_norm([p.detach() for p in trained]))
        from deepspeed.utils import safe_get_local_fp32_param

        rank = torch.distributed.get_rank()  # in the partition group: the whole world (no MiCS or hpZ configured)
        squares = torch.zeros((), dtype=torch.float64, device=self.engine.device)
        for param in trained:
            local = safe_get_local_fp32_param(param)  # 1-D: this rank's slice of the flattened, padded weight
            owned = max(0, min(param.ds_numel - rank * local.numel(), local.numel()))
            squares += torch.linalg.vector_norm(local.detach()[:owned]).to(squares) ** 2
        return float(all_sum(squares, "the ZeRO-3 weight norm").sqrt())

    def _gathered(self) -> Iterable[tuple[str, torch.Tensor]]:
        """ZeRO-3: the state dict's entries (tied ones included, as under ZeRO 0-2), each sharded parameter gathered
        in turn on every rank (each rank has its own rollout engine) and copied out of the gathered buffer, which
        is re-partitioned when the context closes."""
        import deepspeed

        for name, tensor in self.module.state_dict(keep_vars=True).items():
            if hasattr(tensor, "ds_id"):  # a ZeRO-3 partitioned parameter
                with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                    yield name, tensor.detach().clone()
            else:
                yield name, tensor.detach()

    def save(self, folder: Path) -> None:
        self.engine.save_checkpoint(str(folder / "deepspeed"), tag="latest", save_latest=False)

    def load(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder / "deepspeed"), tag="latest")
        if path is None:
            raise FileNotFoundError(folder / "deepspeed")

    def close(self) -> None:
        torch.nn.functional.linear = self._linear
