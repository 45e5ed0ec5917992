"""A batch's micro-batches (one forward/backward each): consecutive rows, or rows packed by a token budget (sorted
by length, or with shared prompts first fit), each given as the LongTensor of its row indices; what a pass keeps for
backward, which the packing charges; and the split that gives every data-parallel rank the same count."""

from __future__ import annotations

import torch

from rlvrlab.train.batch import RolloutBatch, prompt_lengths


def split_rows(size: int, width: int) -> list[torch.Tensor]:
    """Consecutive runs of at most `width` row indices (micro-batches)."""
    return [torch.arange(i, min(i + width, size), dtype=torch.long) for i in range(0, size, width)]


def micro_batches(batch: RolloutBatch, *, rows: int, tokens: int | None,
                  prompt_cache: float | None = None) -> list[torch.Tensor]:
    """The micro-batches of `batch` (one forward/backward each), as LongTensors of row indices: consecutive runs of
    `rows` rows (split_rows); or, with a token budget (trainer.micro_batch_tokens), the rows sorted by length (prompt
    plus response, stable) and packed in that order while rows x (their longest prompt + their longest response),
    the padded size of the micro-batch cut to its own longest row (logprobs.own_width), stays within `tokens`. A row
    longer than the budget is a micro-batch of its own. As verl's use_dynamic_bsz: with losses normalised by the
    mini-batch's counts (Aggregation) the sum over micro-batches is the same loss, whatever the grouping.

    prompt_cache: the forward shares each distinct prompt among its rows (trainer.share_prompt,
    `logprobs._shared_prompt_logits`); the value is the size of one position of the repeated KV cache relative to
    one token's activations (`shared_cache_ratio`). Then the budget counts what a pass computes and keeps
    (`pass_tokens`), and rows go in prompt by prompt (`_pack_shared`), so that a prompt runs in as few
    passes as possible."""
    if tokens is None:
        return split_rows(len(batch), rows)
    prompt = prompt_lengths(batch).tolist()
    response = batch.mask.sum(-1).long().tolist()
    if prompt_cache is not None:
        return _pack_shared(prompt_keys(batch), prompt, response, tokens, prompt_cache)
    order = sorted(range(len(batch)), key=lambda r: prompt[r] + response[r])
    parts: list[list[int]] = []
    width_p = width_t = 0
    for r in order:
        p, t = max(width_p, prompt[r]), max(width_t, response[r], 1)
        if parts and (len(parts[-1]) + 1) * (p + t) <= tokens:
            parts[-1].append(r)
            width_p, width_t = p, t
        else:
            parts.append([r])
            width_p, width_t = prompt[r], max(response[r], 1)
    return [torch.tensor(part, dtype=torch.long) for part in parts]


def _pack_shared(keys: list[int], prompt: list[int], response: list[int], tokens: int,
                 cache: float) -> list[torch.Tensor]:
    """micro_batches with shared prompts: first fit, longest first. Prompts in the order of their longest row
    (prompt plus response, longest first), each prompt's rows longest first; each row goes into the first pass it
    fits in by `pass_tokens`, else opens a new one. The first row of a pass sets its widths, so shorter
    groups fill the passes the long ones opened, and a prompt's rows stay together unless a pass is full."""
    longest: dict[int, int] = {}
    for r, key in enumerate(keys):
        longest[key] = max(longest.get(key, 0), prompt[r] + response[r])
    order = sorted(range(len(keys)), key=lambda r: (-longest[keys[r]], keys[r], -(prompt[r] + response[r]), r))
    parts: list[list[int]] = []
    shapes: list[tuple[set[int], int, int]] = []  # per pass: its distinct prompts, prompt width, response width
    for r in order:
        for i, (distinct, width_p, width_t) in enumerate(shapes):
            p, t = max(width_p, prompt[r]), max(width_t, response[r], 1)
            if pass_tokens(len(distinct | {keys[r]}), len(parts[i]) + 1, p, t, cache) <= tokens:
                parts[i].append(r)
                distinct.add(keys[r])
                shapes[i] = (distinct, p, t)
                break
        else:
            parts.append([r])
            shapes.append(({keys[r]}, prompt[r], max(response[r], 1)))
    return [torch.tensor(sorted(part), dtype=torch.long) for part in parts]


