"""dse/api/plausible.py on its own: which objective values count in the cross-study ``/best``
(finite and physically possible for the study's hardware), so an imported 1e308 or a
TFLOP/s figure above the GPU's peak cannot win it for everyone."""

from __future__ import annotations

import sys

import pytest

from dse.api.plausible import CPU_TFLOPS, MAX_MEM_GIB, UNKNOWN_GPU_TFLOPS, value_range
from dse.model.costmodel.throughput import gpu_spec


@pytest.mark.parametrize("gpu", ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"])
def test_tflops_at_most_twice_the_gpus_dense_bf16_peak(gpu: str) -> None:
    hw = {"device": "cuda", "gpu": gpu}
    low, high = value_range("tflops_per_gpu", hw)
    assert (low, high) == (0.0, 2.0 * gpu_spec(gpu).bf16_tflops)
    assert high < UNKNOWN_GPU_TFLOPS  # a known GPU gets its own, tighter bound


def test_tflops_bounds_of_a_cpu_and_of_an_unknown_gpu() -> None:
    assert value_range("tflops_per_gpu", {"device": "cpu", "gpu": "NVIDIA H200"}) == (
        0.0, CPU_TFLOPS,
    )  # fmt: skip
    for hw in ({"device": "cuda", "gpu": "Some Future GPU"}, {"device": "cuda"}, {"gpu": 7}):
        assert value_range("tflops_per_gpu", hw) == (0.0, UNKNOWN_GPU_TFLOPS)


@pytest.mark.parametrize(
    "mem,high",
    [(141.0, 141.0), (80, 80.0), (None, MAX_MEM_GIB), (True, MAX_MEM_GIB),
     (float("nan"), MAX_MEM_GIB), (float("inf"), MAX_MEM_GIB), (-1.0, MAX_MEM_GIB),
     ("80", MAX_MEM_GIB)],
)  # fmt: skip
def test_peak_memory_at_most_the_studys_gpu_memory(mem: object, high: float) -> None:
    assert value_range("peak_mem_gib", {"gpu_memory_gib": mem}) == (0.0, high)


def test_other_objectives() -> None:
    low, high = value_range("step_time_s", {})
    assert low == 0.0 and 3600 < high < 1e7  # a step of days at most, not forever
    low, high = value_range("tokens_per_s_per_gpu", {})
    assert low == 0.0 and 1e6 < high < float("inf")
    assert value_range("some_metric", {}) == (-sys.float_info.max, sys.float_info.max)
