"""LoRA adapters on a frozen base for the built-in trainer (``semantics.peft``).

Megatron-Core has no PEFT of its own (Megatron-Bridge's ``megatron.bridge.peft.lora`` and
NeMo's ``llm.peft.LoRA`` add it); this is dse's own small equivalent for the CPU trainer,
with Bridge's semantics: every base parameter frozen, an adapter ``B(A(dropout(x))) *
alpha / dim`` added to the output of each target linear (``linear_qkv``, ``linear_proj``,
``linear_fc1``, ``linear_fc2``, matched by the last part of the module's name, experts'
linears included), ``A`` drawn by Xavier-uniform from a seed of the study and the module's
name in its model chunk, ``B`` zero (so step 0's loss is the base model's).

What it cannot do, refused before the model is built (:func:`lora_refusal`): tensor
parallelism (the adapters here are not sharded over TP; Bridge's ``ParallelLinearAdapter``
is), grouped-GEMM experts (their weights are not per-expert linears) and hybrid (Mamba)
models.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["apply_lora", "lora_refusal", "LoraLinear"]


def lora_refusal(peft: Any, tp: int, grouped_gemm: bool, hybrid: bool) -> str | None:
    """Why the built-in trainer cannot train these adapters (None: it can)."""
    if peft is None:
        return None
    if tp > 1:
        return (
            "the built-in trainer's LoRA adapters are not tensor-parallel (TP 1 only; "
            f"tensor_model_parallel_size={tp}); Megatron-Bridge's are"
        )
    if grouped_gemm and {"linear_fc1", "linear_fc2"} & set(peft.target_modules):
        return (
            "the built-in trainer's LoRA adapters wrap per-expert linears; grouped-GEMM "
            "experts (moe_grouped_gemm) have none"
        )
    if hybrid:
        return "the built-in trainer's LoRA adapters are for GPT models, not hybrid (Mamba) ones"
    return None


def _seed(base: int, name: str) -> int:
    digest = hashlib.sha256(f"{base}:lora:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _lora_class() -> Any:
    import torch

    class LoraLinear(torch.nn.Module):  # type: ignore[misc]
        """A Megatron linear (returns ``(output, bias)``) with a LoRA adapter beside it."""

        def __init__(self, base: Any, dim: int, alpha: int, dropout: float, seed: int) -> None:
            super().__init__()
            self.base = base
            n_out, n_in = base.weight.shape
            gen = torch.Generator().manual_seed(seed)
            a = torch.empty(dim, n_in, dtype=torch.float32)
            bound = (6.0 / (n_in + dim)) ** 0.5  # Xavier-uniform (Bridge's default for A)
            a.uniform_(-bound, bound, generator=gen)
            dtype, device = base.weight.dtype, base.weight.device
            self.lora_a = torch.nn.Parameter(a.to(dtype=dtype, device=device))
            self.lora_b = torch.nn.Parameter(torch.zeros(n_out, dim, dtype=dtype, device=device))
            self.scale = alpha / dim
            self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()

        def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
            out, bias = self.base(x, *args, **kwargs)
            f = torch.nn.functional
            low = f.linear(f.linear(self.dropout(x), self.lora_a), self.lora_b)
            return out + low * self.scale, bias

    return LoraLinear


def LoraLinear(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - a class made on first use
    return _lora_class()(*args, **kwargs)


def apply_lora(chunk: Any, peft: Any, seed: int) -> tuple[int, int]:
    """Freeze every parameter of ``chunk`` and put an adapter beside each target linear.
    Returns (trained, frozen) parameter counts of the chunk."""
    for p in chunk.parameters():
        p.requires_grad_(False)
    targets = set(peft.target_modules)
    found = [
        (name, mod)
        for name, mod in chunk.named_modules()
        if name.rsplit(".", 1)[-1] in targets and hasattr(mod, "weight")
    ]
    for name, mod in found:
        parent_name, _, child = name.rpartition(".")
        parent = chunk.get_submodule(parent_name) if parent_name else chunk
        adapter = LoraLinear(mod, peft.dim, peft.alpha, peft.dropout, _seed(seed, name))
        setattr(parent, child, adapter)
    trained = sum(p.numel() for p in chunk.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in chunk.parameters() if not p.requires_grad)
    return trained, frozen
