"""The throughput estimate: labelled, ordered like the physics says, model-FLOPs TFLOP/s."""

from __future__ import annotations

import pytest

from dse.model.costmodel import estimate_throughput
from dse.model.flops import model_flops_per_step
from dse.space.searchspace import ModelSpec, Resources, Semantics

MODEL = ModelSpec(
    num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
    ffn_hidden_size=5632, vocab_size=32000,
)  # fmt: skip
SEM = Semantics(global_batch_size=8, seq_length=4096)
H200 = Resources(world_size=1, gpu="NVIDIA H200", gpu_memory_gib=139.8, features=[])


def _est(res=H200, **params):
    return estimate_throughput(MODEL, SEM, res, params)


def test_labelled_estimate_with_model_flops():
    out = _est(micro_batch_size=2)
    assert out["source"] == "estimate"
    flops = model_flops_per_step(MODEL, SEM)
    assert out["tflops_per_gpu"] == pytest.approx(flops / out["step_time_s"] / 1e12, rel=1e-3)
    assert set(out["breakdown_s"]) >= {"compute", "communication", "pipeline_bubble"}


def test_recompute_costs_time_and_sdpa_beats_unfused():
    none = _est(recompute="none")["step_time_s"]
    sel = _est(recompute="selective")["step_time_s"]
    full = _est(recompute="full")["step_time_s"]
    assert none < sel < full
    assert _est(attention_backend="sdpa")["step_time_s"] < none
    assert _est(bias_activation_fusion=True)["step_time_s"] < none


def test_parallelism_adds_communication_and_bubbles():
    two = Resources(world_size=2, gpu="NVIDIA H200", features=[])
    dp = _est(two, attention_backend="sdpa")
    tp = _est(two, attention_backend="sdpa", tensor_model_parallel_size=2)
    pp = _est(two, attention_backend="sdpa", pipeline_model_parallel_size=2)
    assert dp["breakdown_s"]["communication"] > 0
    assert tp["breakdown_s"]["communication"] > dp["breakdown_s"]["communication"]
    assert pp["breakdown_s"]["pipeline_bubble"] > 0
    assert dp["tflops_per_gpu"] > tp["tflops_per_gpu"]


def test_gpu_speed_matters():
    a100 = Resources(world_size=1, gpu="NVIDIA A100-SXM4-80GB", features=[])
    unknown = Resources(world_size=1, gpu="some new accelerator", features=[])
    assert _est(a100)["step_time_s"] > _est()["step_time_s"]
    assert _est(unknown)["gpu"].startswith("unknown")


def test_fp8_runs_the_linear_gemms_at_the_fp8_peak():
    """FP8 (the fp8 knob) estimates faster than bf16 where the GPU has FP8 tensor cores
    (the GEMM share at the published dense FP8 peak, 2x bf16 on Hopper), never faster than
    the GEMM share allows, and the same where it has none (A100)."""
    from dse.model.costmodel.throughput import gpu_spec

    h200, b200 = gpu_spec("NVIDIA H200"), gpu_spec("NVIDIA B200")
    assert h200.fp8_tflops == pytest.approx(2 * h200.bf16_tflops, rel=1e-3)
    assert b200.fp8_tflops == 2 * b200.bf16_tflops
    bf16 = _est(attention_backend="te", micro_batch_size=2)
    fp8 = _est(attention_backend="te", micro_batch_size=2, fp8="hybrid", fp8_recipe="tensorwise")
    assert fp8["source"] == "estimate"
    assert fp8["step_time_s"] < bf16["step_time_s"]
    assert fp8["tflops_per_gpu"] > bf16["tflops_per_gpu"]  # same model FLOPs, less time
    # only the GEMMs speed up: less than twice as fast overall
    assert fp8["step_time_s"] > bf16["step_time_s"] / 2
    assert fp8["breakdown_s"]["communication"] == bf16["breakdown_s"]["communication"]
    a100 = Resources(world_size=1, gpu="NVIDIA A100-SXM4-80GB", features=[])
    assert (
        _est(a100, fp8="hybrid")["step_time_s"] == _est(a100)["step_time_s"]
    )  # no FP8 tensor cores


def test_fp8_speeds_up_routed_experts():
    moe = ModelSpec(
        num_layers=4, hidden_size=2048, num_attention_heads=16, num_query_groups=4,
        ffn_hidden_size=5632, vocab_size=32000, num_moe_experts=8, moe_router_topk=2,
        moe_ffn_hidden_size=1408,
    )  # fmt: skip
    res = Resources(world_size=1, gpu="NVIDIA H100 80GB HBM3", features=[])
    bf16 = estimate_throughput(moe, SEM, res, {"attention_backend": "te"})
    fp8 = estimate_throughput(moe, SEM, res, {"attention_backend": "te", "fp8": "hybrid"})
    assert fp8["breakdown_s"]["compute"] < bf16["breakdown_s"]["compute"]
