"""Megatron's model-FLOPs formula (dse.model.flops) against hand computations and a measured
row."""

from __future__ import annotations

import pytest

from dse.model.flops import model_flops_per_step, padded_vocab_size, tflops_per_gpu
from dse.space.searchspace import ModelSpec, Semantics

# The 0.9B Llama-style model of reference/gpu.md and the first row of
# data/h200_llama1b_unfused_1gpu.jsonl: 1 H200, step time 1.5614 s, 120.2 TFLOP/s per GPU.
LLAMA_09B = {
    "num_layers": 16,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_query_groups": 8,
    "ffn_hidden_size": 5632,
    "vocab_size": 32000,
    "activation": "swiglu",
}
LLAMA_SEM = {"global_batch_size": 8, "seq_length": 4096}


def test_measured_h200_row_is_reproduced_within_one_percent() -> None:
    flops = model_flops_per_step(LLAMA_09B, LLAMA_SEM)
    assert tflops_per_gpu(flops, 1.5614, 1) == pytest.approx(120.2, rel=0.01)


def test_llama_09b_by_hand() -> None:
    h, ffn, layers, vocab, s, gbs = 2048, 5632, 16, 32000, 4096, 8
    q, kv = 16 * 128, 8 * 128
    tokens = gbs * s
    per_token = (
        6 * 3 * h * ffn * layers  # SwiGLU MLP: gate, up, down
        + 6 * (h * (q + 2 * kv) + q * h) * layers  # Q, K, V and output projections
        + 6 * q * s * layers  # QK^T and softmax·V over half the sequence (causal)
        + 6 * h * vocab  # logits (32000 is already a multiple of 128)
    )
    assert model_flops_per_step(LLAMA_09B, LLAMA_SEM) == pytest.approx(tokens * per_token)
    assert model_flops_per_step(LLAMA_09B, LLAMA_SEM) == pytest.approx(1.8770725e14, rel=1e-6)


def test_accepts_pydantic_specs() -> None:
    model = ModelSpec(**LLAMA_09B)
    sem = Semantics(**LLAMA_SEM, steps=6, warmup_steps=2)
    assert model_flops_per_step(model, sem) == model_flops_per_step(LLAMA_09B, LLAMA_SEM)


def test_tiny_model_by_hand() -> None:
    # MHA (groups = heads), gelu (2 MLP GEMMs), vocab padded from 1000 to 1024.
    model = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "ffn_hidden_size": 256,
        "vocab_size": 1000,
        "activation": "gelu",
    }
    sem = {"global_batch_size": 2, "seq_length": 32}
    tokens = 2 * 32
    per_token = (
        6 * 2 * 64 * 256 * 2  # MLP
        + 6 * (64 * (64 + 2 * 64) + 64 * 64) * 2  # projections
        + 6 * 64 * 32 * 2  # causal core attention
        + 6 * 64 * 1024  # logits, padded vocab
    )
    assert model_flops_per_step(model, sem) == tokens * per_token


def test_gqa_and_swiglu_change_the_count() -> None:
    mha = {**LLAMA_09B, "num_query_groups": None}
    assert model_flops_per_step(mha, LLAMA_SEM) > model_flops_per_step(LLAMA_09B, LLAMA_SEM)
    for act in ("gelu", "squared_relu", "relu", "silu"):
        plain = model_flops_per_step({**LLAMA_09B, "activation": act}, LLAMA_SEM)
        diff = model_flops_per_step(LLAMA_09B, LLAMA_SEM) - plain
        # SwiGLU adds one h x ffn GEMM per layer: 6 * h * ffn * layers per token.
        assert diff == pytest.approx(8 * 4096 * 6 * 2048 * 5632 * 16)


def test_moe_counts_routed_and_shared_experts() -> None:
    dense = {**LLAMA_09B, "activation": "gelu"}
    moe = {
        **dense,
        "num_moe_experts": 8,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 1024,
        "moe_shared_expert_intermediate_size": 512,
    }
    tokens = 8 * 4096
    mlp_dense = 6 * 2 * 2048 * 5632 * 16
    mlp_moe = 6 * 2 * 2048 * (1024 * 2 + 512) * 16
    got = model_flops_per_step(moe, LLAMA_SEM) - model_flops_per_step(dense, LLAMA_SEM)
    assert got == pytest.approx(tokens * (mlp_moe - mlp_dense))
    # Without moe_ffn_hidden_size the experts have ffn_hidden_size.
    moe_default = {**dense, "num_moe_experts": 8, "moe_router_topk": 1}
    assert model_flops_per_step(moe_default, LLAMA_SEM) == pytest.approx(
        model_flops_per_step(dense, LLAMA_SEM)
    )


def test_padded_vocab_depends_on_tp() -> None:
    assert padded_vocab_size(32000) == 32000
    assert padded_vocab_size(32000, 2) == 32000
    assert padded_vocab_size(32000, 4) == 32256
    assert padded_vocab_size(1000) == 1024
    tp4 = model_flops_per_step(LLAMA_09B, LLAMA_SEM, tensor_model_parallel_size=4)
    assert tp4 - model_flops_per_step(LLAMA_09B, LLAMA_SEM) == pytest.approx(
        8 * 4096 * 6 * 2048 * 256
    )


