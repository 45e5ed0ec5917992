"""rlvrlab.components.enable_gradient_checkpointing: the same gradients, fewer saved activations; dropout refused."""

import pytest
import torch

from rlvrlab.components import enable_gradient_checkpointing
from rlvrlab.errors import RlvrlabError


def _model(**extra) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, **extra)
    return Qwen2ForCausalLM(config).eval()


def _grads_and_saved(model: torch.nn.Module) -> tuple[list[torch.Tensor], int]:
    ids = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        loss = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[..., 0].mean()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()], sum(saved)


def test_checkpointing_gives_the_same_gradients_and_saves_less():
    plain, saved_plain = _grads_and_saved(_model())
    model = _model()
    enable_gradient_checkpointing(model)
    checkpointed, saved_checkpointed = _grads_and_saved(model)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, checkpointed, strict=True))
    assert saved_checkpointed < saved_plain / 2


def test_a_model_with_dropout_is_refused_in_one_line():
    with pytest.raises(RlvrlabError, match="has dropout") as caught:
        enable_gradient_checkpointing(_model(attention_dropout=0.1))
    assert "\n" not in str(caught.value)
