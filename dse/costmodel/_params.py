"""Parameter counts of a GPT model, whole and per pipeline stage / model-parallel rank."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dse.costmodel._layout import CostLayout, padded_vocab
from dse.space import ModelSpec

__all__ = ["StageParams", "stage_params", "total_params", "layers_on_stage", "mlp_factor"]


def mlp_factor(model: ModelSpec) -> int:
    """Output columns of the first MLP projection per FFN unit: 2 for gated units, else 1."""
    return 2 if model.gated_linear_unit else 1


def _attention_params(model: ModelSpec) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one attention block, norm included."""
    h, q = model.hidden_size, model.num_attention_heads * model.head_dim
    kv = model.query_groups * model.head_dim
    norm = h * (2 if model.normalization == "LayerNorm" else 1)
    sharded = h * (q + 2 * kv) + q * h
    replicated = norm
    if model.add_bias_linear:
        sharded += q + 2 * kv
        replicated += h
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


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one rank of one pipeline stage.

    ``dense`` are replicated over the data-parallel group (sharded by the distributed
    optimizer over DP x CP); ``expert`` are the routed experts held by this rank
    (sharded by the distributed optimizer over the expert-data-parallel group).
    """

    dense: int
    expert: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


def layers_on_stage(model: ModelSpec, layout: CostLayout) -> int:
    """Transformer layers on the most loaded pipeline stage (ceil of L / PP)."""
    return int(math.ceil(model.num_layers / layout.pp))


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
    n = layers_on_stage(model, layout)
    dense_l, expert_l = _layer_params(model, layout)
    dense, expert = dense_l * n, expert_l * n
    first, last = stage == 0, stage == layout.pp - 1
    if first:
        dense += vp * h / layout.tp
        if model.position_embedding_type == "learned_absolute":
            dense += seq_length * h
    if last:
        dense += h * (2 if model.normalization == "LayerNorm" else 1)  # final norm
        if model.untie_embeddings_and_output_weights or not first:
            # untied output layer, or the copy of the tied embedding on the last stage
            dense += vp * h / layout.tp
    return StageParams(int(round(dense)), int(round(expert)))


def total_params(model: ModelSpec, seq_length: int) -> int:
    """All parameters of the model (unpadded vocabulary, one copy of every weight)."""
    h = model.hidden_size
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
