"""Shared fixtures: paths of the repository and of the shared measured data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SHARED_TABLE = REPO.parent / "shared" / "data" / "h200_llama1b_unfused_1gpu.jsonl"


@pytest.fixture
def tiny_space_dict() -> dict:
    return {
        "study": "t",
        "model": {
            "num_layers": 4,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_query_groups": 2,
            "ffn_hidden_size": 128,
            "vocab_size": 1024,
        },
        "semantics": {"global_batch_size": 8, "seq_length": 64, "steps": 4, "warmup_steps": 1},
        "resources": {"world_size": 2, "device": "cpu", "features": []},
        "knobs": {
            "tensor_model_parallel_size": {"values": [1, 2]},
            "micro_batch_size": {"values": [1, 2, 4]},
            "use_distributed_optimizer": {"type": "bool"},
        },
    }
