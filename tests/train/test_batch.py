"""rlvrlab.train.batch: micro-batches cut to their own longest row, and the logged entropy outside the graph."""

import torch

from rlvrlab.rollout.base import Generation
from rlvrlab.train.batch import collate, logp_and_entropy, own_width


def _model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


def _batch():
    """Rows of different prompt and response lengths; the last two are short."""
    rows = [((1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11, 12, 13)), ((3, 4), (5,)), ((6, 7, 8), (9, 10))]
    groups = [[Generation(p, r, "", tuple(0.0 for _ in r))] for p, r in rows]
    return rows, collate(groups, ["a", "b", "c"], [0.0, 0.0, 0.0], pad_id=0, version=0, batch_index=0)


def _alone(model, prompt, response) -> torch.Tensor:
    """The response's log-probs with the row on its own: no padding at all."""
    ids = torch.tensor([list(prompt) + list(response)])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def test_a_micro_batch_is_cut_to_its_own_longest_row_and_gives_the_same_logp():
    model = _model()
    rows, batch = _batch()
    short = batch.rows(slice(1, 3))
    cut = own_width(short)
    assert cut.input_ids.shape == (2, 3 + 2)  # longest prompt 3, longest response 2 (the batch: 6 + 7)
    assert cut.prompt_width == 3 and cut.mask.shape == (2, 2)
    with torch.no_grad():
        whole, _ = logp_and_entropy(model, batch, temperature=1.0)
        part, _ = logp_and_entropy(model, short, temperature=1.0)
    assert part.shape == short.mask.shape  # padded back to the batch's width
    for i, (prompt, response) in enumerate(rows):
        truth = _alone(model, prompt, response)
        assert torch.allclose(whole[i, : len(response)], truth, atol=1e-5)
        assert bool((whole[i, len(response):] == 0).all())
    for i, (prompt, response) in enumerate(rows[1:]):
        assert torch.allclose(part[i, : len(response)], _alone(model, prompt, response), atol=1e-5)
        assert bool((part[i, len(response):] == 0).all())


def test_the_entropy_is_outside_the_graph_unless_the_loss_uses_it():
    model = _model()
    _, batch = _batch()
    logp, logged = logp_and_entropy(model, batch, temperature=0.7)
    assert logp.requires_grad and logged is not None and not logged.requires_grad
    logp2, trained = logp_and_entropy(model, batch, temperature=0.7, entropy_grad=True)
    assert trained is not None and trained.requires_grad
    assert torch.allclose(logged, trained.detach()) and torch.equal(logp.detach(), logp2.detach())
