"""Parameter counts of a GPT model, whole and per pipeline stage / model-parallel rank."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dse.model.costmodel._layout import CostLayout, padded_vocab
from dse.space.layout import pipeline_stage_layers
from dse.space.searchspace import LoraSpec, ModelSpec, count_layer_kinds

__all__ = [
    "StageParams",
    "stage_params",
    "total_params",
    "layers_on_stage",
    "mlp_factor",
    "stage_layer_kinds",
    "stage_layer_ids",
    "lora_layer_params",
    "lora_stage_params",
    "MAMBA_CONV_KERNEL",
]

#: MambaMixer's causal convolution width (d_conv; megatron/core/ssm/mamba_mixer.py).
MAMBA_CONV_KERNEL = 4


def mlp_factor(model: ModelSpec) -> int:
    """Output columns of the first MLP projection per FFN unit: 2 for gated units, else 1."""
    return 2 if model.gated_linear_unit else 1


def _attention_params(model: ModelSpec) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one attention block, norm included.

    Multi-Latent Attention: the linears of :meth:`ModelSpec.mla_linears` (down projections
    replicated on every TP rank, as the Transformer-Engine spec builds them), plus, with
    ``qk_layernorm``, the norms of the compressed query and key/value."""
    if model.multi_latent_attention:
        return _mla_params(model)
    h, q = model.hidden_size, model.num_attention_heads * model.head_dim
    kv = model.query_groups * model.head_dim
    norm = h * (2 if model.normalization == "LayerNorm" else 1)
    sharded = h * (q + 2 * kv) + q * h
    replicated = norm
    if model.qk_layernorm:
        replicated += 2 * model.head_dim * (2 if model.normalization == "LayerNorm" else 1)
    if model.add_bias_linear:
        sharded += q + 2 * kv
        replicated += h
    return sharded, replicated


def _mla_params(model: ModelSpec) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one MLA block with its input norm (MLA has no
    linear biases in Megatron-Core: every projection is built with ``bias=False`` except
    the output projection, which follows ``add_bias_linear``)."""
    h = model.hidden_size
    per_norm = 2 if model.normalization == "LayerNorm" else 1
    sharded = replicated = 0
    for n_in, n_out, split in model.mla_linears().values():
        if split:
            sharded += n_in * n_out
        else:
            replicated += n_in * n_out
    replicated += h * per_norm
    if model.qk_layernorm:
        replicated += per_norm * ((model.q_lora_rank or 0) + model.kv_lora_rank)
    if model.add_bias_linear:
        replicated += h  # linear_proj's bias
    return sharded, replicated


def _mlp_params(model: ModelSpec, ffn: int) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one dense MLP of width ``ffn`` (no norm)."""
    h = model.hidden_size
    sharded = h * ffn * mlp_factor(model) + ffn * h
    replicated = 0
    if model.add_bias_linear:
        sharded += ffn * mlp_factor(model)
        replicated += h
    return sharded, replicated


def _mamba_params(model: ModelSpec) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one Mamba mixer with its fused input norm
    (MambaMixer: in_proj to z, x, B, C, dt; depthwise conv1d over x, B, C; dt_bias, A_log,
    D per head; the gated RMSNorm of width d_inner; out_proj)."""
    h, d = model.hidden_size, model.mamba_d_inner
    heads, gn = model.mamba_heads, model.mamba_num_groups * model.mamba_state_dim
    conv = d + 2 * gn
    sharded = h * (2 * d + 2 * gn + heads) + conv * (MAMBA_CONV_KERNEL + 1) + 3 * heads + d
    sharded += d * h
    return sharded, h


def _moe_params(model: ModelSpec, layout: CostLayout | None) -> tuple[float, float]:
    """(dense, expert) parameters of one MoE block (router, shared expert; routed experts
    on one rank, or all of them when ``layout`` is None), norm excluded."""
    h = model.hidden_size
    experts = model.num_moe_experts or 0
    fe = model.moe_ffn_hidden_size or model.ffn_hidden_size
    e_sh, e_rep = _mlp_params(model, fe)
    tp = layout.tp if layout else 1
    if layout is None:
        expert = float(experts * (e_sh + e_rep))
    else:
        expert = experts / layout.ep * (e_sh / layout.etp + e_rep)
    dense = float(h * experts)  # router
    if model.moe_shared_expert_intermediate_size:
        s_sh, s_rep = _mlp_params(model, model.moe_shared_expert_intermediate_size)
        dense += s_sh / tp + s_rep
    return dense, expert


def stage_layer_ids(model: ModelSpec, layout: CostLayout, stage: int) -> list[int]:
    """The layers (0-based) pipeline rank ``stage`` holds, over all its virtual chunks.

    A hybrid model's pattern is cut into PP pieces of ceil(L/PP) (the last takes the rest);
    a GPT model's layers split as Megatron-Core splits them
    (:func:`dse.space.layout.pipeline_stage_layers`)."""
    if model.is_hybrid:
        n = int(math.ceil(model.num_layers / layout.pp))
        hi = (stage + 1) * n if stage < layout.pp - 1 else model.num_layers
        return list(range(min(stage * n, model.num_layers), min(hi, model.num_layers)))
    par = layout.parallel
    return pipeline_stage_layers(model.num_layers, par.pp, par.vpp, par.split)[stage]


def stage_layer_kinds(model: ModelSpec, layout: CostLayout, stage: int) -> dict[str, int]:
    """Layers of each kind on pipeline stage ``stage`` (a GPT layer counts as attention and
    as MLP or MoE, as ``moe_layer_freq`` makes it)."""
    kinds = model.layer_kind_list()
    return count_layer_kinds([kinds[i] for i in stage_layer_ids(model, layout, stage)])


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one rank of one pipeline stage.

    ``dense`` are replicated over the data-parallel group (sharded by the distributed
    optimizer over DP x CP); ``expert`` are the routed experts held by this rank
    (sharded by the distributed optimizer over the expert-data-parallel group).
    """

    dense: int
    expert: int
    frozen: int = 0  # weights only (frozen encoders): no gradient, no optimizer state

    @property
    def total(self) -> int:
        """Trainable parameters on this rank."""
        return self.dense + self.expert


