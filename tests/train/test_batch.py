"""rlvrlab.train.logprobs and rlvrlab.train.packing: micro-batches packed and cut to their own longest row, the
shared-prompt forward, and the logged entropy outside the graph."""

import torch

from rlvrlab.rollout.base import Generation
from rlvrlab.train.batch import collate
from rlvrlab.train.logprobs import logp_and_entropy, own_width


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


def test_the_logged_entropy_in_pieces_equals_the_entropy_in_one(monkeypatch):
    """logged_entropy bounds its temporaries to ENTROPY_CHUNK_ELEMENTS logits a piece: whole rows a piece, several
    or one, or a row split along its positions; each gives entropy_from_logits of the whole to 1e-6."""
    from rlvrlab.algorithms import entropy_from_logits
    from rlvrlab.train import logprobs as batch_module

    pieces: list[tuple[int, ...]] = []
    whole = batch_module.entropy_from_logits
    monkeypatch.setattr(batch_module, "entropy_from_logits", lambda x: pieces.append(tuple(x.shape)) or whole(x))
    monkeypatch.setattr(batch_module, "ENTROPY_CHUNK_ELEMENTS", 7 * 1000)  # 7 positions of a 1000-token vocabulary
    generator = torch.Generator().manual_seed(0)
    for shape, expected in [((5, 3, 1000), [(2, 3, 1000)] * 2 + [(1, 3, 1000)]),  # two rows of 3 positions a piece
                            ((2, 7, 1000), [(1, 7, 1000)] * 2),  # one row a piece
                            ((2, 16, 1000), [(7, 1000), (7, 1000), (2, 1000)] * 2)]:  # rows split at 7 positions
        logits = 4 * torch.randn(shape, generator=generator)
        pieces.clear()
        chunked = batch_module.logged_entropy(logits)
        assert pieces == expected and max(p[-2] * (p[0] if len(p) == 3 else 1) for p in pieces) <= 7
        assert chunked.shape == shape[:2] and not chunked.requires_grad
        assert torch.allclose(chunked, entropy_from_logits(logits), rtol=0, atol=1e-6)


def _random_batch(sizes: list[tuple[int, int]]):
    groups = [[Generation(tuple(range(1, p + 1)), tuple(range(1, t + 1)), "", tuple(0.0 for _ in range(t)))]
              for p, t in sizes]
    return collate(groups, [str(i) for i in range(len(sizes))], [0.0] * len(sizes), pad_id=0, version=0,
                   batch_index=0)


