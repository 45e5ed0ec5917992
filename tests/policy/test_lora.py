"""LoRA through peft (model.lora, rlvrlab.policy.lora): the merge the rollout engines load, the config rules, and
tiny-tier runs that train only the adapters (torch and DeepSpeed engines, the hf rollout engine), save them in
checkpoints, resume, and are evaluated from their checkpoint."""

from pathlib import Path

import pytest
import torch

from rlvrlab import components
from rlvrlab.config import compose
from rlvrlab.config.lora import check_lora
from rlvrlab.errors import ConfigError
from rlvrlab.policy import lora

ONE_MODEL = "model.warm_start_seed=0"  # one cached warm start for every run of the file


def small_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


def adapted(r: int = 4, alpha: float = 8.0, targets: tuple[str, ...] = ("all-linear",)):
    peft_model = lora.with_adapters(small_model(), r=r, alpha=alpha, dropout=0.0, target_modules=list(targets))
    with torch.no_grad():  # B starts at zero (an adapter that changes nothing): give it a trained-looking value
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return peft_model


def test_merged_weights_are_peft_merge_under_the_base_names():
    peft_model = adapted()
    model = peft_model.get_base_model()
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        unmerged = model(input_ids=ids).logits
    state = dict(lora.merged_weights(model.state_dict().items(), lora.lora_scaling(peft_model)))
    assert lora.lora_scaling(peft_model) == 2.0
    reference = peft_model.merge_and_unload().state_dict()
    assert state.keys() == reference.keys()  # the base model's own names, tied lm_head included
    for name, tensor in reference.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=1e-7, msg=name)
    plain = small_model()
    plain.load_state_dict(state, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, unmerged, rtol=1e-5, atol=1e-5)


def test_only_adapters_train_and_the_reference_is_the_frozen_base():
    base_logits = small_model()(input_ids=torch.arange(8)[None]).logits
    peft_model = adapted(targets=("q_proj", "v_proj"))
    model = peft_model.get_base_model()
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "v_proj"}
    # per layer: q_proj A [4, 32], B [32, 4]; v_proj A [4, 32], B [16, 4] (2 key-value heads of 8)
    assert lora.trainable_parameters(model) == 2 * ((4 * 32 + 32 * 4) + (4 * 32 + 16 * 4))
    reference = lora.NoAdapters(peft_model)
    assert list(reference.parameters()) == []  # no copy of the weights
    with torch.no_grad():
        assert torch.equal(reference(input_ids=torch.arange(8)[None]).logits, base_logits.detach())
        assert not torch.allclose(model(input_ids=torch.arange(8)[None]).logits, base_logits)


def test_a_layer_without_its_adapter_parts_is_an_error():
    state = [("layer.base_layer.weight", torch.zeros(2, 2)), ("layer.lora_A.default.weight", torch.zeros(1, 2))]
    with pytest.raises(RuntimeError, match="layer lacks its base weight, lora_A or lora_B"):
        list(lora.merged_weights(state, 1.0))


def test_targets_that_are_not_linear_layers_are_refused():
    from rlvrlab.errors import RlvrlabError

    with pytest.raises(RlvrlabError, match="is not a linear layer"):
        lora.with_adapters(small_model(), r=2, alpha=4, dropout=0.0, target_modules=["embed_tokens"])
    with pytest.raises(RlvrlabError, match=r"model.lora.target_modules=\['no_such_layer'\]"):
        lora.with_adapters(small_model(), r=2, alpha=4, dropout=0.0, target_modules=["no_such_layer"])


