"""Core attention through ``torch.nn.functional.scaled_dot_product_attention``.

:class:`SDPAttention` takes the place of Megatron-Core's ``DotProductAttention`` as the
``core_attention`` submodule of the local layer spec (``attention_backend: sdpa``). It has
the same constructor and forward signature and the same layouts:

* in: query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]`` (this TP rank's heads and
  query groups),
* out: ``[sq, b, np * hn]`` (= hidden size per TP partition),

so tensor parallelism works unchanged (each rank attends over its own heads). GQA uses
SDPA's ``enable_gqa`` (torch >= 2.5), with a ``repeat_interleave`` fallback. The causal mask
is SDPA's ``is_causal`` (no mask tensor is materialised) unless an ``attention_mask`` is
given: then that mask, which already holds the causal part, is the one applied (packed rows'
block-diagonal causal mask, as Megatron's local DotProductAttention applies a given mask).

Selective recompute (``recompute_modules=["core_attn"]``) still applies: in Megatron-Core
0.16.1 the checkpoint wraps whatever ``core_attention`` module the attention layer holds
(``Attention._checkpointed_attention_forward``). Not supported (a ``ValueError`` at build,
reported as an invalid configuration): context parallelism, sliding-window attention,
softmax types other than ``vanilla``; ``packed_seq_params`` (THD) and attention bias at run
time.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the usual alias
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["SDPAttention", "sdpa_supports_gqa"]


def sdpa_supports_gqa() -> bool:
    """True when this torch's SDPA takes ``enable_gqa``."""
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


_HAS_GQA = sdpa_supports_gqa()


class SDPAttention(MegatronModule):
    """Causal self-attention with torch SDPA, shaped like Megatron's DotProductAttention."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError(
                "sdpa core attention does not support context parallelism "
                f"(context_parallel_size={config.context_parallel_size})"
            )
        if getattr(config, "window_size", None) is not None:
            raise ValueError("sdpa core attention does not support sliding-window attention")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError(
                f"sdpa core attention supports softmax_type 'vanilla' only "
                f"(softmax_type={config.softmax_type!r})"
            )
        if pg_collection is not None and hasattr(pg_collection, "tp"):
            tp_size = pg_collection.tp.size()
        else:
            tp_size = parallel_state.get_tensor_model_parallel_world_size()
        kv_channels = config.kv_channels
        heads = config.num_attention_heads
        groups = config.num_query_groups or heads
        if heads % tp_size or groups % tp_size:
            raise ValueError(
                "attention heads and query groups must be multiples of the TP size "
                f"(num_attention_heads={heads}, num_query_groups={groups}, tp={tp_size})"
            )
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.heads_per_partition = heads // tp_size
        self.groups_per_partition = groups // tp_size
        self.hidden_size_per_partition = kv_channels * heads // tp_size
        # Megatron's query-key layer scaling divides the scale by the layer number and
        # multiplies it back inside an fp32 softmax: the net scale is 1/sqrt(hn).
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(kv_channels)
        )
        self.dropout_p = float(
            config.attention_dropout if attention_dropout is None else attention_dropout
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """Attend ``[sq, b, np, hn]`` queries to ``[sk, b, ng, hn]`` keys/values."""
        if packed_seq_params is not None:
            raise ValueError("sdpa core attention does not support packed sequences")
        if attention_bias is not None:
            raise ValueError("sdpa core attention does not support an attention bias")
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        sq, b = query.shape[0], query.shape[1]
        # [s, b, n, hn] -> [b, n, s, hn]
        q = query.permute(1, 2, 0, 3)
        k = key.permute(1, 2, 0, 3)
        v = value.permute(1, 2, 0, 3)
        causal = mask_type == AttnMaskType.causal
        mask = None
        if attention_mask is not None:
            # Megatron masks are True where attention is NOT allowed; SDPA's the opposite. A
            # mask given to a causal layer holds the causal part itself (packed rows).
            mask = ~attention_mask.bool()
        extra: dict[str, Any] = {}
        rep = self.heads_per_partition // self.groups_per_partition
        if rep > 1:
            if _HAS_GQA:
                extra["enable_gqa"] = True
            else:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
        dropout = self.dropout_p if self.training else 0.0
        if dropout > 0.0 and not self.config.sequence_parallel:
            rng: Any = tensor_parallel.get_cuda_rng_tracker().fork()
        else:
            rng = contextlib.nullcontext()
        with rng:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal and mask is None,
                scale=self.softmax_scale, **extra,
            )  # fmt: skip
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
