"""The ``sim`` workload: a trial process that answers from the cost model, not a GPU.

The estimate itself is the cost model's (:class:`dse.model.costmodel.model.CostModel`); this module
is only its trial process. ``python -m dse.workloads.sim --spec trial.json`` reads a
:class:`dse.core.records.TrialSpec` and writes the metrics JSONL contract of
:mod:`dse.core.records`
(with its :class:`~dse.core.records.MetricsWriter`) to ``spec.metrics_path``: one
``step`` line per ``semantics.steps`` with the estimated step time, TFLOP/s and peak
memory, then a ``summary`` line; or, when the configuration is predicted not to fit, one
``failure`` line of class ``oom``. Every line carries ``"source": "estimate"``.

The loss is simulated too (:func:`simulated_losses`), so that the loss-parity guard
(:mod:`dse.loop.loss_guard`) and the loss curves treat a sim trial as they treat a trained one: a
deterministic curve of the step and of what defines the training (the model, the data, the
initialisation seed, the global batch, the sequence length, the learning rate, the precision,
the MoE routing: :class:`~dse.space.searchspace.Semantics` less ``steps`` / ``warmup_steps``),
never of
the execution knobs. Every configuration of a study therefore gets the same curve (no
execution knob is flagged ``numerics-changed``), and another data seed gives another one. The
knobs that do change numerics on a GPU (FP8, reduced-precision optimizer states) are not
modelled: the simulator has no figure for their drift. The curve is labelled like every sim
figure (``source: estimate``, and ``loss_model`` in the summary): it is no training result.

The MoE routing a study holds fixed (``semantics.moe_routing``) is accepted as semantics: it
seeds the simulated loss curve (above) and changes no time or memory estimate. The cost model
counts balanced routing (every expert receives its share ``topk * tokens / experts``, nothing
dropped or padded), whatever the load balancing, score function, router dtype or capacity
factor; a capacity factor with ``moe_pad_expert_input_to_capacity`` (each expert's input
padded to ``factor`` times that share) is not counted either.

The measurement fields of the trial contract (``measurement``, ``step_time_ci_s``,
``tflops_per_gpu_ci``, :mod:`dse.stats.measure`) are filled the way a real trial fills them, from
a series labelled ``measurement.series``: ``estimate`` (fixed mode: every step is the
estimate, so the interval has no width) or ``synthetic`` (adaptive mode: the estimate with a
slow first step and 1% seeded noise per step, one series per configuration, run through the
same stopping and dominance rule as the trainer). Both are estimates, never measurements.

The GPU's name and memory come from ``--gpu`` / ``--gpu-memory-gib``, else the environment
(``DSE_SIM_GPU``, ``DSE_SIM_GPU_MEMORY_GIB``), else the trial spec (``gpu`` /
``gpu_memory_gib``, from the space's resources); without a capacity everything fits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dse.core.exceptions import DSEError
from dse.core.records import (
    FailureLine,
    MetricsLine,
    MetricsWriter,
    StepLine,
    SummaryLine,
    TrialSpec,
)
from dse.model.costmodel._params import total_params
from dse.model.costmodel.model import CostModel
from dse.space.searchspace import ModelSpec, Resources, Semantics
from dse.stats.measure import StepSeries, series_for

__all__ = ["main", "run_trial", "simulate", "simulated_losses", "synthetic_step_times"]

#: The synthetic series of adaptive mode: the first steps' slowdown over the steady state
#: (allocation, first kernels), the noise per step (relative standard deviation) and its
#: lag-1 autocorrelation.
SYNTHETIC_HEAD = (1.0, 0.3, 0.1)
SYNTHETIC_NOISE = 0.01
SYNTHETIC_AR1 = 0.2


#: The simulated loss curve ``floor + (start - floor) * (1 + D / SIM_LOSS_TOKENS) ** -0.5``,
#: where ``D`` is the tokens trained so far scaled by the learning rate over 3e-4 (so a smaller
#: rate learns more slowly). ``start`` is ``ln(vocab) + SIM_LOSS_INIT_EXCESS`` (a randomly
#: initialised model predicts about uniformly; the H200 tables start at ln(32000) + 0.4);
#: ``floor`` is a Chinchilla-style ``E + A / N ** alpha`` of the parameter count (Hoffmann et
#: al., 2022: E 1.69, A 406.4, alpha 0.34), kept below ``start``.
SIM_LOSS_INIT_EXCESS = 0.4
SIM_LOSS_FIT = (1.69, 406.4, 0.34)
SIM_LOSS_TOKENS = 2.0e6
#: Batch-to-batch noise of the simulated loss: relative standard deviation at 32768 tokens per
#: step, shrinking with the square root of the tokens per step (bounded to 0.1 %..2 %); seeded
#: by the training's definition, so another data seed draws other batches.
SIM_LOSS_NOISE = 0.01
#: Fields of the semantics that do not change the loss at a given step.
_LOSS_NEUTRAL = ("steps", "warmup_steps")


def simulated_losses(model: ModelSpec, sem: Semantics, n: int) -> list[float]:
    """The simulated loss of steps ``0..n-1``: a function of the step, the model and the
    semantics that define the training (never of the execution knobs); the same for the same
    inputs, on any machine."""

    start = math.log(model.vocab_size) + SIM_LOSS_INIT_EXCESS
    e, a, alpha = SIM_LOSS_FIT
    n_params = max(1, total_params(model, sem.seq_length))
    floor = min(e + a / n_params**alpha, start - 0.5)
    tokens = sem.global_batch_size * sem.seq_length
    rate = tokens * sem.lr / 3e-4
    noise = min(0.02, max(0.001, SIM_LOSS_NOISE * math.sqrt(32768 / tokens)))
    key = {
        "model": model.model_dump(mode="json"),
        "semantics": sem.model_dump(mode="json", exclude=set(_LOSS_NEUTRAL)),
    }
    rng = random.Random(zlib.crc32(json.dumps(key, sort_keys=True).encode()))
    out: list[float] = []
    for step in range(n):
        trend = floor + (start - floor) * (1 + step * rate / SIM_LOSS_TOKENS) ** -0.5
        out.append(round(trend * (1 + rng.gauss(0.0, noise)), 6))
    return out


def synthetic_step_times(step_time_s: float, params: dict[str, Any], n: int) -> list[float]:
    """``n`` synthetic step times around an estimate: a slow head and seeded AR(1) noise,
    the same for the same configuration (labelled ``synthetic`` wherever it is recorded)."""
    rng = random.Random(zlib.crc32(json.dumps(params, sort_keys=True, default=str).encode()))
    out: list[float] = []
    e = rng.gauss(0.0, SYNTHETIC_NOISE)
    innovation = SYNTHETIC_NOISE * (1 - SYNTHETIC_AR1**2) ** 0.5
    for i in range(n):
        if i:
            e = SYNTHETIC_AR1 * e + rng.gauss(0.0, innovation)
        head = SYNTHETIC_HEAD[i] if i < len(SYNTHETIC_HEAD) else 0.0
        out.append(step_time_s * (1 + head) * max(0.5, 1 + e))
    return out


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
    # how far the estimate is to be trusted (calibrated / interpolated / extrapolated): on
    # every sim trial, so no figure outside the measured range passes for a calibrated one
    trust = cm.trust(spec.params).as_dict()
    if not fits:
        return [
            FailureLine(
                failure_class="oom",
                reason=(
                    f"predicted peak {total:.2f} GiB > {cm.usable_gib:.2f} GiB usable of "
                    f"{res.gpu_memory_gib} GiB per GPU ({mem.peak_phase}, cost-model estimate)"
                ),
                metrics={
                    # the device-level need that decided it (allocated + fragmentation +
                    # context), so the figure shown beside "oom" is the one over the capacity
                    "peak_mem_gib": round(total, 4),
                    "predicted_allocated_gib": round(mem.allocated_gib, 4),
                    "predicted_total_gib": round(total, 4),
                    "usable_gib": round(float(cm.usable_gib or 0.0), 4),
                    "trust": trust,
                },
                source="estimate",
            )
        ]
    thr = cm.estimate_throughput(spec.params)
    peak = round(mem.allocated_gib, 4)
    reserved = round(mem.allocated_gib + mem.fragmentation_gib, 4)
    t_est, tf_est = float(thr["step_time_s"]), float(thr["tflops_per_gpu"])
    tokens = sem.global_batch_size * sem.seq_length
    series: StepSeries = series_for(spec, tokens_per_step_per_gpu=tokens / spec.world_size)
    times = (
        synthetic_step_times(t_est, spec.params, series.limit)
        if series.adaptive
        else [t_est] * series.limit
    )
    losses = simulated_losses(model, sem, len(times))
    lines: list[MetricsLine] = []
    for step, t in enumerate(times):
        tf = tf_est * t_est / t
        lines.append(
            StepLine(
                step=step, step_time_s=t, tflops_per_gpu=tf, peak_mem_gib=peak,
                peak_reserved_gib=reserved, loss=losses[step], source="estimate",
            )
        )  # fmt: skip
        if series.add(t, tf) is not None:
            break
    measured = (series.result() if series.adaptive else series.result(t_est, tf_est)).fields()
    measured["measurement"]["series"] = "synthetic" if series.adaptive else "estimate"
    n = len(series.times)
    lines.append(
        SummaryLine.model_validate(
            {
                "step_time_s": measured["step_time_s"],
                "tflops_per_gpu": measured["tflops_per_gpu"],
                "tokens_per_s_per_gpu": (
                    tokens / (measured["step_time_s"] * spec.world_size)
                    if series.adaptive
                    else thr["tokens_per_s_per_gpu"]
                ),
                **{k: measured[k] for k in measured if k.endswith("_ci") or k.endswith("_ci_s")},
                "measurement": measured["measurement"],
                "peak_mem_gib": peak,
                "peak_reserved_gib": reserved,
                "loss": losses[n - 1],
                "losses": losses[:n],
                "loss_model": "simulated",
                "steps": n,
                "memory": mem.as_dict() | {"details": None},
                "throughput_breakdown_s": thr["breakdown_s"],
                "gpu": thr["gpu"],
                "trust": trust,
                # the estimate's interval (dse.results.noise): its held-out speed band where
                # the basis gives one
                **({"error_band": trust["speed_band"]} if trust["speed_band"] else {}),
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
    ap.add_argument("--spec", required=True, help="trial spec (JSON, dse.core.records.TrialSpec)")
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
