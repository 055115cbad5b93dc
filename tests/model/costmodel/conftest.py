"""Shared fixtures of the cost-model tests: a small GPT, its semantics and one GPU."""

from __future__ import annotations

import pytest

from dse.space.searchspace import ModelSpec, Resources, Semantics


@pytest.fixture
def small_model() -> ModelSpec:
    """2 layers, h=64, 4 heads (head dim 16) in 2 KV groups, SwiGLU ffn 256, vocab 1000."""
    return ModelSpec(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=256,
        vocab_size=1000,
    )


@pytest.fixture
def small_semantics() -> Semantics:
    return Semantics(global_batch_size=8, seq_length=32)


@pytest.fixture
def one_gpu() -> Resources:
    return Resources(world_size=1, gpu="NVIDIA H200", gpu_memory_gib=139.8, features=[])
