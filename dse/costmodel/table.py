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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse.costmodel.model import CostModel
from dse.exceptions import DSEError
from dse.knobs import KNOBS
from dse.space import ModelSpec, Resources, Semantics

__all__ = [
    "TableError",
    "TableRow",
    "load_table",
    "row_problem",
    "evaluate_rows",
    "RowResult",
    "summarize",
    "spearman",
]

_MODEL_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "ffn_hidden_size",
    "vocab_size",
    "kv_channels",
    "normalization",
    "position_embedding_type",
    "add_bias_linear",
    "untie_embeddings_and_output_weights",
    "num_moe_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
)


class TableError(DSEError, ValueError):
    """A table file is missing or a row cannot be read."""


@dataclass(frozen=True)
class TableRow:
    """One row of a measured table."""

    index: int
    params: dict[str, Any]
    status: str
    metrics: dict[str, Any]
    world_size: int
    model: dict[str, Any]
    hardware: dict[str, Any] = field(default_factory=dict)


def load_table(path: str | Path) -> list[TableRow]:
    """Read a replay-format JSONL table; raises :class:`TableError` naming file and line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TableError(f"{p}: cannot read the table ({e.strerror})") from e
    rows: list[TableRow] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TableError(f"{p}:{n}: not JSON ({e.msg})") from e
        if not isinstance(rec, dict) or not isinstance(rec.get("params"), dict):
            raise TableError(f"{p}:{n}: a row must be an object with a 'params' object")
        if not isinstance(rec.get("model"), dict):
            raise TableError(f"{p}:{n}: the row has no 'model' object")
        rows.append(
            TableRow(
                index=len(rows),
                params=dict(rec["params"]),
                status=str(rec.get("status", "ok")),
                metrics=dict(rec.get("metrics") or {}),
                world_size=int(rec.get("world_size", 1)),
                model=dict(rec["model"]),
                hardware=dict(rec.get("hardware") or {}),
            )
        )
    if not rows:
        raise TableError(f"{p}: the table has no rows")
    return rows


def row_problem(row: TableRow) -> tuple[ModelSpec, Semantics, Resources, dict[str, Any]]:
    """The (model, semantics, resources, params) of a row; unknown knob names are dropped."""
    m = row.model
    data = {k: m[k] for k in _MODEL_FIELDS if m.get(k) is not None}
    act = m.get("activation")
    if m.get("gated_linear_unit"):
        act = "swiglu"
    elif act == "swiglu":
        act = "silu"  # an explicit non-gated table row
    if act is not None:
        data["activation"] = act
    try:
        model = ModelSpec.model_validate(data)
        sem = Semantics.model_validate(
            {
                "global_batch_size": int(m["global_batch_size"]),
                "seq_length": int(m["seq_length"]),
                "precision": m.get("precision", "bf16"),
            }
        )
        res = Resources.model_validate(
            {
                "world_size": row.world_size,
                "gpu": row.hardware.get("gpu"),
                "gpu_memory_gib": row.hardware.get("gpu_memory_gib"),
                "features": [],
            }
        )
    except (KeyError, TypeError, ValueError) as e:
        raise TableError(f"row {row.index}: cannot build the model from the row ({e})") from e
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


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def evaluate_rows(rows: Sequence[TableRow], calibrate: bool = False) -> list[RowResult]:
    """Predict every row; with ``calibrate``, sequentially: row i from a fit on rows < i.

    Rows of one table may mix models/hardware: each distinct (model, semantics, resources)
    gets its own cost model (and calibration).
    """
    models: dict[str, CostModel] = {}
    out: list[RowResult] = []
    for row in rows:
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
        peak = _num(row.metrics.get("peak_mem_gib"))
        out.append(
            RowResult(
                index=row.index,
                status=row.status,
                predicted_peak_mem_gib=est.allocated_gib,
                predicted_total_gib=total,
                predicted_fits=fits,
                measured_peak_mem_gib=peak,
                capacity_gib=res.gpu_memory_gib,
                estimated_tflops_per_gpu=float(thr["tflops_per_gpu"]),
                measured_tflops_per_gpu=_num(row.metrics.get("tflops_per_gpu")),
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
