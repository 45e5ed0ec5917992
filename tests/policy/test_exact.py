"""Teacher-forced probabilities of listed responses (rlvrlab.policy.exact) on the pairs task's tiny model: equal to
a plain unpadded forward pass, and to what the rollout engine actually samples (exact vs sampled pass@1 and
per-answer frequencies)."""

import numpy as np
import pytest
import torch

from rlvrlab import components
from rlvrlab.algorithms.passk import exact_metrics
from rlvrlab.config import compose
from rlvrlab.data import answer_space, load_problems
from rlvrlab.policy.exact import response_logprobs, single_tokenization
from rlvrlab.rewards.pairs import pairs

pytestmark = pytest.mark.slow  # builds and warm-starts a tiny model

OVERRIDES = ["dataset=pairs", "model.tiny_layers=1", "model.tiny_hidden=32", "model.tiny_heads=2",
             "model.warmstart_steps=150", "rollout.max_new_tokens=6"]


@pytest.fixture(scope="module")
def pairs_model():
    cfg = compose("default", OVERRIDES)
    train, held = load_problems(cfg.dataset, cfg.model)
    folder = components.model_folder(cfg, train)
    tokenizer = components.load_tokenizer(folder)
    return cfg, held[:6], folder, tokenizer, components.load_model(folder)


def test_logprobs_equal_an_unpadded_forward_pass(pairs_model) -> None:
    cfg, problems, _, tok, model = pairs_model
    space = answer_space(cfg.dataset)
    prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    texts = [space(p)[:3] + ["0 0"] for p in problems]  # a wrong one too: any listed text works
    got = response_logprobs(model, prompts, texts, tokenizer=tok, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                            temperature=0.7, batch_size=5)
    for prompt, row, values in zip(prompts, texts, got):
        for text, value in zip(row, values):
            response = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids = torch.tensor([prompt + response])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double() / 0.7, -1)
            expected = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(response))
            assert float(value) == pytest.approx(expected, abs=1e-4)


def test_exact_pass_at_1_matches_what_the_engine_samples(pairs_model) -> None:
    cfg, problems, folder, tok, model = pairs_model
    space = answer_space(cfg.dataset)
    assert single_tokenization(tok, sorted({t for p in problems for t in space(p)})) is None
    prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    probs = [lp.exp().numpy() for lp in response_logprobs(model, prompts, [space(p) for p in problems],
                                                          tokenizer=tok, eos_id=tok.eos_token_id,
                                                          pad_id=tok.pad_token_id)]
    engine = components.rollout_engine(components.Sampling.of(cfg), folder, tok, seed=0, model=model)
    n = 400
    groups = engine.generate(prompts, n=n, seed=1)
    for problem, group, p in zip(problems, groups, probs):
        texts = [g.text for g in group]
        sampled = np.mean([pairs(t, problem.answer).score for t in texts])
        z = p.sum()
        assert sampled == pytest.approx(z, abs=4 * np.sqrt(z * (1 - z) / n) + 1e-9)
        top = int(np.argmax(p))  # the likeliest correct answer's own frequency
        freq = np.mean([t == space(problem)[top] for t in texts])
        assert freq == pytest.approx(p[top], abs=4 * np.sqrt(p[top] * (1 - p[top]) / n) + 1e-9)
    assert 0 < exact_metrics(probs, ks=[4], group_size=8)["pass_at_1"] < 1


def test_a_second_tokenization_is_detected(pairs_model) -> None:
    _, problems, _, tok, _ = pairs_model
    assert single_tokenization(tok, ["3 8", "0 1"]) is None  # digits and spaces never merge
    from rlvrlab.policy.tiny import train_tokenizer

    merging = train_tokenizer(["abab abab abab"] * 50)  # learns merges such as "ab"
    assert len(merging(["ab"], add_special_tokens=False)["input_ids"][0]) == 1
    reason = single_tokenization(merging, ["ab"])  # "a" + "b" also decodes to "ab": the probability is not exact
    assert reason is not None and "second tokenization" in reason
