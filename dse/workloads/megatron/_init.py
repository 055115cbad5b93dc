"""Layout-invariant weight initialisation.

Megatron-Core initialises weights in construction order from one generator, so the same
layer gets different weights under different pipeline layouts (stage 1 starts its first
layer from the seed), and with GPU initialisation under different TP sizes too. A
loss-parity guard across execution knobs needs the same model in every layout, so after
the model chunks are built every parameter is re-initialised from its *global* identity:

* the key of a parameter is its name with local layer indices replaced by global layer
  numbers (``decoder.layers.3`` of a later pipeline stage is ``layers.7``) and local expert
  indices by global expert indices;
* the full (unsharded) tensor is drawn with Megatron's own ``config.init_method`` (or
  ``output_layer_init_method`` for the output projections of attention and MLP) from a
  generator seeded by ``(seed, key)``, on the parameter's device;
* this rank keeps its tensor-parallel slice exactly as Megatron's CPU initialisation splits a
  master weight (``partition_dim``, ``partition_stride``; the expert-TP group for experts).

Norm weights become ones (zeros with ``layernorm_zero_centered_gamma``) and biases zeros.
Padded vocabulary rows are drawn separately so that the real rows do not depend on the
padding (which depends on TP). When a parameter is not recognised (e.g. the grouped-GEMM
expert weights), nothing is changed and Megatron's own initialisation stays.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["init_layout_invariant", "param_key", "tp_slice"]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)\.")
_VOCAB_KEYS = ("word_embeddings", "output_layer")


@dataclass(frozen=True)
class _Entry:
    param: torch.nn.Parameter
    key: str
    kind: str  # normal | scaled | ones | zeros


def param_key(
    name: str, layer_numbers: dict[int, int], expert_offset: int, tied_output: bool
) -> str | None:
    """The global key of a GPTModel parameter name, or None when it is not recognised.

    ``layer_numbers`` maps local layer indices to Megatron's (1-based, global) layer
    numbers; ``expert_offset`` is the global index of this rank's first local expert.
    """
    if name == "embedding.word_embeddings.weight":
        return "word_embeddings"
    if name == "embedding.position_embeddings.weight":
        return "position_embeddings"
    if name == "output_layer.weight":
        return "word_embeddings" if tied_output else "output_layer"
    if name.startswith("decoder.final_layernorm."):
        return name.removeprefix("decoder.")
    m = _LAYER.match(name)
    if not m:
        return None
    local = int(m.group(1))
    if local not in layer_numbers:
        return None
    rest = name[m.end() :]
    if ".experts." in name:
        e = _EXPERT.search("." + rest)
        if e is None:
            return None  # grouped-GEMM experts (weight1/weight2): not recognised
        rest = (
            ("." + rest)[: e.start()]
            + f".experts.{expert_offset + int(e.group(1))}."
            + ("." + rest)[e.end() :]
        )
        rest = rest.lstrip(".")
    return f"layers.{layer_numbers[local]}.{rest}"


def _kind(key: str, param: torch.nn.Parameter) -> str:
    leaf = key.rsplit(".", 1)
    module, attr = (leaf[0], leaf[1]) if len(leaf) == 2 else ("", leaf[0])
    last = module.rsplit(".", 1)[-1]
    if attr == "bias":
        return "zeros"
    if "norm" in last:
        return "ones"
    if last in ("linear_proj", "linear_fc2"):
        return "scaled"
    if param.dim() >= 2 or key in ("word_embeddings", "output_layer", "position_embeddings"):
        return "normal"
    return "unknown"


def tp_slice(full: torch.Tensor, dim: int, stride: int, rank: int, size: int) -> torch.Tensor:
    """This rank's slice of ``full`` as Megatron splits a master weight: ``size * stride``
    equal pieces along ``dim``, rank ``r`` taking pieces ``r, r + size, ...``."""
    if size == 1:
        return full
    piece = full.shape[dim] // (size * stride)
    pieces = torch.split(full, piece, dim=dim)
    return torch.cat(pieces[rank::size], dim=dim)


def _seed_of(seed: int, key: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**62)


def _draw(init: Any, shape: tuple[int, ...], device: torch.device, seed: int) -> torch.Tensor:
    """Fill a new fp32 tensor with ``init`` from a generator seeded with ``seed``."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        torch.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(seed)
        out = torch.empty(shape, dtype=torch.float32, device=device)
        init(out)
    return out


def _entries(chunks: list[Any], config: Any) -> list[_Entry] | None:
    from megatron.core import parallel_state

    num_experts = getattr(config, "num_moe_experts", None)
    expert_offset = 0
    if num_experts:
        ep = parallel_state.get_expert_model_parallel_world_size()
        expert_offset = parallel_state.get_expert_model_parallel_rank() * (num_experts // ep)
    out: list[_Entry] = []
    for chunk in chunks:
        layer_numbers: dict[int, int] = {}
        layers = getattr(getattr(chunk, "decoder", None), "layers", None)
        for i, layer in enumerate(layers or []):
            layer_numbers[i] = int(layer.layer_number)
        tied = bool(getattr(chunk, "share_embeddings_and_output_weights", False))
        for name, p in chunk.named_parameters():
            key = param_key(name, layer_numbers, expert_offset, tied)
            if key is None:
                return None
            kind = _kind(key, p)
            if kind == "unknown":
                return None
            out.append(_Entry(p, key, kind))
    return out


@torch.no_grad()
def init_layout_invariant(
    chunks: list[Any], config: Any, seed: int, vocab_size: int | None = None
) -> str:
    """Re-initialise the parameters of GPTModel chunks by global identity (see module doc).

    ``vocab_size`` is the unpadded vocabulary: embedding/output rows past it are drawn
    separately.

    Returns ``"layout_invariant"``, or ``"megatron"`` when some parameter was not recognised
    and Megatron's initialisation was kept.
    """
    from megatron.core import parallel_state

    entries = _entries(chunks, config)
    if entries is None:
        return "megatron"
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    etp_size = parallel_state.get_expert_tensor_parallel_world_size()
    vocab = vocab_size
    for e in entries:
        p = e.param
        if e.kind == "zeros":
            p.zero_()
            continue
        if e.kind == "ones":
            p.fill_(0.0 if getattr(config, "layernorm_zero_centered_gamma", False) else 1.0)
            continue
        init = config.output_layer_init_method if e.kind == "scaled" else config.init_method
        sharded = bool(getattr(p, "tensor_model_parallel", False))
        dim = int(getattr(p, "partition_dim", 0)) if sharded else 0
        stride = int(getattr(p, "partition_stride", 1)) if sharded else 1
        expert = not getattr(p, "allreduce", True)
        rank, size = (etp_rank, etp_size) if expert else (tp_rank, tp_size)
        if not sharded:
            rank, size = 0, 1
        shape = list(p.shape)
        shape[dim] *= size
        if e.key in _VOCAB_KEYS and vocab is not None and dim == 0 and shape[0] > vocab:
            real = _draw(init, (vocab, *shape[1:]), p.device, _seed_of(seed, e.key))
            pad = _draw(
                init, (shape[0] - vocab, *shape[1:]), p.device, _seed_of(seed, e.key + ".pad")
            )
            full = torch.cat([real, pad], dim=0)
        else:
            full = _draw(init, tuple(shape), p.device, _seed_of(seed, e.key))
        p.copy_(tp_slice(full, dim, stride, rank, size))
        del full
    return "layout_invariant"
