"""A step's rows as typed stages (the sampled batch, the trainer's log-probs, the rows an update reads), how they
are padded into one batch, and the data stream that picks each batch's prompts. The trainer's log-probs of a batch
are rlvrlab.train.logprobs'; its micro-batches, rlvrlab.train.packing's.

Layout of every batch (B rows = prompts x group_size):

    input_ids  [B, P + T]   prompt left-padded to width P, then the response right-padded to width T
    mask       [B, T]       1 on response tokens (eos included), 0 on padding
    the logits at positions P-1 .. P+T-2 predict the T response tokens.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, fields, replace
from typing import TypeVar

import numpy as np
import torch

from rlvrlab.data.problems import Problem
from rlvrlab.rollout.base import Generation

_R = TypeVar("_R", bound="Rows")


class Behaviour(enum.Enum):
    """Where the behaviour policy's log-probs (the denominator of the policy ratio) come from
    (rlvrlab.train.rollouts.behaviour_source chooses)."""

    SAMPLER_PASS = "a no-grad pass of the trainer's weights after sampling"
    UPDATE_FORWARD = "the update's own forward pass, detached"


class Rows:
    """A dataclass of per-row fields that slices by rows: rows(index) takes the given rows of every tensor ([B, ...]),
    list ([B]) and nested Rows field; the others (widths, counters) stay. Micro- and mini-batches are made with it."""

    def __len__(self) -> int:
        raise NotImplementedError

    def rows(self: _R, index: torch.Tensor | slice) -> _R:
        """The sub-batch of the given rows (a LongTensor of row indices or a slice); a run of consecutive indices is
        taken as their slice (views of the batch's tensors, no copy); the batch itself for all its rows in order."""
        if isinstance(index, torch.Tensor):
            index = _as_slice(index) or index
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


def _as_slice(index: torch.Tensor) -> slice | None:
    """The slice of a non-empty run of consecutive row indices (start, start + 1, ...); None for any other index."""
    if index.ndim != 1 or len(index) == 0:
        return None
    start = int(index[0])
    if not torch.equal(index, torch.arange(start, start + len(index), dtype=index.dtype, device=index.device)):
        return None
    return slice(start, start + len(index))


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
    source: Behaviour  # where the behaviour log-probs come from
    # [B, T] the behaviour log-probs of Behaviour.SAMPLER_PASS; UPDATE_FORWARD's are the update's own forward's
    behaviour: torch.Tensor | None = None
    reference: torch.Tensor | None = None  # [B, T] reference-policy log-probs, when a KL term is used
    # verl's rollout correction (rlvrlab.train.optimize.correct_rollouts), when on:
    is_weights: torch.Tensor | None = None  # [B, T] importance weights (algorithm.tis_level), into every token's loss
    kept_mask: torch.Tensor | None = None  # [B, T] the response mask after rejection sampling (algorithm.rollout_rs)

    def __post_init__(self) -> None:
        if (self.behaviour is not None) != (self.source is Behaviour.SAMPLER_PASS):
            raise ValueError(f"update rows of {self.source} {'take no' if self.behaviour is not None else 'need'} "
                             "behaviour log-probs")

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
    # the sampler pass's log-probs (Behaviour.SAMPLER_PASS); None for Behaviour.UPDATE_FORWARD, which has none yet
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


def prompt_lengths(batch: RolloutBatch) -> torch.Tensor:
    """Each row's prompt tokens (its padding left out)."""
    return batch.attention_mask[:, :batch.prompt_width].sum(-1)
