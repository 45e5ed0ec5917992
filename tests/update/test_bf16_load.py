"""Under model.dtype=bfloat16 the trainer loads the model folder's weights in bf16, not fp32 (half the host memory per
rank), and DeepSpeed still trains from fp32 master weights: the ones an fp32 load gave, bit for bit (DeepSpeed casts
an fp32 module to bf16 before it builds its masters). model.dtype=float32 loads and trains fp32 weights as before."""

import pytest
import torch

from rlvrlab import components
from rlvrlab.config import compose
from rlvrlab.data import load_problems, warm_start_targets
from rlvrlab.policy.tiny import build_tiny_model, tokenizer_corpus
from rlvrlab.train.setup import build

pytestmark = pytest.mark.slow


def _masters(deepspeed_engine) -> torch.Tensor:
    """The optimizer's weights of DeepSpeed's ZeRO-1/2 optimizer (its fp32 masters under bf16), as one flat tensor
    in the module's parameter order (one rank: the one partition holds them all, then alignment padding)."""
    return torch.cat([part.flatten() for part in deepspeed_engine.optimizer.single_partition_of_fp32_groups])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_weights_load_in_the_model_dtype_and_deepspeed_trains_fp32_masters_of_them(tmp_path, monkeypatch, dtype):
    tiny = compose(None, [])
    corpus = tokenizer_corpus(load_problems(tiny.dataset, tiny.model)[0], warm_start_targets(tiny.dataset))
    folder = build_tiny_model(tmp_path / "model", corpus=corpus, layers=1, hidden=32, heads=2, seed=0)  # fp32 on disk
    cfg = compose(None, ["model.tier=real", f"model.path={folder}", f"model.dtype={dtype}", "trainer.zero_stage=2",
                         *(["trainer.grad_accum_fp32=true"] if dtype == "bfloat16" else []), "steps=1",
                         "trainer.checkpoint_every=0", f"output_dir={tmp_path / 'runs'}"])
    loaded: list[set[torch.dtype]] = []
    build_update_engine = components.update_engine

    def update_engine(cfg, model, world_size):  # the real builder, told what the trainer loaded
        loaded.append({p.dtype for p in model.parameters()})
        return build_update_engine(cfg, model, world_size)

    monkeypatch.setattr(components, "update_engine", update_engine)
    run = build(cfg)
    try:
        want = components.torch_dtype(dtype)
        assert loaded == [{want}]  # before DeepSpeed wrapped them
        engine = run.update.engine  # type: ignore[attr-defined]
        params = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
        masters = _masters(engine)
        assert params.dtype == want and masters.dtype == torch.float32
        assert torch.equal(masters[:params.numel()], params.float())  # the masters are the weights, in fp32
        # the same masters as from the fp32 load the trainer made before: DeepSpeed rounds fp32 weights to bf16 as
        # the bf16 load rounds them (and keeps fp32 ones), then builds its masters from those
        old = build_update_engine(cfg, components.load_model(folder, torch.float32), 1)
        assert torch.equal(_masters(old.engine), masters)  # type: ignore[attr-defined]
        if dtype == "bfloat16":  # rounded: the folder's fp32 weights are not all bf16 values
            disk = torch.cat([p.detach().flatten() for p in components.load_model(folder).parameters()])
            assert not torch.equal(disk, masters[:params.numel()])
    finally:
        run.tracker.finish("FINISHED")
        run.rollout.close()
        run.verifier.close()
        run.update.close()
