"""The trainer's log-probs of a batch's response tokens: one forward per micro-batch, cut to its own longest row,
with each distinct prompt run once where that keeps less for backward (the shared-prompt forward), and the token
entropy outside the graph when it is only logged.

Layout of every batch (rlvrlab.train.batch): input_ids [B, P + T], the prompt left-padded to width P, then the
response right-padded to width T; the logits at positions P-1 .. P+T-2 predict the T response tokens.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING, TypeGuard

import torch

from rlvrlab.algorithms import entropy_from_logits
from rlvrlab.config.memory import ENTROPY_CHUNK_ELEMENTS
from rlvrlab.train.batch import RolloutBatch
from rlvrlab.train.packing import distinct_prompts, shares

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def token_logits(model: torch.nn.Module, batch: RolloutBatch, *, prompt_cache: float | None = None) -> torch.Tensor:
    """[B, T, V] logits that predict the response tokens (position ids follow the left padding, as generate).

    Only the last T+1 positions go through the LM head (`logits_to_keep`): with a long prompt (few-shot turns)
    and a large vocabulary the prompt's logits would cost most of the head's time and memory, for nothing.
    prompt_cache: rows with the same prompt (a group's responses) share one forward of it (`_shared_prompt_logits`)
    where that keeps less for backward than the plain forward (`packing.pass_tokens`); the value is the repeated KV
    cache's charge per position (Run.shared_cache). None: every row runs its own prompt."""
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
    (tests/train/test_batch.py). None when sharing would keep more than the plain forward (`packing.pass_tokens`): every
    row has its own prompt, or too few rows share one to pay for the repeated cache."""
    from transformers import DynamicCache, DynamicLayer

    p = batch.prompt_width
    distinct, inverse = distinct_prompts(batch)
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
