"""Teacher-forced probabilities of listed responses: the exact metrics of tasks whose correct set can be listed.

`response_logprobs(model, prompts, responses, ...)` returns, for every prompt, the log-probability the policy gives
each listed response followed by the end-of-sequence token, at the sampling temperature: the probability that a
sampled response is exactly that text (rlvrlab.algorithms.passk.exact_metrics turns these into pass@k, q over the
correct set, H(q) and coverage@k). This is exact when each listed text has exactly one token sequence, which
`single_tokenization` checks against the tokenizer's vocabulary once (pairs: every response is characters with
no merge between them). Responses cut at max_new_tokens without the end token are not counted; the tests compare
the exact values with sampled estimates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def single_tokenization(tokenizer, texts: Sequence[str]) -> str | None:
    """None when each text has one token sequence only: no vocabulary token other than the text's own tokens
    decodes to a piece of any text. Else a one-line reason."""
    pieces = {t for text in texts for t in (text[i:j] for i in range(len(text)) for j in range(i + 1, len(text) + 1))}
    own = {tokenizer.decode([i]) for text in texts for i in tokenizer(text, add_special_tokens=False)["input_ids"]}
    special = set(tokenizer.all_special_ids)
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        if text and text in pieces and text not in own:
            return f"token {token_id} ({text!r}) gives a listed response a second tokenization"
    return None


@torch.no_grad()
def response_logprobs(model: torch.nn.Module, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[str]],
                      *, tokenizer, eos_id: int, pad_id: int, temperature: float = 1.0,
                      batch_size: int = 256) -> list[torch.Tensor]:
    """For prompt i (token ids) and its listed responses (texts): log p(response tokens + eos | prompt) under the
    model at `temperature`, as a float64 tensor per prompt, in the order given."""
    rows: list[tuple[int, list[int], list[int]]] = []
    for i, (prompt, texts) in enumerate(zip(prompts, responses, strict=True)):
        for text in texts:
            rows.append((i, list(prompt), tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_id]))
    device = next(model.parameters()).device
    values: list[float] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            width = max(len(p) + len(r) for _, p, r in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            target = torch.zeros((len(chunk), width), dtype=torch.bool)
            for j, (_, p, r) in enumerate(chunk):  # left padding, as the rollout engines pad prompts
                n = len(p) + len(r)
                ids[j, width - n:] = torch.tensor(p + r)
                attention[j, width - n:] = 1
                target[j, width - len(r):] = True
            position = (attention.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids.to(device), attention_mask=attention.to(device),
                           position_ids=position.to(device)).logits.float()
            logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
            token = logp.gather(-1, ids[:, 1:].to(device).unsqueeze(-1)).squeeze(-1)
            values.extend((token * target[:, 1:].to(device)).sum(-1).double().cpu().tolist())
    finally:
        model.train(was_training)
    out: list[list[float]] = [[] for _ in prompts]
    for (i, _, _), value in zip(rows, values):
        out[i].append(value)
    return [torch.tensor(v, dtype=torch.float64) for v in out]
