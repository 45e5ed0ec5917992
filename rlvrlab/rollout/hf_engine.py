"""The light default rollout engine: a sampling loop over the transformers model on its own copy of the policy.

Why not `model.generate(num_return_sequences=n)`: it copies each prompt n times before the prefill and keeps
finished rows in the batch until the longest one stops, so with a few-shot prompt several times longer than the
answers the n-fold prefill dominates (this loop samples about 3x faster on SmolLM2-135M on CPU: bench/README.md,
"SmolLM2-135M-Instruct on CPU"). Here each prompt is prefilled once and its KV cache repeated n times
(`DynamicCache.batch_repeat_interleave`), and rows that emitted eos leave the cache (`batch_select_indices`).

Behaviour log-probs are those of the raw logits (temperature 1, no top-p), as `Generation` documents; the
sample itself is drawn from the tempered, top-p-filtered distribution. Left padding, so every row gets explicit
position ids (mask cumsum) and its attention mask.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Optional, cast

import torch

from rlvrlab.rollout.base import Generation

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def sample_next(logits: torch.Tensor, *, temperature: float, top_p: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] (raw, float32) -> (token [R], raw log-prob of that token [R]).

    Top-p keeps the smallest set of most likely tokens whose probability reaches top_p (the top token always)."""
    probs = torch.softmax(logits / temperature, dim=-1)  # [R, V]
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the strictly more likely tokens
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    token = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [R]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, token.unsqueeze(1)).squeeze(1)  # [R]
    return token, logp


class HFEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, *, temperature: float, top_p: float, max_new_tokens: int):
        # a transformers causal LM (components.load_model, or a copy of the trainer's), typed as the nn.Module it is
        # handed as; a copy the trainer does not touch: weights move only in sync_weights; None once closed
        self.model: Optional[PreTrainedModel] = cast("PreTrainedModel", model.eval())
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, n: int, seed: int) -> list[list[Generation]]:
        from transformers import DynamicCache

        model = self.model
        assert model is not None, "generate after close"
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        device = next(model.parameters()).device
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # [P, L] left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)  # [P, L]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [P, L]
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)

        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float().repeat_interleave(n, dim=0)  # [R, V], R = P*n, rows of a prompt adjacent
        cache.batch_repeat_interleave(n)
        mask = mask.repeat_interleave(n, dim=0)  # [R, L]
        next_pos = positions[:, -1].repeat_interleave(n) + 1  # [R]

        rows = len(prompts) * n
        tokens = torch.full((rows, self.max_new_tokens), pad, dtype=torch.long, device=device)  # [R, T]
        logps = torch.zeros((rows, self.max_new_tokens), device=device)  # [R, T]
        lengths = torch.zeros(rows, dtype=torch.long, device=device)  # [R]
        active = torch.arange(rows, device=device)  # rows still generating, in cache order
        for step in range(self.max_new_tokens):
            token, logp = sample_next(logits, temperature=self.temperature, top_p=self.top_p, generator=generator)
            tokens[active, step], logps[active, step], lengths[active] = token, logp, step + 1
            going = token != eos
            if step + 1 == self.max_new_tokens or not bool(going.any()):
                break
            if not bool(going.all()):
                keep = going.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                active, token, mask, next_pos = active[keep], token[keep], mask[keep], next_pos[keep]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = model(input_ids=token.unsqueeze(1), attention_mask=mask, position_ids=next_pos.unsqueeze(1),
                        past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1].float()
            next_pos = next_pos + 1

        tokens, logps, lengths = tokens.cpu(), logps.cpu(), lengths.cpu()
        result: list[list[Generation]] = [[] for _ in prompts]
        for row in range(rows):
            length = int(lengths[row])  # up to and including eos: the policy learns to stop
            ids_row = tokens[row, :length].tolist()
            text = self.tokenizer.decode(ids_row, skip_special_tokens=True)
            result[row // n].append(Generation(tuple(prompts[row // n]), tuple(ids_row), text,
                                               tuple(logps[row, :length].tolist())))
        return result

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        assert self.model is not None, "sync_weights after close"
        self.model.load_state_dict(dict(named_tensors), strict=True)  # every tensor, tied ones included

    def sleep(self, *, keep_weights: bool = True) -> None:
        pass  # shares memory with nothing worth freeing

    def close(self) -> None:
        self.model = None
