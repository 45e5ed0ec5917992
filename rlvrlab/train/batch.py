"""Rollouts -> padded tensors, and the trainer-side log-probs of a batch.

Layout of every batch (B rows = prompts x group_size):

    input_ids  [B, P + T]   prompt left-padded to width P, then the response right-padded to width T
    mask       [B, T]       1 on response tokens (eos included), 0 on padding
    the logits at positions P-1 .. P+T-2 predict the T response tokens.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, TypeGuard, TypeVar

import numpy as np
import torch

from rlvrlab.algorithms import entropy_from_logits
from rlvrlab.config.memory import ENTROPY_CHUNK_ELEMENTS
from rlvrlab.data.problems import Problem
from rlvrlab.rollout.base import Generation

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_R = TypeVar("_R", bound="Rows")


class Rows:
    """A dataclass of per-row fields that slices by rows: rows(index) takes the given rows of every tensor ([B, ...]),
    list ([B]) and nested Rows field; the others (widths, counters) stay. Micro- and mini-batches are made with it."""

    def __len__(self) -> int:
        raise NotImplementedError

    def rows(self: _R, index: torch.Tensor | slice) -> _R:
        """The sub-batch of the given rows; the batch itself for a slice of all its rows."""
        if isinstance(index, slice) and range(len(self))[index] == range(len(self)):
            return self
        ids = index.tolist() if isinstance(index, torch.Tensor) else range(len(self))[index]
        picked: dict[str, object] = {}
        for f in fields(self):  # type: ignore[arg-type]  # every subclass is a dataclass
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor | Rows):
                picked[f.name] = value[index] if isinstance(value, torch.Tensor) else value.rows(index)
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in ids]
        return replace(self, **picked)  # type: ignore[type-var]

    def to(self: _R, device: torch.device) -> _R:
        moved: dict[str, object] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor | Rows):
                moved[f.name] = value.to(device)
        return replace(self, **moved)  # type: ignore[type-var]


@dataclass(frozen=True)
class RolloutBatch(Rows):
    """What the rollout engine sampled, verified and collated (rlvrlab.train.rollouts.generate); never changed after."""

    input_ids: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    mask: torch.Tensor  # [B, T] response mask
    prompt_width: int  # P
    group_ids: list[str]  # [B]
    rewards: torch.Tensor  # [B]
    engine_logp: torch.Tensor  # [B, T] the rollout engine's raw log-probs
    texts: list[str]
    version: int  # policy version (optimizer steps taken) of the weights that generated it
    batch_index: int  # position in the data stream
    scores: torch.Tensor  # [B] the verifier's scores (rewards before overlong shaping)
    truncated: torch.Tensor  # [B] bool: cut at max_new_tokens without an end-of-sequence token
    generate_seconds: float = 0.0  # wall-clock time the rollout engine took for this batch
    generated_batches: int = 1  # rollout batches sampled to fill this one (DAPO's dynamic sampling)
    filled_groups: int = 0  # groups without signal that filled it after max_gen_batches

    def response_keys(self) -> list[tuple[int, ...]]:
        """[B] each row's response token ids: equal keys, the same response."""
        ids = self.input_ids[:, self.prompt_width:].tolist()
        lengths = self.mask.sum(-1).long().tolist()
        return [tuple(row[:n]) for row, n in zip(ids, lengths)]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass(frozen=True)
class TrainerLogp(Rows):
    """The trainer's log-probs of a batch's response tokens under the weights that sampled it."""

    behaviour: torch.Tensor  # [B, T] at rollout.temperature: the denominator of the policy ratio
    raw: torch.Tensor  # [B, T] at temperature 1: compared with the engine's (rollout/logp_gap_*, mismatch KL)
    entropy: torch.Tensor | None = None  # [B, T] the behaviour policy's token entropy; only Ent-Adv reads it

    def __len__(self) -> int:
        return self.behaviour.shape[0]


@dataclass(frozen=True)
class UpdateRows(Rows):
    """One step's rows as the policy update reads them: the sampled batch and what the step computed for it."""

    batch: RolloutBatch
    adv: torch.Tensor  # [B, T] advantages
    # [B, T] the behaviour log-probs; None exactly when the update's own forward gives them
    # (rlvrlab.train.rollouts.Behaviour.UPDATE_FORWARD)
    behaviour: torch.Tensor | None
    reference: torch.Tensor | None = None  # [B, T] reference-policy log-probs, when a KL term is used
    # verl's rollout correction (rlvrlab.train.optimize.correct_rollouts), when on:
    is_weights: torch.Tensor | None = None  # [B, T] importance weights (algorithm.tis_level), into every token's loss
    kept_mask: torch.Tensor | None = None  # [B, T] the response mask after rejection sampling (algorithm.rollout_rs)

    def __len__(self) -> int:
        return len(self.batch)

    def loss_mask(self, *, drop_truncated: bool) -> torch.Tensor:
        """[B, T] the tokens the loss is taken over: the response mask (after rejection sampling, when on), without
        truncated responses when asked (DAPO's overlong filtering)."""
        mask = self.batch.mask if self.kept_mask is None else self.kept_mask
        if not drop_truncated:
            return mask
        return mask * (~self.batch.truncated).to(mask.dtype).unsqueeze(-1)