def test_rows_packed_by_a_token_budget_cover_the_batch_once_in_length_order_and_within_the_budget():
    import random

    from rlvrlab.train.optimize import in_batch_order
    from rlvrlab.train.packing import micro_batches, row_order, split_rows

    rng = random.Random(0)
    for budget in (1, 20, 64, 300):
        sizes = [(rng.randint(1, 12), rng.randint(0, 30)) for _ in range(rng.randint(1, 40))]
        batch = _random_batch(sizes)
        parts = micro_batches(batch, rows=8, tokens=budget)
        flat = torch.cat(parts).tolist()
        assert sorted(flat) == list(range(len(sizes)))  # every row exactly once
        lengths = [sizes[r][0] + sizes[r][1] for r in flat]
        assert lengths == sorted(lengths)  # packed in length order
        for part in parts:
            padded = own_width(batch.rows(part)).input_ids.numel()  # what the forward really pays
            assert padded <= budget or len(part) == 1  # a row longer than the budget goes alone
        for first, second in zip(parts, parts[1:]):  # greedy: the next row did not fit
            joined = torch.cat([first, second[:1]])
            assert own_width(batch.rows(joined)).input_ids.numel() > budget
        values = torch.arange(len(sizes), dtype=torch.float32).unsqueeze(-1)  # results concatenated by part...
        assert torch.equal(in_batch_order(values[torch.cat(parts)], row_order(parts, len(sizes))), values)  # ...back
    batch = _random_batch([(3, 4)] * 10)
    no_budget = micro_batches(batch, rows=4, tokens=None)  # consecutive rows, taken as views of the batch
    assert [p.tolist() for p in no_budget] == [p.tolist() for p in split_rows(10, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                                                         [8, 9]]
    view = batch.rows(no_budget[1]).input_ids
    assert row_order(no_budget, 10) is None and view.untyped_storage().data_ptr() == batch.input_ids.data_ptr()
    assert batch.rows(torch.arange(10)) is batch


def test_packed_by_length_passes_are_no_larger_than_rows_at_the_cap_and_never_more():
    """trainer.pack_by_length: the budget is `rows` rows at the batch's longest prompt + max_new_tokens, a row
    micro-batch whose responses ran to the cap. Hand-worked on _batch() (longest prompt 6), then over random
    batches: every pass within the budget, and never more passes than micro-batches of `rows` rows."""
    import random

    from rlvrlab.train.packing import micro_batches, packing_budget, pass_tokens, prompt_keys, split_rows

    _, batch = _batch()
    assert packing_budget(batch, 2, 7) == 2 * (6 + 7)
    assert packing_budget(batch.rows(torch.tensor([1, 2])), 2, 7) == 2 * (3 + 7)  # that batch's own longest prompt
    rng = random.Random(1)
    for _ in range(50):
        rows, cap = rng.randint(1, 8), rng.randint(1, 30)
        sizes = [(rng.randint(1, 12), rng.randint(0, cap)) for _ in range(rng.randint(1, 40))]
        batch = _random_batch(sizes)
        budget = packing_budget(batch, rows, cap)
        assert budget == rows * (max(p for p, _ in sizes) + cap)
        packed = micro_batches(batch, rows=rows, tokens=budget)
        assert max(own_width(batch.rows(part)).input_ids.numel() for part in packed) <= budget
        assert len(packed) <= len(split_rows(len(sizes), rows))  # each pass holds at least `rows` rows
        # with shared prompts (rows of equal prompt length have equal prompts here): first fit opens a pass only
        # when the row fits in no earlier one, and any `rows` rows fit, so again never more passes than rows
        shared = micro_batches(batch, rows=rows, tokens=budget, prompt_cache=0.1)
        keys = prompt_keys(batch)
        for part in shared:
            cut = own_width(batch.rows(part))
            used = pass_tokens(len({keys[r] for r in part.tolist()}), len(part), cut.prompt_width, cut.mask.shape[1],
                               0.1)
            assert used <= budget
        assert len(shared) <= len(split_rows(len(sizes), rows))


def _groups_batch(groups: list[tuple[int, list[int]]]):
    """One group per (prompt length, response lengths); each group's prompt differs from every other's."""
    gens = [[Generation(tuple([50 + g] + [1] * (p - 1)), tuple(range(1, t + 1)), "", (0.0,) * t) for t in sizes]
            for g, (p, sizes) in enumerate(groups)]
    return collate(gens, [str(g) for g in range(len(groups))], [0.0] * sum(len(s) for _, s in groups), pad_id=0,
                   version=0, batch_index=0)


def test_rows_sharing_a_prompt_pack_by_what_a_shared_pass_computes():
    """trainer.share_prompt: a pass computes each distinct prompt once, every row's response, and keeps the
    prompt's KV cache repeated per row (`shared_pass_tokens`), where that is less than the plain forward
    (`pass_tokens`). Hand-worked: 2 groups of 4 rows, prompts of 10
    tokens, responses of 2; at a budget of 36 both groups fit one pass (2 x 10 + 8 x 2 = 36, no cache charge),
    where packing rows at their padded size (8 x 12 = 96) takes three; charging the cache at 0.25 a position, a
    group costs 10 + 4 x 2 + 0.25 x 4 x 12 = 30 and a row of the other one more 45, so at 44 a pass per group. Then random batches: every row once, every pass within the
    budget, and a pass of rows that share nothing within it at its plain padded size too."""
    import random

    from rlvrlab.train.packing import micro_batches, pass_tokens, prompt_keys, shared_pass_tokens

    batch = _groups_batch([(10, [2, 2, 2, 2]), (10, [2, 2, 2, 2])])
    assert len(micro_batches(batch, rows=8, tokens=36)) == 3
    assert [p.tolist() for p in micro_batches(batch, rows=8, tokens=36, prompt_cache=0.0)] == [list(range(8))]
    assert shared_pass_tokens(1, 4, 10, 2, 0.25) == 30 and shared_pass_tokens(2, 5, 10, 2, 0.25) == 45
    assert sorted(p.tolist() for p in micro_batches(batch, rows=8, tokens=44, prompt_cache=0.25)) == \
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    rng = random.Random(3)
    for _ in range(60):
        groups = [(rng.randint(1, 12), [rng.randint(0, 20) for _ in range(rng.randint(1, 8))])
                  for _ in range(rng.randint(1, 10))]
        batch = _groups_batch(groups)
        budget, cache = rng.randint(1, 400), rng.choice([0.0, 0.1, 0.5])
        parts = micro_batches(batch, rows=8, tokens=budget, prompt_cache=cache)
        assert sorted(torch.cat(parts).tolist()) == list(range(len(batch)))  # every row exactly once
        keys = prompt_keys(batch)
        assert len(set(keys)) == len(groups)
        for part in parts:
            cut = own_width(batch.rows(part))
            distinct = len({keys[r] for r in part.tolist()})
            cost = pass_tokens(distinct, len(part), cut.prompt_width, cut.mask.shape[1], cache)
            assert cost <= budget or len(part) == 1  # a row over the budget alone
            assert cost <= cut.input_ids.numel()  # never more than the plain forward keeps
            if distinct == len(part):  # nothing shared: the plain forward, at its padded size
                assert cost == cut.input_ids.numel()


def test_the_cache_charge_is_the_kv_cache_relative_to_a_tokens_activations():
    """shared_cache_ratio: keys and values of every layer, per position, over rlvrlab.config.memory's activations
    of one token; hand-worked for a Qwen2 of hidden 128, 4 heads (4 KV heads of 32), MLP 256. None for a shape
    rlvrlab.config.memory does not know (GPT-2's names)."""
    from transformers import Qwen2Config

    from rlvrlab.train.packing import shared_cache_ratio

    config = Qwen2Config(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4)
    norms, attention, mlp = 4 * 128, (128 + 256) + 2 * (128 + 128) + 128 + 128, 4 * 256
    assert shared_cache_ratio(config) == 2 * 4 * 32 / (norms + attention + mlp)
    config.num_key_value_heads = 1  # grouped-query attention: a quarter of the keys and values
    assert shared_cache_ratio(config) == 2 * 1 * 32 / (norms + (128 + 64) + 2 * (128 + 32) + 128 + 128 + mlp)
    from transformers import GPT2Config

    assert shared_cache_ratio(GPT2Config()) is None  # no intermediate_size: not charged, so prompts are not shared


def test_the_loop_packs_to_an_explicit_budget_first_then_by_length_then_by_rows():
    """rlvrlab.train.optimize.run_micro_batches: trainer.micro_batch_tokens, when set, takes pack_by_length's place."""
    from types import SimpleNamespace

    from rlvrlab.train.optimize import run_micro_batches
    from rlvrlab.train.packing import micro_batches, packing_budget, split_rows

    batch = _random_batch([(2, 1), (9, 30), (3, 2), (2, 0), (4, 1), (3, 3)])

    def listed(found):
        return [p.tolist() for p in found]

    def parts(tokens, pack):
        cfg = SimpleNamespace(trainer=SimpleNamespace(micro_batch_size=2, micro_batch_tokens=tokens,
                                                      pack_by_length=pack), rollout=SimpleNamespace(max_new_tokens=30))
        run = SimpleNamespace(cfg=cfg, world_size=1, shared_cache=None)
        return listed(run_micro_batches(run, batch, same_count_on_all_ranks=True))

    assert packing_budget(batch, 2, 30) == 2 * (9 + 30) != 12
    assert parts(12, True) == parts(12, False) == listed(micro_batches(batch, rows=2, tokens=12))
    assert parts(None, True) == listed(micro_batches(batch, rows=2, tokens=78)) != parts(12, True)
    assert parts(None, False) == listed(split_rows(6, 2)) == [[0, 1], [2, 3], [4, 5]]


def test_packed_micro_batches_are_split_to_the_count_every_rank_needs():
    import pytest

    from rlvrlab.train.packing import split_to

    parts = [torch.tensor([0, 1, 2, 3, 4]), torch.tensor([5]), torch.tensor([6, 7])]
    split = split_to(parts, 5)
    assert [p.tolist() for p in split] == [[0, 1], [2], [3, 4], [5], [6, 7]]  # the widest first, halves in order
    assert split_to(parts, 3) == parts
    with pytest.raises(ValueError, match="cannot split 8 rows into 9"):
        split_to(parts, 9)


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)  # SmolLM2's architecture, grouped-query attention
    return LlamaForCausalLM(config).train()


