"""One DeepSpeed update of the toy policy on a fixed global batch, split over this launch's processes.

    python tests/services/dp_check.py OUT.pt                                  # one process
    torchrun --nproc_per_node 2 tests/services/dp_check.py OUT.pt             # two processes (gloo on CPU)

Every rank samples the same global batch (same seed), keeps the prompts of its rank (r::world, as the loop
splits them), and runs the loop's own `update_policy`; rank 0 saves the updated table to OUT.pt.
One mini-batch per epoch: with trainer.mini_batches > 1 each process shuffles its own rows into mini-batches
(as verl does), so the global mini-batches, and with them the update, depend on the number of processes.
"""

import sys
import tempfile

import torch

from rlvrlab.config import compose
from rlvrlab.train.batch import TrainerLogp, collate
from rlvrlab.train.logprobs import logp_and_entropy
from rlvrlab.train.optimize import update_policy, update_rows
from rlvrlab.train.setup import build


def main(out: str) -> None:
    cfg = compose("toy", [f"output_dir={tempfile.mkdtemp()}", "trainer.engine=deepspeed", "trainer.zero_stage=1",
                          "trainer.micro_batch_size=4", "trainer.ppo_epochs=3",
                          "algorithm=dapo_loss"])
    run = build(cfg)
    problems = run.problems[: cfg.rollout.prompts_per_step]
    groups = run.rollout.generate([run.prompt_ids(p) for p in problems], n=cfg.rollout.group_size, seed=1234)
    mine = list(range(run.rank, len(problems), run.world_size))
    verdicts = run.verifier.score([g.text for i in mine for g in groups[i]],
                                  [problems[i].answer for i in mine for _ in groups[i]])
    rewards = [v.score for v in verdicts]
    batch = collate([groups[i] for i in mine], [problems[i].id for i in mine], rewards, pad_id=run.pad_id,
                    version=0, batch_index=0)
    with torch.no_grad():
        logp, entropy = logp_and_entropy(run.update.module, batch, temperature=1.0)
    rows, _ = update_rows(run, batch, TrainerLogp(logp, logp, entropy), None)
    initial = run.update.module.logits.detach().clone()
    result = update_policy(run, rows, step=0)
    if run.rank == 0:
        torch.save({"initial": initial, "logits": run.update.module.logits.detach(), "norms": result.norms}, out)
    run.tracker.finish("FINISHED")


if __name__ == "__main__":
    main(sys.argv[1])
