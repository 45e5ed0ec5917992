"""A 2-rank process that exits right after a collective: the exit path of rlvrlab.update.dist under DeepSpeed.

    torchrun --nproc_per_node 2 tests/services/exit_check.py

A DeepSpeed ZeRO-2 engine takes one step (it keeps its process groups alive to the end), then an all_gather of
temporaries, then the interpreter exits. A gloo worker can still hold those temporaries when the caller's wait
returns; without the wait in rlvrlab's atexit handler about one exit in twelve aborted with SIGABRT on 2 cores.
"""

import torch
import torch.distributed as dist

from rlvrlab.update.deepspeed_engine import DeepSpeedEngine
from rlvrlab.update.dist import setup_distributed

if __name__ == "__main__":
    setup_distributed()
    engine = DeepSpeedEngine(torch.nn.Embedding(32, 4), lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=0.0,
                             zero_stage=2, bf16=False, micro_batch_size=4, accumulation_steps=1, world_size=2)
    engine.backward(engine.module(torch.arange(4)).sum(), last=True)
    engine.step()
    dist.all_gather([torch.zeros(1) for _ in range(2)], torch.ones(1))