@dataclass(frozen=True)
class Sampled:
    """A generated batch as it waits in the staleness queue."""

    batch: RolloutBatch
    # None exactly when the behaviour policy is the update's forward (rlvrlab.train.rollouts.Behaviour)
    trainer: TrainerLogp | None
    reference: torch.Tensor | None  # [B, T] the reference policy's log-probs, when algorithm.kl_coef > 0


def collate(groups: list[list[Generation]], group_ids: list[str], rewards: list[float], *, pad_id: int,
            version: int, batch_index: int, scores: list[float] | None = None,
            truncated: list[bool] | None = None) -> RolloutBatch:
    """Flatten [prompt][sample] generations into one padded batch; rewards (and scores, truncation flags) are per
    response, same order."""
    flat = [g for group in groups for g in group]
    ids = [gid for gid, group in zip(group_ids, groups) for _ in group]
    width_p = max(len(g.prompt_ids) for g in flat)
    width_t = max(max(len(g.response_ids) for g in flat), 1)
    tokens, attention, mask, engine_logp = [], [], [], []  # padded rows as lists: one tensor each, not 5 per row
    for g in flat:
        p, t = len(g.prompt_ids), len(g.response_ids)
        tokens.append([pad_id] * (width_p - p) + [*g.prompt_ids, *g.response_ids] + [pad_id] * (width_t - t))
        attention.append([0] * (width_p - p) + [1] * (p + t) + [0] * (width_t - t))
        mask.append([1.0] * t + [0.0] * (width_t - t))
        engine_logp.append([*g.logp] + [0.0] * (width_t - t))
    return RolloutBatch(
        input_ids=torch.tensor(tokens, dtype=torch.long),
        attention_mask=torch.tensor(attention, dtype=torch.long),
        mask=torch.tensor(mask, dtype=torch.float32),
        prompt_width=width_p,
        group_ids=ids,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        engine_logp=torch.tensor(engine_logp, dtype=torch.float32),
        texts=[g.text for g in flat],
        version=version,
        batch_index=batch_index,
        scores=torch.tensor(scores if scores is not None else rewards, dtype=torch.float32),
        truncated=torch.tensor(truncated if truncated is not None else [False] * len(flat), dtype=torch.bool),
    )


def token_logits(model: torch.nn.Module, batch: RolloutBatch, *, prompt_cache: float | None = None) -> torch.Tensor:
    """[B, T, V] logits that predict the response tokens (position ids follow the left padding, as generate).

    Only the last T+1 positions go through the LM head (`logits_to_keep`): with a long prompt (few-shot turns)
    and a large vocabulary the prompt's logits would cost most of the head's time and memory, for nothing.
    prompt_cache: rows with the same prompt (a group's responses) share one forward of it (`_shared_prompt_logits`)
    where that keeps less for backward than the plain forward (`pass_tokens`); the value is the repeated KV cache's
    charge per position (Run.shared_cache). None: every row runs its own prompt."""
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P+T]
    width = batch.input_ids.shape[1] - batch.prompt_width  # T
    if prompt_cache is not None and can_share_prompt(model):
        shared = _shared_prompt_logits(model, batch, position_ids, prompt_cache)
        if shared is not None:
            return shared
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids,
                logits_to_keep=width + 1)
    return out.logits[:, :-1].float()  # [B, T, V]: positions P-1 .. P+T-2


