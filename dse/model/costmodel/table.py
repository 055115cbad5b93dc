"""Evaluate the cost model on a measured table in the replay format.

A row: ``params`` (knob values), ``status`` (ok | oom | invalid | error), ``metrics``
(``peak_mem_gib``, ``tflops_per_gpu``, ...), ``world_size``, ``model`` (Megatron-style
architecture fields plus ``global_batch_size``, ``seq_length``, ``precision``) and
``hardware`` (``gpu``, ``gpu_memory_gib``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dse.core.records import finite
from dse.model.costmodel.model import CostModel
from dse.space.knobs import KNOBS
from dse.space.searchspace import ModelSpec, Resources, Semantics
from dse.space.tablemodel import RowModelError
from dse.space.tablemodel import row_problem as _row_problem
from dse.stats.table import MeasuredRow, TableError, read_table

__all__ = [
    "TableError",
    "load_table",
    "row_problem",
    "evaluate_rows",
    "RowResult",
    "summarize",
    "spearman",
]


def load_table(path: str | Path) -> list[MeasuredRow]:
    """Read a table whose every row has a ``model``; raises :class:`TableError` naming the
    file and the line."""
    rows = read_table(path)
    for r in rows:
        if not r.model:
            raise TableError(f"{path}:{r.line}: the row has no 'model' object")
    return rows


def row_problem(row: MeasuredRow) -> tuple[ModelSpec, Semantics, Resources, dict[str, Any]]:
    """The (model, semantics, resources, params) of a row; unknown knob names are dropped."""
    try:
        model, sem, res = _row_problem(row.model, row.world_size, row.hardware, [row.params])
    except RowModelError as e:
        raise TableError(f"line {row.line}: cannot build the model from the row ({e})") from e
    params = {k: v for k, v in row.params.items() if k in KNOBS}
    return model, sem, res, params


@dataclass(frozen=True)
class RowResult:
    """The cost model's figures for one row."""

    index: int
    status: str
    predicted_peak_mem_gib: float
    predicted_total_gib: float
    predicted_fits: bool
    measured_peak_mem_gib: float | None
    capacity_gib: float | None
    estimated_tflops_per_gpu: float
    measured_tflops_per_gpu: float | None
    peak_phase: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "status": self.status,
            "predicted_peak_mem_gib": round(self.predicted_peak_mem_gib, 3),
            "predicted_total_gib": round(self.predicted_total_gib, 3),
            "predicted_fits": self.predicted_fits,
            "measured_peak_mem_gib": self.measured_peak_mem_gib,
            "capacity_gib": self.capacity_gib,
            "estimated_tflops_per_gpu": round(self.estimated_tflops_per_gpu, 2),
            "measured_tflops_per_gpu": self.measured_tflops_per_gpu,
            "peak_phase": self.peak_phase,
            "source": "estimate",
        }


def evaluate_rows(rows: Sequence[MeasuredRow], calibrate: bool = False) -> list[RowResult]:
    """Predict every row (``index``: its position, from 0); with ``calibrate``,
    sequentially: row i from a fit on rows < i.

    Rows of one table may mix models/hardware: each distinct (model, semantics, resources)
    gets its own cost model (and calibration).
    """
    models: dict[str, CostModel] = {}
    out: list[RowResult] = []
    for index, row in enumerate(rows):
        model, sem, res, params = row_problem(row)
        key = json.dumps(
            [model.model_dump(), sem.model_dump(), res.model_dump()], sort_keys=True, default=str
        )
        cm = models.get(key)
        if cm is None:
            cm = models[key] = CostModel(model, sem, res)
        est = cm.predict_memory(params)
        fits, total = cm.fits(params, 0.0)
        thr = cm.estimate_throughput(params)
        peak = finite(row.metrics.get("peak_mem_gib"))
        out.append(
            RowResult(
                index=index,
                status=row.status,
                predicted_peak_mem_gib=est.allocated_gib,
                predicted_total_gib=total,
                predicted_fits=fits,
                measured_peak_mem_gib=peak,
                capacity_gib=res.gpu_memory_gib,
                estimated_tflops_per_gpu=float(thr["tflops_per_gpu"]),
                measured_tflops_per_gpu=finite(row.metrics.get("tflops_per_gpu")),
                peak_phase=est.peak_phase,
            )
        )
        if calibrate and peak is not None and row.status in ("ok", "oom"):
            cm.observe(params, peak, row.status == "oom")
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None for fewer than 3 pairs."""
    if len(x) != len(y) or len(x) < 3:
        return None

    def ranks(v: Sequence[float]) -> np.ndarray:
        arr = np.asarray(v, dtype=float)
        order = np.argsort(arr, kind="mergesort")
        r = np.empty(len(arr))
        r[order] = np.arange(len(arr), dtype=float)
        for val in np.unique(arr):
            idx = arr == val
            r[idx] = r[idx].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def summarize(results: Iterable[RowResult]) -> dict[str, Any]:
    """OOM-vs-fits accuracy, median |relative error| of the peak, and rank correlation.

    Accuracy counts ok and oom rows that declare a capacity (an ok row must be predicted to
    fit, an oom row not to); invalid/error rows are excluded. The error is over ok rows with
    a measured peak. The rank correlation is the estimated vs measured TFLOP/s of ok rows.
    """
    res = list(results)
    judged = [r for r in res if r.status in ("ok", "oom") and r.capacity_gib is not None]
    correct = [r.predicted_fits == (r.status == "ok") for r in judged]
    errs = [
        abs(r.predicted_peak_mem_gib - r.measured_peak_mem_gib) / r.measured_peak_mem_gib
        for r in res
        if r.status == "ok" and r.measured_peak_mem_gib
    ]
    speed = [
        (r.estimated_tflops_per_gpu, r.measured_tflops_per_gpu)
        for r in res
        if r.status == "ok" and r.measured_tflops_per_gpu is not None
    ]
    return {
        "rows": len(res),
        "judged_rows": len(judged),
        "fits_accuracy": (sum(correct) / len(correct)) if correct else None,
        "ok_rows": len(errs),
        "median_abs_rel_error": statistics.median(errs) if errs else None,
        "max_abs_rel_error": max(errs) if errs else None,
        "tflops_spearman": spearman([a for a, _ in speed], [b for _, b in speed]),
        "source": "estimate",
    }