def layers_on_stage(model: ModelSpec, layout: CostLayout) -> int:
    """Transformer layers on the most loaded pipeline stage."""
    return max(len(stage_layer_ids(model, layout, st)) for st in range(layout.pp))


def _layer_params(model: ModelSpec, layout: CostLayout) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one rank."""
    tp = layout.tp
    a_sh, a_rep = _attention_params(model)
    h = model.hidden_size
    norm2 = h * (2 if model.normalization == "LayerNorm" else 1)
    dense = a_sh / tp + a_rep + norm2
    expert = 0.0
    if model.num_moe_experts:
        fe = model.moe_ffn_hidden_size or model.ffn_hidden_size
        e_sh, e_rep = _mlp_params(model, fe)
        per_rank_experts = model.num_moe_experts / layout.ep
        expert = per_rank_experts * (e_sh / layout.etp + e_rep)
        dense += h * model.num_moe_experts  # router
        if model.moe_shared_expert_intermediate_size:
            s_sh, s_rep = _mlp_params(model, model.moe_shared_expert_intermediate_size)
            dense += s_sh / tp + s_rep
    else:
        m_sh, m_rep = _mlp_params(model, model.ffn_hidden_size)
        dense += m_sh / tp + m_rep
    return dense, expert


def stage_params(model: ModelSpec, seq_length: int, layout: CostLayout, stage: int) -> StageParams:
    """Parameters on one rank of pipeline stage ``stage`` (0 = first, PP-1 = last)."""
    h = model.hidden_size
    vp = padded_vocab(model.vocab_size, layout.tp)
    first, last = stage == 0, stage == layout.pp - 1
    if model.is_hybrid or model.mixed_moe:
        dense, expert = _hybrid_stage_params(model, layout, stage)
    else:
        n = layers_on_stage(model, layout)
        dense_l, expert_l = _layer_params(model, layout)
        dense, expert = dense_l * n, expert_l * n
    if first:
        dense += vp * h / layout.tp
        if model.position_embedding_type == "learned_absolute":
            dense += seq_length * h
    if last:
        dense += h * (2 if model.normalization == "LayerNorm" else 1)  # final norm
        if model.untie_embeddings_and_output_weights or not first:
            # untied output layer, or the copy of the tied embedding on the last stage
            dense += vp * h / layout.tp
    frozen = model.frozen_params if first else 0
    if layout.peft is not None:
        # PEFT: every base weight is frozen (weights only); the adapters train (dense: they
        # are replicated over data parallelism like the attention; on experts, sharded by
        # expert data parallelism like the experts)
        a_dense, a_expert = lora_stage_params(model, layout, stage)
        frozen += int(round(dense + expert))
        dense, expert = a_dense, a_expert
    return StageParams(int(round(dense)), int(round(expert)), frozen)


def lora_layer_params(model: ModelSpec, kind: str, peft: LoraSpec) -> tuple[float, float]:
    """(dense, expert) LoRA adapter parameters of one layer of ``kind`` (``attention``,
    ``mlp``, ``moe``; all experts), whole: an adapter of rank r beside a linear of
    ``n_in -> n_out`` holds ``r (n_in + n_out)`` (A: n_in x r, B: r x n_out)."""
    r, t = peft.dim, set(peft.target_modules)
    h = model.hidden_size
    dense = expert = 0.0
    if kind == "attention" and model.multi_latent_attention:
        # MLA has no linear_qkv: of the targets, only linear_proj exists in its block
        if "linear_proj" in t:
            n_in, n_out, _ = model.mla_linears()["linear_proj"]
            dense += r * (n_in + n_out)
        return dense, expert
    if kind == "attention":
        q = model.num_attention_heads * model.head_dim
        kv = model.query_groups * model.head_dim
        if "linear_qkv" in t:
            dense += r * (h + q + 2 * kv)
        if "linear_proj" in t:
            dense += r * (q + h)
        return dense, expert
    fac = mlp_factor(model)
    if kind == "mlp":
        f = model.ffn_hidden_size
        dense += r * (h + fac * f) * ("linear_fc1" in t) + r * (f + h) * ("linear_fc2" in t)
        return dense, expert
    if kind == "moe":
        fe = model.moe_ffn_hidden_size or model.ffn_hidden_size
        per = r * (h + fac * fe) * ("linear_fc1" in t) + r * (fe + h) * ("linear_fc2" in t)
        expert = per * (model.num_moe_experts or 0)
        fs = model.moe_shared_expert_intermediate_size
        if fs:
            dense += r * (h + fac * fs) * ("linear_fc1" in t) + r * (fs + h) * ("linear_fc2" in t)
    return dense, expert


def lora_stage_params(model: ModelSpec, layout: CostLayout, stage: int) -> tuple[float, float]:
    """(dense, expert) adapter parameters on one rank of ``stage`` (TP shards the dense
    adapters, EP x ETP the experts'; an estimate: Bridge replicates some A or B halves)."""
    assert layout.peft is not None
    kinds = stage_layer_kinds(model, layout, stage)
    dense = expert = 0.0
    for kind in ("attention", "mlp", "moe"):
        d, e = lora_layer_params(model, kind, layout.peft)
        dense += kinds[kind] * d / layout.tp
        expert += kinds[kind] * e / (layout.ep * layout.etp)
    return dense, expert


def _hybrid_stage_params(model: ModelSpec, layout: CostLayout, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters of the layers on one rank of ``stage``, by layer kind
    (a hybrid model, or a GPT MoE model with dense layers too)."""
    tp, h = layout.tp, model.hidden_size
    norm = h * (2 if model.normalization == "LayerNorm" else 1)
    kinds = stage_layer_kinds(model, layout, stage)
    a_sh, a_rep = _attention_params(model)
    m_sh, m_rep = _mamba_params(model)
    f_sh, f_rep = _mlp_params(model, model.ffn_hidden_size)
    moe_dense, moe_expert = _moe_params(model, layout) if model.num_moe_experts else (0.0, 0.0)
    dense = kinds["attention"] * (a_sh / tp + a_rep)
    dense += kinds["mamba"] * (m_sh / tp + m_rep)
    dense += kinds["mlp"] * (f_sh / tp + f_rep + norm)
    dense += kinds["moe"] * (moe_dense + norm)
    return dense, kinds["moe"] * moe_expert


def total_params(model: ModelSpec, seq_length: int) -> int:
    """All parameters of the model (unpadded vocabulary, one copy of every weight; frozen
    parameters not included)."""
    h = model.hidden_size
    if model.is_hybrid or model.mixed_moe:
        return _hybrid_total(model, seq_length)
    a_sh, a_rep = _attention_params(model)
    norm2 = h * (2 if model.normalization == "LayerNorm" else 1)
    per_layer = a_sh + a_rep + norm2
    if model.num_moe_experts:
        fe = model.moe_ffn_hidden_size or model.ffn_hidden_size
        e_sh, e_rep = _mlp_params(model, fe)
        per_layer += model.num_moe_experts * (e_sh + e_rep) + h * model.num_moe_experts
        if model.moe_shared_expert_intermediate_size:
            s_sh, s_rep = _mlp_params(model, model.moe_shared_expert_intermediate_size)
            per_layer += s_sh + s_rep
    else:
        m_sh, m_rep = _mlp_params(model, model.ffn_hidden_size)
        per_layer += m_sh + m_rep
    total = per_layer * model.num_layers + model.vocab_size * h + norm2
    if model.untie_embeddings_and_output_weights:
        total += model.vocab_size * h
    if model.position_embedding_type == "learned_absolute":
        total += seq_length * h
    return total


def _hybrid_total(model: ModelSpec, seq_length: int) -> int:
    h = model.hidden_size
    norm = h * (2 if model.normalization == "LayerNorm" else 1)
    kinds = model.layer_counts()
    a_sh, a_rep = _attention_params(model)
    m_sh, m_rep = _mamba_params(model)
    f_sh, f_rep = _mlp_params(model, model.ffn_hidden_size)
    moe_dense, moe_expert = _moe_params(model, None) if model.num_moe_experts else (0.0, 0.0)
    total: float = kinds["attention"] * (a_sh + a_rep) + kinds["mamba"] * (m_sh + m_rep)
    total += kinds["mlp"] * (f_sh + f_rep + norm) + kinds["moe"] * (moe_dense + moe_expert + norm)
    total += model.vocab_size * h * (2 if model.untie_embeddings_and_output_weights else 1)
    total += norm  # final norm
    if model.position_embedding_type == "learned_absolute":
        total += seq_length * h
    return int(total)
