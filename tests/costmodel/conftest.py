"""Shared fixtures of the cost-model tests: a small GPT and the shared measured table."""

from __future__ import annotations

from pathlib import Path

import pytest

from dse.space import ModelSpec, Resources, Semantics

#: The measured table of the shared folder (next to the repository), if present.
SHARED_TABLE = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "h200_llama1b_unfused_1gpu.jsonl"
)


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


@pytest.fixture
def shared_table() -> Path:
    if not SHARED_TABLE.exists():
        pytest.skip(f"shared table not present ({SHARED_TABLE.name})")
    return SHARED_TABLE