def can_share_prompt(model: torch.nn.Module) -> TypeGuard[PreTrainedModel]:
    """A transformers causal LM takes a KV cache in its forward; the toy policy (one table lookup) does not. Asked
    without importing transformers, which a toy run never loads (it would add ~1.5 s to each toy process)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    return modeling is not None and isinstance(model, modeling.PreTrainedModel)


def _shared_prompt_logits(model: PreTrainedModel, batch: RolloutBatch, position_ids: torch.Tensor,
                          charge: float) -> torch.Tensor | None:
    """token_logits with each distinct prompt of the batch run once: its forward fills a KV cache (with the graph,
    for backward), the cache's rows are repeated for the rows that share the prompt (`_RepeatRows`, whose backward
    sums their gradients in a fixed order), and the responses run on top of it, as the sampling loop does. The prompt's
    last position predicts the first response token. Equal to one forward over every row up to float rounding
    (tests/train/test_batch.py). None when sharing would keep more than the plain forward (`pass_tokens`): every
    row has its own prompt, or too few rows share one to pay for the repeated cache."""
    from transformers import DynamicCache, DynamicLayer

    p = batch.prompt_width
    distinct, inverse = _distinct_prompts(batch)
    width = batch.input_ids.shape[1] - p  # T
    if not shares(len(distinct), len(batch), p, width, charge):
        return None
    first: dict[int, int] = {}
    for row, which in enumerate(inverse.tolist()):
        first.setdefault(which, row)
    heads = torch.tensor([first[which] for which in range(len(distinct))])
    cache = DynamicCache(config=model.config)
    # layers that hold keys and values only (full or sliding-window attention); a linear-attention layer's states
    # (conv_states, recurrent_states) are not repeated here, so such a model takes the plain forward
    layers = [layer for layer in cache.layers
              if isinstance(layer, DynamicLayer) and not hasattr(layer, "recurrent_states")]
    if len(layers) != len(cache.layers):
        return None
    prompt_logits = model(input_ids=batch.input_ids[heads, :p], attention_mask=batch.attention_mask[heads, :p],
                          position_ids=position_ids[heads, :p], past_key_values=cache, use_cache=True,
                          logits_to_keep=1).logits  # [D, 1, V]: predicts response token 0
    prompt_logits = _RepeatRows.apply(prompt_logits, inverse)  # [B, 1, V]
    if width == 1:
        return prompt_logits.float()
    for layer in layers:  # DynamicCache.batch_select_indices, with a deterministic backward
        layer.keys, layer.values = _RepeatRows.apply(layer.keys, inverse), _RepeatRows.apply(layer.values, inverse)
    end = p + width - 1  # the last response token predicts nothing
    out = model(input_ids=batch.input_ids[:, p:end], attention_mask=batch.attention_mask[:, :end],
                position_ids=position_ids[:, p:end], past_key_values=cache, use_cache=True)
    return torch.cat([prompt_logits, out.logits], dim=1).float()  # [B, T, V]


class _RepeatRows(torch.autograd.Function):
    """x[inverse] along dim 0 (each of x's rows repeated for the rows that share it), whose backward sums each row's
    copies as one matrix product with a fixed order. Indexing's own backward (index_put_ with accumulate) adds them
    in whatever order its threads run: with 2 torch threads and another busy process, 40 backward passes of the same
    shared forward gave 3-4 different gradients in the last bits (the plain forward gave 1), and a resumed run no
    longer matched its uninterrupted twin (tests/train/test_train_tiny.py)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.sources = x.shape[0]
        return x.index_select(0, inverse)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        rows = torch.arange(len(inverse), device=inverse.device)
        onehot = torch.zeros(ctx.sources, len(inverse), dtype=grad.dtype, device=grad.device)
        onehot[inverse, rows] = 1.0
        summed = onehot @ grad.reshape(len(inverse), -1)  # [D, B] x [B, rest]
        return summed.view(ctx.sources, *grad.shape[1:]), None


def own_width(batch: RolloutBatch) -> RolloutBatch:
    """The batch cut to its own longest row: leading prompt columns that are padding in every row and response
    columns past the longest response are dropped (a micro-batch of short rows no longer pays for the whole step's
    longest one). Position ids follow the attention mask, so every kept token sees the same inputs."""
    width_p = batch.prompt_width
    used = batch.attention_mask[:, :width_p].sum(0) > 0  # [P] prompt columns some row uses
    start = int(used.nonzero()[0]) if bool(used.any()) else width_p
    t = max(int(batch.mask.sum(-1).max()), 1) if len(batch) else 1
    if start == 0 and t == batch.mask.shape[1]:
        return batch
    end = width_p + t
    return replace(batch, input_ids=batch.input_ids[:, start:end], attention_mask=batch.attention_mask[:, start:end],
                   mask=batch.mask[:, :t], prompt_width=width_p - start)


def logp_and_entropy(model: torch.nn.Module, batch: RolloutBatch, *, temperature: float,
                     with_entropy: bool = True, entropy_grad: bool = False,
                     prompt_cache: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, T] of the response under logits / temperature, and their entropy [B, T].

    The forward runs on the batch cut to its own longest row (own_width); the results are padded back to T with
    zeros. The entropy is computed outside the autograd graph, in pieces (logged_entropy), unless entropy_grad (an
    entropy term in the loss): when it is only logged, its [B, T, V] intermediates are not kept for backward."""
    width = batch.mask.shape[1]
    cut = own_width(batch)
    logits = token_logits(model, cut, prompt_cache=prompt_cache)  # [B, t, V]
    if temperature != 1.0:  # x / 1.0 is x: no op (and no autograd node) for it
        logits = logits / temperature
    targets = cut.input_ids[:, cut.prompt_width :]  # [B, t]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) * cut.mask
    entropy = None
    if with_entropy:
        in_loss = entropy_grad and torch.is_grad_enabled()  # in one piece: its tensors are kept for backward anyway
        entropy = _padded((entropy_from_logits(logits) if in_loss else logged_entropy(logits)) * cut.mask, width)
    return _padded(logp, width), entropy


@torch.no_grad()
def logged_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[B, t] token entropy of [B, t, V] logits outside autograd, ENTROPY_CHUNK_ELEMENTS logits at a time: in one
    piece its two fp32 temporaries of [B, t, V] would come on top of the logits the pass keeps for backward (the
    memory estimate counts one piece's). Equal to entropy_from_logits of the whole up to float rounding."""
    b, t, v = logits.shape
    per = max(1, ENTROPY_CHUNK_ELEMENTS // v)  # positions per piece
    if t <= per:  # whole rows, per // t of them a piece
        rows = per // t
        return torch.cat([entropy_from_logits(logits[i:i + rows]) for i in range(0, b, rows)])
    return torch.stack([torch.cat([entropy_from_logits(piece) for piece in row.split(per)]) for row in logits])


def _padded(values: torch.Tensor, width: int) -> torch.Tensor:
    """[B, t] zero-padded on the right to [B, width] (itself when t = width)."""
    return values if values.shape[1] == width else torch.nn.functional.pad(values, (0, width - values.shape[1]))


def stream_problems(problems: list[Problem], *, seed: int, batch_index: int, per_batch: int, rank: int,
                    world: int) -> list[Problem]:
    """This rank's prompts of batch `batch_index` in an endless stream of seeded permutations of `problems`
    (epoch e is permutation (seed, e)); rank r of w takes prompts r::w, whole groups."""
    picked, n = [], len(problems)
    for epoch, positions in itertools.groupby(range(batch_index * per_batch, (batch_index + 1) * per_batch),
                                              key=lambda position: position // n):
        order = _permutation(seed, epoch, n)
        picked += [problems[order[position - epoch * n]] for position in positions]
    return picked[rank::world]


_PERMUTATIONS: dict[tuple[int, int, int], np.ndarray] = {}  # one entry: the current epoch's order


def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    if (seed, epoch, n) not in _PERMUTATIONS:
        _PERMUTATIONS.clear()
        _PERMUTATIONS[(seed, epoch, n)] = np.random.default_rng([seed, epoch]).permutation(n)
    return _PERMUTATIONS[(seed, epoch, n)]


def shuffled_rows(size: int, *, seed: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(list(seed)).permutation(size))


def split_rows(size: int, width: int) -> list[slice]:
    """Consecutive slices of at most `width` rows (micro-batches)."""
    return [slice(i, min(i + width, size)) for i in range(0, size, width)]


def micro_batches(batch: RolloutBatch, *, rows: int, tokens: int | None,
                  prompt_cache: float | None = None) -> list[slice] | list[torch.Tensor]:
    """The micro-batches of `batch` (one forward/backward each): consecutive slices of `rows` rows; or, with a
    token budget (trainer.micro_batch_tokens), LongTensors of row indices: the rows sorted by length (prompt plus
    response, stable) and packed in that order while rows x (their longest prompt + their longest response), the
    padded size of the micro-batch cut to its own longest row (own_width), stays within `tokens`. A row longer than
    the budget is a micro-batch of its own. As verl's use_dynamic_bsz: with losses normalised by the mini-batch's
    counts (Aggregation) the sum over micro-batches is the same loss, whatever the grouping.

    prompt_cache: the forward shares each distinct prompt among its rows (trainer.share_prompt,
    `_shared_prompt_logits`); the value is the size of one position of the repeated KV cache relative to one
    token's activations (`shared_cache_ratio`). Then the budget counts what a pass computes and keeps
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
    """[B] one integer per distinct prompt (its tokens with their left padding, as `_shared_prompt_logits` tells
    them apart): rows with equal keys share a prompt."""
    return _distinct_prompts(batch)[1].tolist()


def _distinct_prompts(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
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


def prompt_lengths(batch: RolloutBatch) -> torch.Tensor:
    """Each row's prompt tokens (its padding left out)."""
    return batch.attention_mask[:, :batch.prompt_width].sum(-1)


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


def row_order(parts: Sequence[slice | torch.Tensor], size: int) -> torch.Tensor | None:
    """The permutation that puts results concatenated over `parts` back in batch order (None: already in order:
    consecutive slices, as micro_batches gives them without a token budget)."""
    indices = [part for part in parts if isinstance(part, torch.Tensor)]
    if not indices:
        return None
    inverse = torch.empty(size, dtype=torch.long)
    inverse[torch.cat(indices)] = torch.arange(size)
    return inverse
