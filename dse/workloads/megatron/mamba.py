"""Hybrid (Mamba) models in the built-in trainer: a local (non-TE) ``MambaStack`` spec.

Megatron-Core 0.16.1 ships only a Transformer Engine spec for ``MambaModel``
(``megatron/core/models/mamba/mamba_layer_specs.py``: ``TELayerNormColumnParallelLinear``,
``TERowParallelLinear``, ``TEDotProductAttention``, ``TENorm``), and ``MambaStack`` builds its
final norm as a hard-coded ``TENorm`` (``megatron/core/ssm/mamba_block.py``). Without TE this
module builds the same model from Megatron-Core's own parts:

* Mamba layer: ``MambaLayer`` with a ``WrappedTorchNorm`` input norm and ``MambaMixer`` whose
  in/out projections are ``ColumnParallelLinear`` / ``RowParallelLinear`` (the TE spec fuses
  the norm into ``in_proj``; here it is the layer's ``norm`` slot). The mixer's sizes come from
  the model (``mamba_num_heads``, ``mamba_head_dim``, ``mamba_state_dim``, ``mamba_num_groups``
  as ``TransformerConfig`` fields; ``mamba_chunk_size`` as the mixer's ``chunk_size``);
* attention layer (``*``): the local GPT spec's self-attention (core attention: the trainer's
  SDPA or Megatron's unfused ``DotProductAttention``), without its MLP;
* MLP layer (``-``): ``MLPLayer`` with the local GPT spec's MLP;
* MoE layer (``E``): ``MoETransformerLayer`` with the local GPT spec's MoE (routed experts,
  shared expert, router settings from ``semantics.moe_routing``);
* final norm: ``LocalNormMambaStack`` (:func:`local_norm_stack_class`), a ``MambaStack``
  subclass that builds the final norm from a spec (``WrappedTorchNorm``) instead of
  ``TENorm``; Megatron's forward applies it unchanged (``post_layer_norm``).

What Megatron-Core refuses or does not do for these models, rejected before launch by
:mod:`dse.model.rules` (``mamba_tp``, ``mamba_cp``, ``hybrid_vpp``, ``hybrid_full_recompute``):
Mamba
heads and groups not divisible by TP (``mamba_mixer.py`` asserts), virtual pipeline stages
(``MambaStack`` asserts), full activation recompute (``MambaStack`` has no checkpointed forward,
so ``recompute_granularity=full`` would silently recompute nothing); sequence parallelism with
torch norms fails at build as for GPT models.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "local_norm_stack_class",
    "build_mamba_model",
    "mamba_config_kwargs",
    "mamba_stack_spec",
    "moe_routing_kwargs",
]


def mamba_config_kwargs(model: Any) -> dict[str, Any]:
    """The ``TransformerConfig`` fields of a hybrid model's Mamba mixer."""
    return {
        "mamba_num_heads": model.mamba_num_heads,
        "mamba_head_dim": model.mamba_head_dim,
        "mamba_state_dim": model.mamba_state_dim,
        "mamba_num_groups": model.mamba_num_groups,
    }


def moe_routing_kwargs(routing: Any) -> dict[str, Any]:
    """``semantics.moe_routing`` as ``TransformerConfig`` fields (None: Megatron's defaults)."""
    if routing is None:
        return {}
    return dict(routing.model_dump())


def _local_layer(num_experts: int | None, grouped: bool, normalization: str) -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=grouped, normalization=normalization
    )


def _norm_class() -> Any:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return WrappedTorchNorm