def test_tflops_per_gpu_divides_by_world_and_rejects_bad_input() -> None:
    assert tflops_per_gpu(8e12, 2.0, 4) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="step_time_s=0"):
        tflops_per_gpu(1e12, 0, 1)
    with pytest.raises(ValueError, match="world_size=0"):
        tflops_per_gpu(1e12, 1.0, 0)
    with pytest.raises(ValueError, match="vocab_size=0"):
        padded_vocab_size(0)


# One small model per formula, counted by hand (issue 40): every term below is written out
# as the number it is, so that a changed factor in dse.model.flops (the causal halving, the
# shared expert, the gated MLP, the padded vocabulary) changes the sum and fails the test.
# Sizes: h = 64, 4 heads of 16 (q = 64), 2 query groups (kv = 32), seq 32, batch 2 ->
# T = 64 tokens per step; vocabulary 1000 padded to 1024 (TP 1, multiple 128).
SMALL_SEM = {"global_batch_size": 2, "seq_length": 32}
SMALL = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "ffn_hidden_size": 256,
    "vocab_size": 1000,
    "activation": "gelu",
}


def test_dense_small_model_counted_by_hand() -> None:
    # Per token, forward; a GEMM of m x n is 2 m n FLOPs (one multiply-add = 2).
    #   MLP (gelu: up + down)       2 GEMMs x 2 x 64 x 256                 = 65,536 per layer
    #   Q and O projections         2 GEMMs x 2 x 64 x 64                  = 16,384 per layer
    #   K and V projections (GQA)   2 GEMMs x 2 x 64 x 32                  =  8,192 per layer
    #   QK^T + softmax.V            2 x (2 x 64 x 32), halved (causal)     =  4,096 per layer
    #   logits                      2 x 64 x 1024                          = 131,072 once
    # 2 layers: 2 x (65,536 + 16,384 + 8,192 + 4,096) + 131,072 = 319,488 per token.
    # Forward + backward (data and weight gradients) = 3 x forward; 64 tokens:
    # 3 x 319,488 x 64 = 61,341,696.
    assert model_flops_per_step(SMALL, SMALL_SEM) == 61_341_696


def test_moe_small_model_counted_by_hand() -> None:
    moe = {
        **SMALL,
        "num_moe_experts": 4,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 32,
        "moe_shared_expert_intermediate_size": 16,
    }
    # Per token, forward, per layer (every layer MoE); the router is not counted:
    #   routed experts   topk 2 x 2 GEMMs x 2 x 64 x 32      = 16,384
    #   shared expert    2 GEMMs x 2 x 64 x 16                =  4,096
    #   attention        16,384 + 8,192 + 4,096 (as dense)    = 28,672
    # 2 layers: 2 x (16,384 + 4,096 + 28,672) + logits 131,072 = 229,376 per token.
    # 3 x 229,376 x 64 tokens = 44,040,192.
    assert model_flops_per_step(moe, SMALL_SEM) == 44_040_192


def test_hybrid_small_model_counted_by_hand() -> None:
    hybrid = {
        **SMALL,
        "num_layers": 4,
        "hybrid_layer_pattern": "M*-E",
        "mamba_state_dim": 16,
        "mamba_num_groups": 2,
        "mamba_head_dim": 16,  # mamba_num_heads unset: 2 h / 16 = 8 heads, d_in = 128
        "ffn_hidden_size": 128,
        "num_moe_experts": 4,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 32,
        "moe_shared_expert_intermediate_size": 32,
    }
    # Per token, forward, one layer of each kind of "M*-E":
    #   M  in_proj   2 x 64 x (2 x 128 + 2 x 2 x 16 + 8) = 2 x 64 x 328     = 41,984
    #      conv1d    2 x (128 + 2 x 2 x 16) x 4 (d_conv)                    =  1,536
    #      SSD scan  7 x 128 x 16                                            = 14,336
    #      out_proj  2 x 128 x 64                                            = 16,384
    #      Mamba layer                                                       = 74,240
    #   *  Q, O: 2 x 2 x 64 x 64 = 16,384; K, V: 2 x 2 x 64 x 32 = 8,192;
    #      QK^T + softmax.V: 2 x (2 x 32 x 64) = 8,192, halved (causal) = 4,096
    #      attention layer                                                   = 28,672
    #   -  MLP (gelu) 2 GEMMs x 2 x 64 x 128                                 = 32,768
    #   E  routed 2 x 2 GEMMs x 2 x 64 x 32 = 16,384; shared 2 x 2 x 64 x 32 = 8,192
    #      MoE layer                                                         = 24,576
    #   logits 2 x 64 x 1024                                                 = 131,072
    # Sum 291,328 per token; 3 x 291,328 x 64 tokens = 55,934,976.
    assert model_flops_per_step(hybrid, SMALL_SEM) == 55_934_976
    # Without the causal halving the attention layer would count 4,096 more per token:
    # 3 x 295,424 x 64 = 56,721,408; the count above is not that.
    assert model_flops_per_step(hybrid, SMALL_SEM) != 56_721_408
