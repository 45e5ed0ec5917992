"""LoRA adapters through peft (model.lora): the trainer's model with rank-r adapters on its linear layers, the base
frozen; and the one function that turns the trainer's weights into the base model's merged weights.

The update engine trains the transformers model itself, its target layers replaced by peft's `lora.Linear` (peft's
`get_peft_model` injects them in place; PeftModel.get_base_model() is that model), so everything that asks for a
transformers model (the shared-prompt forward, gradient checkpointing) works as without adapters. Its state dict
names a target layer's weight `<layer>.base_layer.weight` beside `<layer>.lora_A.default.weight` and
`<layer>.lora_B.default.weight`.

Rollout engines get MERGED weights under the base model's names, W + (alpha / r) · B · A (`merged_weights`), for
both engines: vLLM's own LoRA support would need a LoRARequest with every generate call, max_lora_rank and
enable_lora in its engine arguments and an adapter folder written per sync, where merged weights keep one sync path
(reload_weights) and its sleep/wake as they are; the hf engine samples from a plain copy of the base model, as fast
as without adapters. The reference policy of a KL term is the frozen base itself: the trained model's forward with
its adapters switched off (peft's disable_adapter), so no second copy of the weights is held.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from rlvrlab.errors import RlvrlabError

ADAPTER = "adapter"  # the adapter's folder inside a checkpoint's model folder (peft's save_pretrained layout)
_BASE, _A, _B = ".base_layer.", ".lora_A.default.weight", ".lora_B.default.weight"


def with_adapters(model: torch.nn.Module, *, r: int, alpha: float, dropout: float, target_modules: list[str]) -> Any:
    """peft's PeftModel over `model` (a transformers causal LM), adapters of rank r on target_modules, every base
    weight frozen (requires_grad False), in eval mode. A target that peft does not wrap as a plain linear layer
    (an embedding, GPT-2's Conv1D) is refused: merged_weights merges linear layers only."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import Linear

    targets: str | list[str] = "all-linear" if list(target_modules) == ["all-linear"] else list(target_modules)
    # peft annotates lora_alpha as int; a float scales as alpha / r all the same (peft's own scaling)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,  # type: ignore[arg-type]
                        bias="none", task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as error:
        raise RlvrlabError(f"model.lora.target_modules={list(target_modules)}: {str(error).splitlines()[0]}; name "
                           "linear layers of the model (e.g. [q_proj,v_proj]) or [all-linear]") from None
    adapted = {name: m for name, m in peft_model.named_modules() if hasattr(m, "lora_A")}
    other = [name for name, m in adapted.items() if not isinstance(m, Linear) or m.fan_in_fan_out]
    if other:
        raise RlvrlabError(f"model.lora.target_modules: {other[0]} is not a linear layer (torch.nn.Linear), which "
                           "is all rlvrlab merges into the rollout weights; name linear layers only")
    return peft_model.eval()


def trainable_parameters(model: torch.nn.Module) -> int:
    """How many weights the update trains (the adapters' under LoRA)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merged_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float,
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's weights (the adapted model's state dict entries, in its order) -> the base model's, under its
    own names: each target layer's weight W + scaling · (B @ A) (peft's own merge, in W's dtype), its bias as is,
    every other entry unchanged. Streams: a layer's base weight waits only for its A and B, which follow it in the
    state dict, so under ZeRO-3 (one gathered parameter at a time) at most one layer's tensors are held."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        if _BASE in name:
            layer, _, leaf = name.rpartition(_BASE)
            if leaf != "weight":
                yield f"{layer}.{leaf}", tensor
                continue
            part = "W"
        elif name.endswith(_A) or name.endswith(_B):
            layer, part = name[: -len(_A)], "A" if name.endswith(_A) else "B"
        else:
            yield name, tensor
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[layer]
            w, a, b = parts["W"], parts["A"], parts["B"]
            yield f"{layer}.weight", w + (b.to(w.dtype) @ a.to(w.dtype)) * scaling
    if pending:
        raise RuntimeError(f"adapted layer {next(iter(pending))} lacks its base weight, lora_A or lora_B")


class NoAdapters(torch.nn.Module):
    """The reference policy under LoRA: the adapted model's forward with its adapters switched off, i.e. the frozen
    base. It holds the peft model outside its own parameters (no weights of its own to move or count)."""

    _peft: Any

    def __init__(self, peft_model: Any):
        super().__init__()
        object.__setattr__(self, "_peft", peft_model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        context: AbstractContextManager = self._peft.disable_adapter()
        with context:
            return self._peft.get_base_model()(*args, **kwargs)


class MergedSync:
    """A rollout engine whose sync_weights takes the adapted model's weights and loads them merged
    (merged_weights); everything else is the wrapped engine's."""

    def __init__(self, engine: Any, scaling: float):
        self.engine = engine
        self.scaling = scaling

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.sync_weights(merged_weights(named_tensors, self.scaling))

    def generate(self, prompts: list[list[int]], *, n: int, seed: int) -> Any:
        return self.engine.generate(prompts, n=n, seed=seed)

    def sleep(self, *, keep_weights: bool = True) -> None:
        self.engine.sleep(keep_weights=keep_weights)

    def close(self) -> None:
        self.engine.close()

    def __getattr__(self, name: str) -> Any:  # the wrapped engine's own attributes (its model, its vLLM engine)
        return getattr(self.engine, name)


def save(peft_model: Any, module: Any, folder: Path, state: dict | None) -> None:
    """Write the merged model (a plain transformers folder: eval, `rlvrlab model import` and vLLM load it as
    any) to `folder` and the adapter alone (peft's adapter_model.safetensors + adapter_config.json, loadable with
    PeftModel.from_pretrained on the base) to folder/adapter. state: the adapted model's full state dict where
    the module's own is sharded (ZeRO-3)."""
    state = state if state is not None else module.state_dict()
    scaling = lora_scaling(peft_model)
    module.save_pretrained(folder, safe_serialization=True, state_dict=dict(merged_weights(state.items(), scaling)))
    peft_model.save_pretrained(folder / ADAPTER, state_dict={f"base_model.model.{k}": v for k, v in state.items()})


def lora_scaling(peft_model: Any) -> float:
    """alpha / r of the model's one adapter (peft's scaling without rsLoRA)."""
    config = peft_model.peft_config["default"]
    return float(config.lora_alpha) / float(config.r)