def mamba_stack_spec(
    *,
    normalization: str,
    attention_backend: str,
    num_experts: int | None,
    moe_grouped_gemm: bool,
    chunk_size: int,
) -> Any:
    """The ``ModuleSpec`` of a local (non-TE) ``MambaStack`` (see the module doc).

    ``attention_backend``: ``sdpa`` (the trainer's :class:`SDPAttention`) or ``unfused``
    (Megatron's ``DotProductAttention``).
    """
    from megatron.core.ssm.mamba_block import MambaStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import (
        MoETransformerLayer,
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    if attention_backend not in ("sdpa", "unfused"):
        raise ValueError(
            f"the local Mamba spec serves attention_backend sdpa or unfused "
            f"(attention_backend={attention_backend!r})"
        )
    norm = _norm_class()
    dense = _local_layer(None, False, normalization).submodules
    attention = copy.deepcopy(dense.self_attention)
    if attention_backend == "sdpa":
        from dse.workloads.megatron._sdpa import SDPAttention

        attention.submodules.core_attention = SDPAttention
    mamba_layer = ModuleSpec(
        module=MambaLayer,
        submodules=MambaLayerSubmodules(
            norm=norm,
            mixer=ModuleSpec(
                module=MambaMixer,
                params={"chunk_size": chunk_size},
                submodules=MambaMixerSubmodules(
                    in_proj=ColumnParallelLinear, out_proj=RowParallelLinear
                ),
            ),
            mamba_bda=dense.self_attn_bda,
        ),
    )
    attention_layer = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=attention,
            self_attn_bda=dense.self_attn_bda,
        ),
    )
    mlp_layer = ModuleSpec(
        module=MLPLayer,
        submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=norm, mlp=copy.deepcopy(dense.mlp), mlp_bda=dense.mlp_bda
        ),
    )
    subs = MambaStackSubmodules(
        mamba_layer=mamba_layer, attention_layer=attention_layer, mlp_layer=mlp_layer
    )
    if num_experts:
        moe = _local_layer(num_experts, moe_grouped_gemm, normalization).submodules
        subs.moe_layer = ModuleSpec(
            module=MoETransformerLayer,
            submodules=TransformerLayerSubmodules(
                pre_mlp_layernorm=norm, mlp=copy.deepcopy(moe.mlp), mlp_bda=moe.mlp_bda
            ),
        )
    stack = local_norm_stack_class()
    return ModuleSpec(module=stack, submodules=subs, params={"final_norm": norm})


_STACK: list[type] = []


def local_norm_stack_class() -> type:
    """:class:`LocalNormMambaStack` (defined on first use: it subclasses a megatron class)."""
    if _STACK:
        return _STACK[0]
    from megatron.core.ssm.mamba_block import MambaStack
    from megatron.core.transformer.spec_utils import build_module

    class _LocalNormMambaStack(MambaStack):  # type: ignore[misc]
        """``MambaStack`` whose final norm is built from a spec (``final_norm``) instead of
        the hard-coded ``TENorm``; Megatron's forward applies it as before."""

        def __init__(
            self, config: Any, submodules: Any, *args: Any, final_norm: Any, **kwargs: Any
        ) -> None:
            post_layer_norm = kwargs.pop("post_layer_norm", True)
            super().__init__(config, submodules, *args, post_layer_norm=False, **kwargs)
            self.post_layer_norm = post_layer_norm
            if self.post_process and post_layer_norm:
                self.final_norm = build_module(
                    final_norm,
                    config=config,
                    hidden_size=config.hidden_size,
                    eps=config.layernorm_epsilon,
                )

    _LocalNormMambaStack.__name__ = _LocalNormMambaStack.__qualname__ = "LocalNormMambaStack"
    _STACK.append(_LocalNormMambaStack)
    return _LocalNormMambaStack


def build_mamba_model(
    plan: Any, config: Any, vocab_size: int, pre_process: bool, post_process: bool
) -> Any:
    """A ``MambaModel`` of a hybrid plan on this process's pipeline stage."""
    from megatron.core.models.mamba import MambaModel

    m = plan.model
    spec = mamba_stack_spec(
        normalization=m.normalization,
        attention_backend=plan.attention_backend,
        num_experts=m.num_moe_experts,
        moe_grouped_gemm=bool(plan.fields["model"].get("moe_grouped_gemm", False)),
        chunk_size=m.mamba_chunk_size,
    )
    return MambaModel(
        config=config,
        mamba_stack_spec=spec,
        vocab_size=vocab_size,
        max_sequence_length=plan.semantics.seq_length,
        hybrid_override_pattern=m.hybrid_layer_pattern,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type,
    )
