"""Megatron's model-FLOPs convention, as pure functions (no torch).

The count follows ``num_floating_point_operations`` of Megatron-LM
(``megatron/training/training.py``) for GPT-style decoder models:

* every GEMM is counted three times (forward, backward data-gradient, backward
  weight-gradient) at two floating-point operations per multiply-add;
* the MLP counts ``ffn`` twice for a plain activation and three times for SwiGLU
  (the gate projection); MoE layers (those ``moe_layer_freq`` makes MoE; the others are
  dense MLPs of ``ffn_hidden_size``) count ``moe_router_topk`` routed experts of size
  ``moe_ffn_hidden_size`` plus the shared expert;
* attention counts the Q, K, V and output projections with GQA's smaller K/V, and the two
  attention matmuls (QK^T and softmax·V) over half of the sequence (the causal mask);
* Multi-Latent Attention (``multi_latent_attention``) counts its down and up projections
  (:func:`dse.space.searchspace.mla_linear_shapes`), one multiply-add per element of the
  compressed query and key/value for their norms, as Megatron-LM does, and the two
  attention matmuls with query/key heads of ``qk_head_dim + qk_pos_emb_head_dim`` and value
  heads of ``v_head_dim``, halved by the causal mask;
* the logits GEMM uses the padded vocabulary size;
* activation recompute is not counted (model FLOPs, not hardware FLOPs);
* the training semantics change no count: a LoRA study (``semantics.peft``) counts the base
  model's FLOPs as above (the frozen base computes no weight gradients, which the cost
  model's step time knows; the adapters' own GEMMs, rank x width, are left out), and packed
  sequences count each row as one ``seq_length`` sequence (Megatron-LM's formula does the
  same; attention within shorter packed sequences does less work than that).

``tflops_per_gpu`` divides by the step time and the number of GPUs, as Megatron-LM's
``throughput`` log line does, so the figures compare with published Megatron/NeMo numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from dse.space.searchspace import mla_linear_shapes, moe_layer_pattern

__all__ = ["padded_vocab_size", "model_flops_per_step", "tflops_per_gpu"]


def padded_vocab_size(
    vocab_size: int, tensor_model_parallel_size: int = 1, make_vocab_size_divisible_by: int = 128
) -> int:
    """The vocabulary size Megatron trains with: rounded up to a multiple of
    ``make_vocab_size_divisible_by * tensor_model_parallel_size``."""
    if vocab_size < 1 or tensor_model_parallel_size < 1 or make_vocab_size_divisible_by < 1:
        raise ValueError(
            "sizes must be positive "
            f"({vocab_size=}, {tensor_model_parallel_size=}, {make_vocab_size_divisible_by=})"
        )
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


def _as_dict(obj: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    return obj.model_dump() if isinstance(obj, BaseModel) else dict(obj)


def model_flops_per_step(
    model: BaseModel | Mapping[str, Any],
    semantics: BaseModel | Mapping[str, Any],
    *,
    tensor_model_parallel_size: int = 1,
    make_vocab_size_divisible_by: int = 128,
) -> float:
    """Model FLOPs of one training step (one global batch, forward + backward).

    Args:
        model: a :class:`dse.space.searchspace.ModelSpec` or its dict (``num_layers``,
        ``hidden_size``,
            ``num_attention_heads``, ``num_query_groups``, ``kv_channels``,
            ``ffn_hidden_size``, ``vocab_size``, ``activation``, MoE fields).
        semantics: a :class:`dse.space.searchspace.Semantics` or a dict with ``global_batch_size``
        and
            ``seq_length``.
        tensor_model_parallel_size: TP size; only changes the vocabulary padding.
        make_vocab_size_divisible_by: Megatron's vocabulary padding multiple (128).
    """
    m = _as_dict(model)
    s = _as_dict(semantics)
    layers = int(m["num_layers"])
    h = int(m["hidden_size"])
    heads = int(m["num_attention_heads"])
    groups = int(m.get("num_query_groups") or heads)
    head_dim = int(m.get("kv_channels") or h // heads)
    ffn = int(m["ffn_hidden_size"])
    seq = int(s["seq_length"])
    tokens = int(s["global_batch_size"]) * seq
    vocab = padded_vocab_size(
        int(m["vocab_size"]), tensor_model_parallel_size, make_vocab_size_divisible_by
    )
    # SwiGLU has a third (gate) projection in the MLP: 3 GEMMs of h x ffn instead of 2.
    mlp_gemms = 3 if m.get("activation", "swiglu") == "swiglu" else 2

    if m.get("hybrid_layer_pattern"):
        return _hybrid_flops(m, h, heads, groups, head_dim, ffn, seq, tokens, vocab)

    experts = m.get("num_moe_experts")
    if experts:
        # moe_layer_freq: which layers are MoE (Megatron-LM counts the pattern the same way)
        moe_layers = sum(moe_layer_pattern(layers, m.get("moe_layer_freq") or 1, experts))
        dense_layers = layers - moe_layers
        topk = int(m.get("moe_router_topk") or 1)
        moe_ffn = int(m.get("moe_ffn_hidden_size") or ffn)
        shared_ffn = int(m.get("moe_shared_expert_intermediate_size") or 0)
    else:
        moe_layers, dense_layers, topk, moe_ffn, shared_ffn = 0, layers, 0, 0, 0

    fwd_bwd = 3  # forward, backward data-gradient, backward weight-gradient
    fma = 2  # a multiply-add is two floating-point operations

    # Per token: MLP GEMMs.
    mlp = h * mlp_gemms * (ffn * dense_layers + (moe_ffn * topk + shared_ffn) * moe_layers)
    if m.get("multi_latent_attention"):
        projections, core_attention = _mla_flops_terms(m, h, heads, seq)
        projections *= layers
        core_attention *= layers
    else:
        # Per token: attention projections (Q, K, V in; output projection).
        q_size = head_dim * heads
        kv_size = head_dim * groups
        projections = (h * (q_size + 2 * kv_size) + q_size * h) * layers
        # Per token: QK^T and softmax·V, each q_size x seq, halved by the causal mask.
        core_attention = 2 * q_size * seq * 0.5 * layers
    # Per token: output logits.
    logits = h * vocab
    return float(fwd_bwd * fma * tokens * (mlp + projections + core_attention + logits))


def _mla_flops_terms(m: Mapping[str, Any], h: int, heads: int, seq: int) -> tuple[float, float]:
    """Multiply-adds per token of one MLA block: (projections with the compressed norms,
    the two attention matmuls over half the sequence), as Megatron-LM's
    ``num_floating_point_operations`` counts them."""
    q_lora = m.get("q_lora_rank", 512)  # MLATransformerConfig's default when absent
    kv_lora = int(m.get("kv_lora_rank") or 512)
    qk = int(m.get("qk_head_dim") or 128)
    rope = int(m.get("qk_pos_emb_head_dim") or 64)
    v = int(m.get("v_head_dim") or 128)
    shapes = mla_linear_shapes(h, heads, None if q_lora is None else int(q_lora), kv_lora, qk,
                               rope, v)  # fmt: skip
    projections = float(sum(n_in * n_out for n_in, n_out, _ in shapes.values()))
    projections += (int(q_lora) if q_lora is not None else 0) + kv_lora  # q / kv norms
    core = seq * heads * (qk + rope) / 2 + seq * heads * v / 2
    return projections, core


#: MambaMixer's causal convolution width (``d_conv``, fixed at 4 in Megatron-Core's specs).
_MAMBA_CONV_WIDTH = 4


def _hybrid_flops(
    m: Mapping[str, Any],
    h: int,
    heads: int,
    groups: int,
    head_dim: int,
    ffn: int,
    seq: int,
    tokens: int,
    vocab: int,
) -> float:
    """Model FLOPs of a hybrid (Mamba) model, per layer kind as Megatron-LM's
    ``hybrid_flops`` counts them (forward x 3; causal attention halved; the router left out),
    with two differences, both of the Mamba mixer: its inner width is ``heads x head_dim``
    (Megatron-LM's ``mamba_layer_flops`` takes ``2 x hidden`` even when ``mamba_num_heads``
    sets another width), and its depthwise causal convolution is counted (``2 x (d_inner +
    2 groups state) x d_conv`` per token; Megatron-LM leaves it out, under 1% of a layer).

    Per token and forward: Mamba ``in_proj`` ``2 h (2 d_in + 2 g N + H)``, conv as above,
    SSD scan ``7 d_in N`` (Megatron-LM's count), ``out_proj`` ``2 d_in h``; attention
    ``4 h q (1 + groups/heads) + 2 s q``; MLP ``4 h ffn`` (x1.5 gated); MoE
    ``4 h (topk moe_ffn + shared)`` (x1.5 gated); logits ``2 h vocab``."""
    pattern = str(m["hybrid_layer_pattern"])
    n_attn, n_mamba = pattern.count("*"), pattern.count("M")
    n_mlp, n_moe = pattern.count("-"), pattern.count("E")
    gated = 1.5 if m.get("activation", "swiglu") == "swiglu" else 1.0
    state = int(m.get("mamba_state_dim") or 128)
    mgroups = int(m.get("mamba_num_groups") or 8)
    mhead_dim = int(m.get("mamba_head_dim") or 64)
    mheads = int(m.get("mamba_num_heads") or (2 * h) // mhead_dim)
    d_in = mheads * mhead_dim
    q = heads * head_dim
    t = tokens
    attn = 4 * t * h * q * (1 + groups / heads) + 2 * t * seq * q  # 2·T·s·q: causal half
    mamba = 2 * t * h * (2 * d_in + 2 * mgroups * state + mheads)
    mamba += 2 * t * (d_in + 2 * mgroups * state) * _MAMBA_CONV_WIDTH  # depthwise conv1d
    mamba += 7 * t * d_in * state + 2 * t * d_in * h
    mlp = 4 * t * h * ffn * gated
    moe_ffn = int(m.get("moe_ffn_hidden_size") or ffn)
    topk = int(m.get("moe_router_topk") or 1)
    shared = int(m.get("moe_shared_expert_intermediate_size") or 0)
    moe = 4 * t * h * (moe_ffn * topk + shared) * gated
    logits = 2 * t * h * vocab
    fwd = n_attn * attn + n_mamba * mamba + n_mlp * mlp + n_moe * moe + logits
    return float(3 * fwd)


def tflops_per_gpu(flops: float, step_time_s: float, world_size: int) -> float:
    """TFLOP/s per GPU of a step of ``flops`` model FLOPs that took ``step_time_s`` on
    ``world_size`` GPUs."""
    if step_time_s <= 0 or world_size < 1:
        raise ValueError(
            f"step time and world size must be positive ({step_time_s=}, {world_size=})"
        )
    return flops / (step_time_s * world_size * 1e12)
