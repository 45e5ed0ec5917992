"""Prompt rendering (dataset.template, system_prompt, fewshot, chat template) and the hf engine's sampler."""

from __future__ import annotations

import math

import pytest
import torch

from rlvrlab.components import prompt_renderer
from rlvrlab.config import compose
from rlvrlab.data.problems import Problem
from rlvrlab.errors import ConfigError
from rlvrlab.rollout.hf_engine import sample_next


class RecordingTokenizer:
    """Stands in for a tokenizer only to show what the renderer hands it: the chat turns or the plain text."""

    def __init__(self) -> None:
        self.seen: list = []

    def apply_chat_template(self, turns, *, add_generation_prompt, tokenize, return_dict):
        assert add_generation_prompt and tokenize and not return_dict
        self.seen.append(turns)
        return [1, 2, 3]

    def __call__(self, text):
        self.seen.append(text)
        return type("Encoding", (), {"input_ids": [len(text)]})()


SHOTS = ["dataset.fewshot=[[\"What is 3 + 4?\", \"\\\\boxed{7}\"], [\"What is 5 + 6?\", \"\\\\boxed{11}\"]]"]


def test_chat_prompt_has_the_system_turn_then_the_examples_then_the_question() -> None:
    cfg = compose(None, ["dataset.use_chat_template=true", "dataset.system_prompt=Box it.",
                         "dataset.template=Q: {prompt}", *SHOTS])
    tokenizer = RecordingTokenizer()
    assert prompt_renderer(cfg.dataset, tokenizer)(Problem(id="p", prompt="What is 1 + 1?", answer="2")) == [1, 2, 3]
    assert tokenizer.seen == [[
        {"role": "system", "content": "Box it."},
        {"role": "user", "content": "Q: What is 3 + 4?"}, {"role": "assistant", "content": "\\boxed{7}"},
        {"role": "user", "content": "Q: What is 5 + 6?"}, {"role": "assistant", "content": "\\boxed{11}"},
        {"role": "user", "content": "Q: What is 1 + 1?"},
    ]]


def test_plain_prompt_puts_system_and_examples_in_paragraphs() -> None:
    cfg = compose(None, ["dataset.system_prompt=Box it.", *SHOTS])
    tokenizer = RecordingTokenizer()
    prompt_renderer(cfg.dataset, tokenizer)(Problem(id="p", prompt="What is 1 + 1?", answer="2"))
    assert tokenizer.seen == ["Box it.\n\nWhat is 3 + 4? \\boxed{7}\n\nWhat is 5 + 6? \\boxed{11}\n\nWhat is 1 + 1?"]
    # nothing set: the question alone, as before
    tokenizer = RecordingTokenizer()
    prompt_renderer(compose(None, []).dataset, tokenizer)(Problem(id="p", prompt="3 4 -> 7", answer="x"))
    assert tokenizer.seen == ["3 4 -> 7"]


@pytest.mark.parametrize("value", ['[["only a question"]]', '[["q", ""]]', '[["q", "a", "b"]]'])
def test_fewshot_examples_must_be_pairs(value: str) -> None:
    with pytest.raises(ConfigError, match="dataset.fewshot example 1 .* non-empty \\[question, answer\\] pair"):
        compose(None, [f"dataset.fewshot={value}"])


def test_top_p_keeps_the_smallest_set_reaching_p_and_logp_stays_raw() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().expand(4000, 3).contiguous()  # [R, V]
    generator = torch.Generator().manual_seed(0)
    for top_p, allowed in ((1.0, {0, 1, 2}), (0.6, {0, 1}), (0.5, {0})):
        token, logp = sample_next(logits, temperature=1.0, top_p=top_p, generator=generator)
        assert set(token.tolist()) == allowed
        assert torch.allclose(logp, probs.log()[token])  # the raw log-prob, not the renormalised one
    token, _ = sample_next(logits, temperature=1.0, top_p=1.0, generator=generator)
    share = torch.bincount(token, minlength=3).double() / len(token)
    assert torch.allclose(share, probs.double(), atol=0.03)
    # temperature 2 flattens: p ∝ sqrt(probs)
    token, logp = sample_next(logits, temperature=2.0, top_p=1.0, generator=generator)
    flat = probs.sqrt() / probs.sqrt().sum()
    assert torch.allclose(torch.bincount(token, minlength=3).double() / len(token), flat.double(), atol=0.03)
    assert math.isclose(float(logp[token == 2][0]), math.log(0.2), rel_tol=1e-6)
