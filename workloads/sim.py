"""The ``sim`` workload: a trial process that answers from the cost model, not a GPU.

The estimate itself is the cost model's (:class:`dse.costmodel.model.CostModel`); this module
is only its trial process. ``python -m dse.workloads.sim --spec trial.json`` reads a
:class:`dse.records.TrialSpec` and writes the metrics JSONL contract of :mod:`dse.records`
(with its :class:`~dse.records.MetricsWriter`) to ``spec.metrics_path``: one
``step`` line per ``semantics.steps`` with the estimated step time, TFLOP/s and peak
memory, then a ``summary`` line; or, when the configuration is predicted not to fit, one
``failure`` line of class ``oom``. Every line carries ``"source": "estimate"``. The loss is
not simulated: step lines carry ``loss: 0.0`` to satisfy the contract.

The GPU's name and memory come from ``--gpu`` / ``--gpu-memory-gib``, else the environment
(``DSE_SIM_GPU``, ``DSE_SIM_GPU_MEMORY_GIB``), else the trial spec (``gpu`` /
``gpu_memory_gib``, from the space's resources); without a capacity everything fits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from dse.costmodel.model import CostModel
from dse.exceptions import DSEError
from dse.records import FailureLine, MetricsLine, MetricsWriter, StepLine, SummaryLine, TrialSpec
from dse.space import ModelSpec, Resources, Semantics

__all__ = ["main", "run_trial", "simulate"]


def simulate(
    spec: TrialSpec, gpu: str | None = None, gpu_memory_gib: float | None = None
) -> list[MetricsLine]:
    """The metrics lines of a simulated trial (without writing them)."""
    model = ModelSpec.model_validate(spec.model)
    sem = Semantics.model_validate(spec.semantics)
    wl = spec.workload or {}
    gpu = gpu or os.environ.get("DSE_SIM_GPU") or spec.gpu or wl.get("gpu")
    if gpu_memory_gib is None:
        env = os.environ.get("DSE_SIM_GPU_MEMORY_GIB")
        raw = env if env else (spec.gpu_memory_gib or wl.get("gpu_memory_gib"))
        gpu_memory_gib = float(raw) if raw not in (None, "") else None
    res = Resources.model_validate(
        {
            "world_size": spec.world_size,
            "device": spec.device,
            "gpu": gpu,
            "gpu_memory_gib": gpu_memory_gib if spec.device == "cuda" else None,
            "features": list(spec.features) if spec.features is not None else "detect",
        }
    )
    cm = CostModel(model, sem, res)
    mem = cm.predict_memory(spec.params)
    fits, total = cm.fits(spec.params, 0.0)
    if not fits:
        return [
            FailureLine(
                failure_class="oom",
                reason=(
                    f"predicted peak {total:.2f} GiB > {res.gpu_memory_gib} GiB per GPU "
                    f"({mem.peak_phase}, cost-model estimate)"
                ),
                metrics={
                    "peak_mem_gib": round(mem.allocated_gib, 4),
                    "predicted_total_gib": round(total, 4),
                },
                source="estimate",
            )
        ]
    thr = cm.estimate_throughput(spec.params)
    peak = round(mem.allocated_gib, 4)
    reserved = round(mem.allocated_gib + mem.fragmentation_gib, 4)
    lines: list[MetricsLine] = []
    for step in range(sem.steps):
        lines.append(
            StepLine(
                step=step, step_time_s=thr["step_time_s"], tflops_per_gpu=thr["tflops_per_gpu"],
                peak_mem_gib=peak, peak_reserved_gib=reserved, loss=0.0, source="estimate",
            )
        )  # fmt: skip
    lines.append(
        SummaryLine.model_validate(
            {
                "step_time_s": thr["step_time_s"],
                "tflops_per_gpu": thr["tflops_per_gpu"],
                "tokens_per_s_per_gpu": thr["tokens_per_s_per_gpu"],
                "peak_mem_gib": peak,
                "peak_reserved_gib": reserved,
                "loss": 0.0,
                "losses": [0.0] * sem.steps,
                "steps": sem.steps,
                "memory": mem.as_dict() | {"details": None},
                "throughput_breakdown_s": thr["breakdown_s"],
                "gpu": thr["gpu"],
                "source": "estimate",
            }
        )
    )
    return lines


def run_trial(spec: TrialSpec, gpu: str | None = None, gpu_memory_gib: float | None = None) -> int:
    """Write the simulated trial's metrics JSONL to ``spec.metrics_path``; 0 on success."""
    try:
        lines = simulate(spec, gpu, gpu_memory_gib)
    except (DSEError, ValidationError, ValueError) as e:
        lines = [
            FailureLine(
                failure_class="error",
                reason=f"cost model could not estimate the configuration: {e}",
                source="estimate",
            )
        ]
    delay = float((spec.workload or {}).get("delay_s") or 0.0)
    if delay > 0:
        time.sleep(delay)
    writer = MetricsWriter(spec.metrics_path, source="estimate")
    for line in lines:
        writer.write(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dse.workloads.sim --spec trial.json``."""
    ap = argparse.ArgumentParser(
        prog="python -m dse.workloads.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--spec", required=True, help="trial spec (JSON, dse.records.TrialSpec)")
    ap.add_argument("--gpu", help="GPU name, e.g. 'NVIDIA H200'")
    ap.add_argument("--gpu-memory-gib", type=float, help="GPU memory per device (GiB)")
    args = ap.parse_args(argv)
    try:
        spec = TrialSpec.model_validate_json(Path(args.spec).read_text())
    except (OSError, ValueError) as e:
        sys.stderr.write(f"sim: bad trial spec {args.spec}: {e}\n")
        return 2
    return run_trial(spec, args.gpu, args.gpu_memory_gib)


if __name__ == "__main__":
    sys.exit(main())
