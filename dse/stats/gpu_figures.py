"""One trial's part of its study's GPU time, as the storage keeps it: the figures of a trial's
metrics (:func:`trial_gpu_figures`, columns of its row) and their sums over a study
(:class:`GpuTotals`). The study's account made from them is :mod:`dse.results.gpu_usage`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dse.core.records import finite

__all__ = ["TRIAL_GPU_FIGURES", "GpuTotals", "trial_gpu_figures"]


#: One trial's part of its study's GPU time (:func:`trial_gpu_figures`). The storage keeps
#: them as columns of the trial's row, written with its metrics, so a study's figures are one
#: aggregate query over the study's trials (:meth:`dse.storage.Storage.gpu_totals`) instead
#: of a fold over every trial's metrics in Python.
TRIAL_GPU_FIGURES = (
    "gpu_seconds_startup",
    "gpu_seconds_measure",
    "device_seconds",
    "device_seconds_measure",
    "device_seconds_measured",
    "device_seconds_kernel",
    "device_seconds_first_step",
    "first_step_s",
)


def trial_gpu_figures(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """One trial's part of its study's GPU time (:data:`TRIAL_GPU_FIGURES`), from its metrics
    (None: the trial has no such figure; every other figure is a finite number).

    ``gpu_seconds_startup`` and ``gpu_seconds_measure`` are the metrics' own. The others need
    a ``timing`` record: ``device_seconds`` (wall seconds x devices: None marks a trial
    without one), ``device_seconds_measure`` (its steps x devices), and the shares of
    :func:`dse.results.gpu_usage.busy_shares`: in measured steps, in any device work, in the
    first step, and the first step's seconds, the last two None for a trial that does not
    record the split. A value that is not a finite number counts as 0
    (:func:`dse.core.records.finite`), a product too large for a float too."""
    out: dict[str, float | None] = dict.fromkeys(TRIAL_GPU_FIGURES)
    out["gpu_seconds_startup"] = finite(metrics.get("gpu_seconds_startup"))
    out["gpu_seconds_measure"] = finite(metrics.get("gpu_seconds_measure"))
    timing = metrics.get("timing")
    if not isinstance(timing, Mapping):
        return out
    dev = _num(timing.get("devices"))
    steps = _num(timing.get("measure_s"))
    out["device_seconds"] = _num(_num(timing.get("wall_s")) * dev)
    out["device_seconds_measure"] = _num(steps * dev)
    ms = finite(metrics.get("measured_steps_s"))
    if ms is None:  # no split: every step measured, no build
        out["device_seconds_measured"] = out["device_seconds_kernel"] = _num(steps * dev)
        return out
    f = _num(metrics.get("first_step_s")) + 0.0  # + 0.0: no -0.0 (a median stays one value)
    out["device_seconds_measured"] = _num(min(ms, steps or ms) * dev)
    out["device_seconds_kernel"] = _num((_num(metrics.get("build_s")) + steps) * dev)
    out["device_seconds_first_step"] = _num(f * dev)
    out["first_step_s"] = f
    return out


@dataclass(frozen=True)
class GpuTotals:
    """A study's trials added up, what :func:`dse.results.gpu_usage.usage_of_totals` makes its
    figures from: by :func:`dse.results.gpu_usage.gpu_totals` over trial records, or by the
    storage in one query over the columns of :data:`TRIAL_GPU_FIGURES`
    (:meth:`dse.storage.Storage.gpu_totals`). Estimates (source ``estimate``) are counted apart
    and left out of every other figure."""

    #: trials of source ``estimate``
    estimates: int = 0
    #: the other trials
    trials: int = 0
    #: the sum of their finite ``gpu_seconds``
    gpu_seconds: float = 0.0
    #: the trials with a non-zero ``gpu_seconds``, and the sum of those
    ran: int = 0
    ran_seconds: float = 0.0
    #: sums of :data:`TRIAL_GPU_FIGURES` (None counts as 0)
    gpu_seconds_startup: float = 0.0
    gpu_seconds_measure: float = 0.0
    device_seconds: float = 0.0
    device_seconds_measure: float = 0.0
    device_seconds_measured: float = 0.0
    device_seconds_kernel: float = 0.0
    device_seconds_first_step: float = 0.0
    #: trials with a ``timing`` record, and those of them that record the split
    timed: int = 0
    split: int = 0
    #: the split trials' first steps: the median (the upper one of an even count) and max
    first_step_s_median: float | None = None
    first_step_s_max: float | None = None


def _num(x: Any) -> float:
    f = finite(x)
    return 0.0 if f is None else f
