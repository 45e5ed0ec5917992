"""The light default rollout engine: transformers `generate` on its own copy of the policy.

Behaviour log-probs come from the raw logits of each step (`output_logits=True`), not from the processed
scores: those are renormalised after temperature/top-p and would not be the policy's probabilities.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlvrlab.rollout.base import Generation


class HFEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, *, temperature: float, top_p: float, max_new_tokens: int):
        self.model = model.eval()  # a copy the trainer does not touch: weights move only in sync_weights
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, n: int, seed: int) -> list[list[Generation]]:
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # [P, L] left-pad
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=True,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=0,  # no hidden top-k: sample from the tempered (and top-p) distribution only
                max_new_tokens=self.max_new_tokens,
                num_return_sequences=n,
                eos_token_id=eos,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_logits=True,
            )
        new_tokens = out.sequences[:, width:]  # [P*n, T]
        logp = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # [P*n, T, V] raw, temperature 1
        token_logp = logp.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1).cpu()  # [P*n, T]
        new_tokens = new_tokens.cpu()
        result: list[list[Generation]] = [[] for _ in prompts]
        for row in range(new_tokens.shape[0]):
            ids = new_tokens[row].tolist()
            length = ids.index(eos) + 1 if eos in ids else len(ids)  # keep eos: the policy learns to stop
            prompt = prompts[row // n]
            text = self.tokenizer.decode(ids[:length], skip_special_tokens=True)
            result[row // n].append(
                Generation(tuple(prompt), tuple(ids[:length]), text, tuple(token_logp[row, :length].tolist()))
            )
        return result

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.model.load_state_dict(dict(named_tensors), strict=True)  # every tensor, tied ones included

    def sleep(self) -> None:
        pass  # shares memory with nothing worth freeing

    def close(self) -> None:
        self.model = None
