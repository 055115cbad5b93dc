"""Which objective values count in the cross-study ``/best`` (a value anyone may have imported).

``GET /best`` answers every reader with the best trial over every matching study, so one
imported study with a trial value of ``1e308`` or ``inf`` would win it for everyone. A value
counts only when it is finite and physically possible for the study's hardware:

- ``tflops_per_gpu``: above 0 and at most twice the GPU's dense BF16 peak (FP8's dense peak;
  the peaks of :data:`dse.model.costmodel.throughput.GPUS`), or at most :data:`UNKNOWN_GPU_TFLOPS`
  for a GPU that table does not know and :data:`CPU_TFLOPS` on a CPU;
- ``peak_mem_gib``: above 0 and at most the study's GPU memory (or :data:`MAX_MEM_GIB`);
- ``step_time_s`` and ``tokens_per_s_per_gpu``: above 0 and at most a generous bound.

The study's own ``/studies/{name}/best`` is not filtered: it is that study's record.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from dse.model.costmodel.throughput import DEFAULT_GPU, gpu_spec

__all__ = ["value_range", "UNKNOWN_GPU_TFLOPS", "CPU_TFLOPS", "MAX_MEM_GIB"]

#: Upper bound of TFLOP/s per GPU for a GPU the cost model's table does not know.
UNKNOWN_GPU_TFLOPS = 10_000.0
#: Upper bound of TFLOP/s per device on a CPU.
CPU_TFLOPS = 100.0
#: Upper bound of peak memory (GiB) when the study gives no GPU memory.
MAX_MEM_GIB = 4096.0
#: Upper bounds of the other objectives: a step of 10 days, 1e9 tokens/s per GPU.
MAX_STEP_TIME_S = 864_000.0
MAX_TOKENS_PER_S = 1e9


def value_range(metric: str, hardware: dict[str, Any]) -> tuple[float, float]:
    """``(low, high)``: a value counts when ``low < value <= high``."""
    if metric == "tflops_per_gpu":
        return 0.0, _tflops_cap(hardware)
    if metric == "peak_mem_gib":
        mem = hardware.get("gpu_memory_gib")
        if isinstance(mem, int | float) and not isinstance(mem, bool):
            if math.isfinite(mem) and mem > 0:
                return 0.0, float(mem)
        return 0.0, MAX_MEM_GIB
    if metric == "step_time_s":
        return 0.0, MAX_STEP_TIME_S
    if metric == "tokens_per_s_per_gpu":
        return 0.0, MAX_TOKENS_PER_S
    return -sys.float_info.max, sys.float_info.max  # no known bound: finite values only


def _tflops_cap(hardware: dict[str, Any]) -> float:
    if hardware.get("device") == "cpu":
        return CPU_TFLOPS
    gpu = hardware.get("gpu")
    spec = gpu_spec(gpu if isinstance(gpu, str) else None)
    if spec is DEFAULT_GPU:
        return UNKNOWN_GPU_TFLOPS
    return 2.0 * spec.bf16_tflops
