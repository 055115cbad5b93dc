"""Measured tables in the replay format: reading rows, and a row's model as space fields.

A table is JSON Lines, one measured configuration a line (see the shared data README)::

    {"params": {...knobs...}, "status": "ok" | "oom" | "invalid" | "error",
     "metrics": {"tflops_per_gpu", "step_time_s", "peak_mem_gib", "peak_reserved_gib",
                 "loss": [per step], "step_times_s": [per step, optional], "error": "..."},
     "world_size": 1, "model": {...architecture, global_batch_size, seq_length, precision},
     "hardware": {"gpu": "...", "gpu_memory_gib": 139.8}}

Several rows of one configuration are repeated measurements of it (the replay answers a
configuration's re-measurements with them in turn); ``step_times_s`` gives the per-step times
its intervals come from.

Every reader reads rows here, and a row's ``model`` through one schema
(:mod:`dse.space.tablemodel`): the replay workload (``dse.workloads.replay``), which answers
trials from them, the cost model's evaluation (``dse estimate --table``, ``dse bench``) and the
estimate's basis. Each adds the checks its use needs (the replay needs the metrics of ok rows,
the cost model a model per row).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse.core.bounds import MAX_TABLE_BYTES, read_regular_file
from dse.core.exceptions import WorkloadError

__all__ = ["STATUSES", "MeasuredRow", "TableError", "read_table"]

STATUSES = ("ok", "oom", "invalid", "error")


class TableError(WorkloadError, ValueError):
    """A table file is missing, or a row of it cannot be read (the message names the line)."""


@dataclass(frozen=True)
class MeasuredRow:
    """One measured configuration of a table (``line``: its line in the file, from 1)."""

    params: dict[str, Any]
    status: str
    metrics: dict[str, Any]
    line: int
    world_size: int = 1
    model: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)

    @property
    def losses(self) -> list[float]:
        loss = self.metrics.get("loss")
        if isinstance(loss, list):
            return [float(x) for x in loss]
        return [] if loss is None else [float(loss)]


def read_table(path: str | Path) -> list[MeasuredRow]:
    """Read every row of a table; raises :class:`TableError` naming the file and the line."""
    p = Path(path)
    try:
        raw = read_regular_file(p, MAX_TABLE_BYTES)
    except OSError as e:
        raise TableError(f"replay table {p}: cannot read it ({e.strerror or e})") from e
    except ValueError as e:
        raise TableError(f"replay table {p}: {e}; a table is a JSON-lines file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TableError(
            f"replay table {p}: not UTF-8 text (byte {e.start}: {e.reason})"
        ) from None
    rows: list[MeasuredRow] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TableError(f"{p}:{i}: not JSON ({e.msg})") from e
        rows.append(_row(rec, f"{p}:{i}", i))
    if not rows:
        raise TableError(f"replay table {p}: no rows")
    return rows


def _row(rec: Any, where: str, line: int) -> MeasuredRow:
    if not isinstance(rec, dict):
        raise TableError(f"{where}: a row must be a JSON object")
    params = rec.get("params")
    if not isinstance(params, dict) or not params:
        raise TableError(f"{where}: 'params' must be a non-empty object")
    status = rec.get("status")
    if status not in STATUSES:
        raise TableError(f"{where}: 'status' must be one of {list(STATUSES)} (got {status!r})")
    metrics = rec.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise TableError(f"{where}: 'metrics' must be an object")
    if "peak_mem_gib" in metrics and not _is_num(metrics["peak_mem_gib"]):
        raise TableError(f"{where}: 'peak_mem_gib' must be a number")
    ws = rec.get("world_size", 1)
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
        raise TableError(f"{where}: 'world_size' must be a positive integer")
    model = rec.get("model") or {}
    hardware = rec.get("hardware") or {}
    if not isinstance(model, dict) or not isinstance(hardware, dict):
        raise TableError(f"{where}: 'model' and 'hardware' must be objects")
    return MeasuredRow(dict(params), status, dict(metrics), line, ws, dict(model), dict(hardware))


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
