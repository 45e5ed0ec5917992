"""The toy tier's rollout engine: its draws are fixed by the seed, whatever way they are batched."""

from __future__ import annotations

import pytest
import torch

from rlvrlab.rollout.toy_engine import ToyEngine, _nucleus


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.6)])
def test_one_call_for_all_prompts_draws_what_one_call_per_prompt_draws(temperature: float, top_p: float) -> None:
    """The engine draws every prompt's n responses in one multinomial call over [K, M]; the draws must be those of
    one call per prompt in prompt order from the same generator (the toy runs of results/ were sampled that way)."""
    logits = torch.randn(6, 16, generator=torch.Generator().manual_seed(0)) * 2
    engine = ToyEngine(logits, temperature=temperature, top_p=top_p)
    prompts = [[3], [0], [5], [3], [1]]
    got = [[g.response_ids[0] for g in group] for group in engine.generate(prompts, n=8, seed=11)]
    generator = torch.Generator().manual_seed(11)
    expected = []
    for prompt in prompts:
        probs = torch.softmax(logits[prompt[0]].double() / temperature, dim=-1)
        expected.append(torch.multinomial(_nucleus(probs, top_p), 8, replacement=True, generator=generator).tolist())
    assert got == expected
    first = engine.generate(prompts, n=8, seed=11)[2][0]
    assert first.logp[0] == pytest.approx(float(torch.log_softmax(logits[5].double(), -1)[first.response_ids[0]]))