def pass_tokens(prompts: int, rows: int, prompt_width: int, response_width: int, cache: float) -> float:
    """What a pass of `rows` rows with `prompts` distinct prompts keeps for backward, in token positions: the plain
    forward's rows x (prompt_width + response_width), or the shared one's (`shared_pass_tokens`) where that is
    less; the forward takes the same choice (`shares`)."""
    plain = rows * (prompt_width + response_width)
    if not shares(prompts, rows, prompt_width, response_width, cache):
        return plain
    return shared_pass_tokens(prompts, rows, prompt_width, response_width, cache)


def shares(prompts: int, rows: int, prompt_width: int, response_width: int, cache: float) -> bool:
    """Whether a pass shares its prompts: it does where that keeps less than the plain forward."""
    plain = rows * (prompt_width + response_width)
    return prompts < rows and shared_pass_tokens(prompts, rows, prompt_width, response_width, cache) < plain


def shared_pass_tokens(prompts: int, rows: int, prompt_width: int, response_width: int, cache: float) -> float:
    """The token positions a pass with shared prompts computes and keeps for backward, in units of one token's
    activations: each distinct prompt once (prompts x prompt_width), every row's response (rows x response_width),
    and the keys and values the responses attend to, the prompt's cache repeated per row and the response's own
    (rows x (prompt_width + response_width) positions of `cache` token-activations each)."""
    return prompts * prompt_width + rows * response_width + cache * rows * (prompt_width + response_width)


def prompt_keys(batch: RolloutBatch) -> list[int]:
    """[B] one integer per distinct prompt (its tokens with their left padding, as `logprobs._shared_prompt_logits`
    tells them apart): rows with equal keys share a prompt."""
    return distinct_prompts(batch)[1].tolist()


def distinct_prompts(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct prompts [D, 2P], each row's index into them [B]): a prompt is its tokens with their left
    padding."""
    p = batch.prompt_width
    rows = torch.cat([batch.input_ids[:, :p], batch.attention_mask[:, :p]], dim=1)
    return torch.unique(rows, dim=0, return_inverse=True)


def shared_cache_ratio(config) -> float | None:
    """One position of the repeated KV cache (keys and values of every layer) relative to one token's activations
    as rlvrlab.config.memory counts them, for a transformers config (Llama / Qwen2 / Qwen3 / Mistral names); None
    for a config without those numbers (then prompts are not shared: their cost could not be charged)."""
    from rlvrlab.config.memory import Architecture

    names = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "head_dim", "vocab_size", "tie_word_embeddings")
    try:
        arch = Architecture.from_hf({name: getattr(config, name, None) for name in names})
        return 2 * arch.kv_heads * arch.head_dim / arch.layer_activation_elements()
    except (TypeError, ValueError):  # a number is missing (None)
        return None


def packing_budget(batch: RolloutBatch, rows: int, max_new_tokens: int) -> int:
    """trainer.pack_by_length's budget: `rows` rows at `batch`'s longest prompt plus rollout.max_new_tokens, the
    padded size of a micro-batch of `rows` rows of these prompts whose responses ran to the cap: what the run must
    have memory for anyway (the first batch with long responses needs it), and the largest micro-batch TRL's
    GRPOTrainer can run at the same settings. Packed to it, short rows share fewer passes."""
    return rows * (int(prompt_lengths(batch).max()) + max_new_tokens)


def split_to(parts: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """`parts` split until there are `count` of them: the part with the most rows (the first of equals) into two
    halves, in place, so each part keeps its rows' length order and stays within the budget it was packed to.
    Ranks of one data-parallel step need the same number of backward passes (DeepSpeed reduces gradients in
    them); count at most the number of rows."""
    parts = list(parts)
    if count > sum(len(part) for part in parts):
        raise ValueError(f"cannot split {sum(len(part) for part in parts)} rows into {count} micro-batches")
    while len(parts) < count:
        widest = max(range(len(parts)), key=lambda i: (len(parts[i]), -i))
        part = parts[widest]
        half = (len(part) + 1) // 2
        parts[widest:widest + 1] = [part[:half], part[half:]]
    return parts


def row_order(parts: list[torch.Tensor], size: int) -> torch.Tensor | None:
    """The permutation that puts results concatenated over `parts` back in batch order (None: already in order:
    consecutive runs, as micro_batches gives them without a token budget)."""
    taken = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    order = torch.arange(size)
    if torch.equal(taken, order):
        return None
    inverse = torch.empty(size, dtype=torch.long)
    inverse[taken] = order
    return inverse