def _grouped_batch():
    """Three prompts of 5, 2 and 3 tokens (left padding differs), each with responses of 1 to 6 tokens; the
    second prompt's rows come in two runs, as rows packed by length do; one prompt appears once."""
    prompts = [(1, 2, 3, 4, 5), (6, 7), (8, 9, 10), (11, 12, 13, 14)]
    rows = [(0, 3), (0, 1), (1, 6), (0, 2), (1, 1), (2, 4), (2, 4), (1, 2), (2, 1), (0, 5), (3, 2)]
    groups = [[Generation(prompts[p], tuple(range(20, 20 + t)), "", tuple(0.0 for _ in range(t)))] for p, t in rows]
    return collate(groups, [str(i) for i in range(len(rows))], [0.0] * len(rows), pad_id=0, version=0,
                   batch_index=0)


def test_rows_that_share_a_prompt_share_its_forward_and_get_the_same_logp_entropy_and_gradients():
    from rlvrlab.train.packing import shared_cache_ratio

    for model in (_model().train(), _llama()):
        batch = _grouped_batch()
        results = []
        for share in (None, shared_cache_ratio(model.config)):  # plain, then shared (checked below)
            model.zero_grad()
            logp, entropy = logp_and_entropy(model, batch, temperature=0.7, prompt_cache=share)
            (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
            results.append((logp.detach(), entropy, [p.grad.clone() for p in model.parameters()]))
        (logp0, ent0, grads0), (logp1, ent1, grads1) = results
        assert torch.allclose(logp0, logp1, atol=1e-5) and torch.allclose(ent0, ent1, atol=1e-5)
        assert bool((logp1[batch.mask == 0] == 0).all())
        for g0, g1 in zip(grads0, grads1):
            assert torch.allclose(g0, g1, rtol=1e-4, atol=1e-5)
        assert max(float(g.abs().max()) for g in grads1) > 0


def _graph_nodes(tensor: torch.Tensor) -> set[str]:
    """The names of the autograd nodes behind `tensor`."""
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [parent for parent, _ in node.next_functions]
    return {type(node).__name__ for node in seen}


def test_a_shared_prompt_forward_sums_repeated_rows_in_a_fixed_order():
    """Indexing's backward (index_put_ with accumulate, index_add_) adds a repeated row's gradients in whatever order
    torch's threads run: on a loaded 2-core machine the shared forward's gradients changed in the last bits from one
    backward to the next, and a resumed run stopped matching its uninterrupted twin. The shared forward repeats the
    prompt's cache and logits through `_RepeatRows` instead (a matrix product in backward); no indexing node is in
    its graph, and its gradient equals the index's up to rounding."""
    from rlvrlab.train.logprobs import _RepeatRows
    from rlvrlab.train.packing import shared_cache_ratio

    model = _model().train()
    logp, _ = logp_and_entropy(model, _grouped_batch(), temperature=1.0, prompt_cache=shared_cache_ratio(model.config))
    nodes = _graph_nodes(logp)
    assert "_RepeatRowsBackward" in nodes
    assert not nodes & {"IndexBackward0", "IndexSelectBackward0", "IndexPutBackward0", "IndexAddBackward0"}
    x = torch.randn(3, 2, 4, requires_grad=True)
    inverse, weights = torch.tensor([2, 0, 2, 1, 2]), torch.randn(5, 2, 4)
    (_RepeatRows.apply(x, inverse) * weights).sum().backward()
    assert torch.allclose(x.grad, torch.stack([weights[inverse == j].sum(0) for j in range(3)]), atol=1e-6)


def test_a_shared_prompt_forward_runs_each_distinct_prompt_once_where_that_keeps_less():
    """Each distinct prompt runs once where the shared pass keeps less than the plain one (`pass_tokens`): on this
    model's cache charge (~0.1 a position) the batch shares; a lone row, and the batch at a charge of 1 a
    position (the shared pass would keep more), run plain."""
    from rlvrlab.train.packing import pass_tokens, shared_cache_ratio

    model = _model()
    cache = shared_cache_ratio(model.config)
    assert 0.05 < cache < 0.15 and pass_tokens(4, 11, 5, 6, 1.0) == 11 * (5 + 6) > pass_tokens(4, 11, 5, 6, cache)
    batch = _grouped_batch()
    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)),
                                                 with_kwargs=True)
    with torch.no_grad():
        logp_and_entropy(model, batch, temperature=1.0, prompt_cache=cache)
        logp_and_entropy(model, batch.rows(slice(0, 1)), temperature=1.0, prompt_cache=cache)  # one row: plain
        logp_and_entropy(model, batch, temperature=1.0, prompt_cache=1.0)  # sharing would keep more: plain
    hook.remove()
    assert seen == [(4, 5), (11, 5), (1, 5 + 3), (11, 5 + 6)]  # 4 prompts of <= 5 tokens; 11 rows of the
    # 6-token responses less their last token; a lone row runs whole, cut to its own width (5 + 3); the batch whole
