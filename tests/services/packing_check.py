"""Micro-batches packed by a token budget over data-parallel ranks: one DeepSpeed ZeRO-2 step.

    python tests/services/packing_check.py OUT.pt                          # one process: all rows
    torchrun --nproc_per_node 2 tests/services/packing_check.py OUT.pt     # rank 0 the short rows, rank 1 the long

Rank 0's rows pack into fewer micro-batches than rank 1's; the loop's `run_micro_batches` gives every rank the largest
count (ZeRO-2 reduces gradients in every backward: unequal counts would hang). The loss is normalised by the global
token count (as the loop's Aggregation does, times the ranks DeepSpeed averages over); rank 0 saves the weights
and each rank's micro-batch counts.
"""

import sys
from types import SimpleNamespace

import torch

from rlvrlab.rollout.base import Generation
from rlvrlab.train.batch import collate
from rlvrlab.train.optimize import run_micro_batches
from rlvrlab.update.deepspeed_engine import DeepSpeedEngine
from rlvrlab.update.dist import all_sum, setup_distributed

SHORT = [(2, 1), (3, 2), (2, 2), (1, 3), (2, 1), (3, 1)]  # (prompt, response) tokens: 6 rows of <= 4 tokens
LONG = [(4, 12), (5, 10), (3, 14), (4, 11), (6, 9), (5, 13)]  # 6 rows of 14-18 tokens


def _batch(sizes):
    groups = [[Generation(tuple(range(1, p + 1)), tuple(range(2, t + 2)), "", (0.0,) * t)] for p, t in sizes]
    return collate(groups, [str(i) for i in range(len(sizes))], [0.0] * len(sizes), pad_id=0, version=0,
                   batch_index=0)


def main(out: str) -> None:
    placement = setup_distributed()
    rank, world = placement.rank, placement.world_size
    sizes = (SHORT + LONG) if world == 1 else (SHORT if rank == 0 else LONG)
    batch = _batch(sizes)
    cfg = SimpleNamespace(trainer=SimpleNamespace(micro_batch_size=4, micro_batch_tokens=40))
    own = len(run_micro_batches(SimpleNamespace(cfg=cfg, world_size=1, shared_cache=None), batch, same_count_on_all_ranks=True))
    parts = run_micro_batches(SimpleNamespace(cfg=cfg, world_size=world, shared_cache=None), batch, same_count_on_all_ranks=True)
    torch.manual_seed(0)
    engine = DeepSpeedEngine(torch.nn.Embedding(32, 4), lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=0.0,
                             zero_stage=2, bf16=False, micro_batch_size=4, accumulation_steps=1, world_size=world)
    tokens = float(all_sum(torch.tensor([batch.mask.sum()], dtype=torch.float64))[0])
    for i, rows in enumerate(parts):
        x = batch.rows(rows)
        response = x.input_ids[:, x.prompt_width:]
        value = (engine.module(response).pow(2).sum(-1) * x.mask).sum() / tokens * world
        engine.backward(value, last=i == len(parts) - 1)
    norm = engine.step()
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    if world > 1:
        torch.distributed.all_gather(counts, torch.tensor([own]))
    if rank == 0:
        torch.save({"weight": engine.module.weight.detach().clone(), "norm": norm, "parts": len(parts),
                    "own": [int(c) for c in counts] if world > 1 else [own]}, out)


if __name__ == "__main__":
    main(sys.argv[1])