@pytest.mark.parametrize("overrides,message", [
    (["model.lora.r=-1"], r"model.lora.r=-1 is out of range: it must be in \[0, "),
    (["model.lora.r=4", "model.lora.alpha=0"], r"model.lora.alpha=0.0 is out of range: it must be > 0"),
    (["model.lora.r=4", "model.lora.dropout=1.0"], r"model.lora.dropout=1.0 is out of range: it must be in \[0, 1\)"),
])
def test_lora_ranges(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(None, overrides)


@pytest.mark.parametrize("overrides,message", [
    (["model.tier=toy", "dataset=toy", "model.lora.r=4"], "the toy tier is one table; set model.tier=tiny or real"),
    (["model.lora.r=4", "model.lora.target_modules=[]"], "must name at least one module"),
    (["model.lora.r=4", "model.lora.dropout=0.1"], "would never act"),
])
def test_lora_cross_field_rules(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_lora(compose(None, overrides))
    check_lora(compose(None, [o for o in overrides if o != "model.lora.r=4" and o != "model.lora.dropout=0.1"]))


def test_composition_checks_the_lora_rules():
    with pytest.raises(ConfigError, match="the toy tier is one table"):
        compose(None, ["model.tier=toy", "dataset=toy", "model.lora.r=4"])


def test_config_show_lists_the_lora_section():
    from typer.testing import CliRunner

    from rlvrlab.cli.main import app

    result = CliRunner().invoke(app, ["config", "show", "model.lora.r=8", "model.lora.target_modules=[q_proj,v_proj]"])
    assert result.exit_code == 0, result.output
    assert "  lora:\n    r: 8\n    alpha: 16.0\n    dropout: 0.0\n    target_modules:\n    - q_proj\n    - v_proj\n" \
        in result.output


def test_the_lora_settings_are_part_of_the_config_hash():
    from rlvrlab.config import config_hash

    hashes = {config_hash(compose(None, overrides)) for overrides in (
        [], ["model.lora.r=4"], ["model.lora.r=8"], ["model.lora.r=4", "model.lora.alpha=8"],
        ["model.lora.r=4", "model.lora.target_modules=[q_proj,v_proj]"])}
    assert len(hashes) == 5


def _lora_run(tmp_path: Path, monkeypatch, name: str, *overrides: str):
    """A 2-step tiny-tier LoRA run; returns its run id, the Policy it trained and its initial model's state."""
    from rlvrlab.train.loop import train

    kept = {}
    build = components.policy

    def keep(*args, **kwargs):
        kept["policy"] = build(*args, **kwargs)
        return kept["policy"]

    monkeypatch.setattr(components, "policy", keep)
    cfg = compose(None, ["steps=2", "seed=1", ONE_MODEL, "model.lora.r=4", "trainer.lr=1e-2",
                         "trainer.checkpoint_every=2", f"output_dir={tmp_path / name}", *overrides])
    run_id = train(cfg)
    from rlvrlab.data import load_problems

    folder = components.model_folder(cfg, load_problems(cfg.dataset, cfg.model)[0])
    return run_id, kept["policy"], components.load_model(folder).state_dict(), folder


@pytest.mark.slow
@pytest.mark.parametrize("engine", [
    ["trainer.engine=torch"],
    ["trainer.engine=torch", "trainer.gradient_checkpointing=true", "algorithm.kl_coef=0.01"],
    ["trainer.engine=deepspeed", "trainer.zero_stage=0", "algorithm.kl_coef=0.01"],
    ["trainer.engine=deepspeed", "trainer.zero_stage=2"],
    ["trainer.engine=deepspeed", "trainer.zero_stage=3", "algorithm.kl_coef=0.01"],
], ids=["torch", "torch-checkpointing-kl", "zero0-kl", "zero2", "zero3-kl"])
def test_a_tiny_lora_run_trains_only_the_adapters(tmp_path, monkeypatch, mlflow_history, engine):
    """Base weights bit-identical after two steps, every adapter's B moved off zero, the hf sampler's log-probs
    those of the trainer (merged weights synced, gathered one layer at a time under ZeRO-3), rewards logged, and the
    checkpoint holds the merged model and the adapter, which load to the same weights. With a KL term the
    reference is the base with the adapters off."""
    from safetensors.torch import load_file

    from rlvrlab.update.base import full_weights

    run_id, policy, initial, base_folder = _lora_run(tmp_path, monkeypatch, "run", *engine)
    state = full_weights(policy.update.weights(), keep=True)  # the module's own is partitioned under ZeRO-3
    assert state is not None
    base = {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
    assert base.keys() == initial.keys()
    for name, tensor in initial.items():
        assert torch.equal(base[name], tensor), name
    moved = [float(v.abs().max()) for k, v in state.items() if ".lora_B." in k]
    assert len(moved) == 4 * 7 and min(moved) > 0  # 4 layers x 7 linear layers (all-linear)
    history = mlflow_history(tmp_path / "run", run_id)
    assert len(history["train/reward"]) == 2
    assert max(history["rollout/logp_gap_max"].values()) < 1e-3

    model = next((tmp_path / "run" / run_id / "checkpoints").iterdir()) / "model"
    merged = load_file(model / "model.safetensors")
    want = dict(lora.merged_weights(state.items(), 16.0 / 4))
    for name, tensor in merged.items():
        assert torch.equal(tensor, want[name]), name
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           initial["model.layers.0.self_attn.q_proj.weight"])
    from_adapter = components.load_model(model / lora.ADAPTER).state_dict()  # base + adapter, merged by peft
    for name, tensor in merged.items():
        torch.testing.assert_close(from_adapter[name], tensor, rtol=0, atol=1e-6, msg=name)
    # r x layers x (in + out) of q, k, v, o (128 -> 128) and gate, up, down (128 <-> 256)
    assert sum(v.numel() for k, v in state.items() if ".lora_" in k) == 4 * 4 * (4 * (128 + 128) + 3 * (128 + 256))


@pytest.mark.slow
def test_a_resumed_lora_run_continues_as_the_uninterrupted_one(tmp_path, monkeypatch, mlflow_history):
    """A 2-step run with its checkpoint, extended to 3 steps by a resume (adapters and optimizer state from the
    checkpoint), logs every step as a 3-step run does."""
    from rlvrlab.train.loop import train
    from rlvrlab.train.setup import run_config

    stable = ("train/", "loss/", "policy/", "rollout/logp_gap")
    args = ["steps=2", "seed=4", ONE_MODEL, "model.lora.r=4", "trainer.engine=torch", "trainer.lr=1e-2",
            "trainer.checkpoint_every=2"]
    run_id = train(compose(None, [*args, f"output_dir={tmp_path / 'a'}"]))
    train(run_config(None, ["steps=3", f"output_dir={tmp_path / 'a'}"], resume=run_id), resume=run_id)
    reference = train(compose(None, [*args, "steps=3", f"output_dir={tmp_path / 'b'}"]))
    got, want = (
        {k: v for k, v in mlflow_history(tmp_path / d, r).items() if k.startswith(stable)}
        for d, r in (("a", run_id), ("b", reference)))
    assert len(want["train/reward"]) == 3
    assert got == want


@pytest.mark.slow
def test_eval_and_model_import_load_a_lora_checkpoint(tmp_path, monkeypatch):
    """`rlvrlab eval pass-at-k --run` evaluates a LoRA run's checkpoint (its model folder holds merged weights);
    `rlvrlab model import <checkpoint>/model/adapter` writes the base with the adapter merged, the same weights;
    `--model` of the adapter folder itself is one line naming both ways."""
    from safetensors.torch import load_file

    from rlvrlab.errors import RlvrlabError
    from rlvrlab.eval.pipeline import EvalRequest, pass_at_k
    from rlvrlab.policy.gguf_import import import_model

    run_id, _, _, base = _lora_run(tmp_path, monkeypatch, "run", "trainer.engine=torch")
    outcomes = list(pass_at_k(EvalRequest(run=run_id, output_dir=tmp_path / "run", n=2, k="1", limit=4,
                                          max_new_tokens=8, out=tmp_path / "eval")))
    assert len(outcomes) == 1 and outcomes[0].target.startswith(run_id[:12])
    assert len(outcomes[0].records) == 4

    model = next((tmp_path / "run" / run_id / "checkpoints").iterdir()) / "model"
    stages: list[str] = []
    folder, done = import_model(str(model / lora.ADAPTER), tmp_path / "imported", dtype="float32",
                                downloads=tmp_path / "downloads", stage=stages.append)
    assert done and any(stage.startswith(f"load {base}") for stage in stages)
    merged, imported = load_file(model / "model.safetensors"), load_file(folder / "model.safetensors")
    assert imported.keys() == merged.keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(imported[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert (folder / "tokenizer.json").is_file()
    again = import_model(str(model / lora.ADAPTER), tmp_path / "imported", dtype="float32",
                         downloads=tmp_path / "downloads", stage=stages.append)
    assert again == (folder, False)  # the same adapter again: found, nothing done
    with pytest.raises(RlvrlabError, match=r"is a LoRA adapter, not a model; give the merged model folder beside"):
        list(pass_at_k(EvalRequest(model=model / lora.ADAPTER, output_dir=tmp_path / "run", n=2, k="1")))


@pytest.mark.parametrize("targets", [("all-linear",), ("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj")])
def test_the_memory_estimate_counts_the_adapters_peft_makes(targets):
    """config.memory.lora_params (the trained weights of the estimate: gradients, masters, AdamW states) is the
    number of parameters peft's adapters train on the same model; the estimate's update then shrinks to them."""
    from rlvrlab.config import memory

    peft_model = adapted(r=4, targets=targets)
    trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    arch = memory.Architecture.from_hf(small_model().config.to_dict())
    assert memory.lora_params(arch, 4, list(targets)) == trained
    cfg = compose("toy", [])  # any config: the update's parts read the trainer and the model's LoRA
    full = memory.update_parts(cfg, arch, 1)
    cfg.model.lora.r, cfg.model.lora.target_modules = 4, list(targets)
    adapters = memory.update_parts(cfg, arch, 1)
    assert adapters["weights"] == full["weights"] + trained * 4  # fp32: the frozen base and the adapters
    assert adapters["optimizer"] == trained * 8  # AdamW's two fp32 moments of the adapters only
