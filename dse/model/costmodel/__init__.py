"""Cost model: predict a configuration's per-GPU memory and speed before a GPU is spent.

* :class:`CostModel` is what the study loop uses: ``predict_memory``, ``fits`` (the
  pre-screen), ``observe`` / ``calibration`` / ``margin`` (calibration from measured trials)
  and ``estimate_throughput``.
* :func:`estimate_memory` returns a :class:`MemoryEstimate`, one field per memory term.
* :class:`Calibrator` fits the free :class:`Coefficients` to measured peaks and OOMs.
* :func:`estimate_throughput` is a roofline-style step-time estimate (``source: estimate``).

Everything here is pure Python + numpy (no torch).
"""

from dse.model.costmodel.calibration import Calibrator, Observation
from dse.model.costmodel.memory import Coefficients, MemoryEstimate, estimate_memory
from dse.model.costmodel.model import CostModel
from dse.model.costmodel.throughput import GPUSpec, estimate_throughput, gpu_spec

__all__ = [
    "CostModel",
    "MemoryEstimate",
    "Coefficients",
    "Calibrator",
    "Observation",
    "estimate_memory",
    "estimate_throughput",
    "GPUSpec",
    "gpu_spec",
]
