"""Derive the estimate's basis (dse/model/costmodel/estimate_basis.json) from measured data.

    python scripts/derive_estimate_basis.py [--check]

Reads every measured table in examples/tables/ (grids) and examples/studies/ (a study's
measured trials), and every published figure in examples/published/ (replay format; a row's
``source`` names where it comes from) and writes, per data set (a file, one model and GPU),
what :mod:`dse.model.costmodel.basis` needs: its family, GPU, size, layer kinds, the layout
range and the layouts it measured, and the error bands of the estimate on its held-out rows:

* speed: the estimate's scale (measured / estimated TFLOP/s, median) fitted on the even ok
  rows (row numbers from 0 in file order), its relative error checked on the odd ones; the
  band is the largest such error (None with fewer than 2 ok rows);
* memory: the uncalibrated peak (``torch.cuda.max_memory_allocated``'s figure) against the
  measured one on every ok row (the memory model fits nothing to these tables); the band is
  the largest relative error. Rows that record only a device-level peak are left out.

``--check`` exits 1 when the packaged file differs from what the data give (the test suite
runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from dse.model.costmodel._params import total_params
from dse.model.costmodel.basis import BASIS_FILE, COORDINATES, coordinates, family, fingerprint
from dse.model.costmodel.model import CostModel
from dse.model.costmodel.throughput import gpu_spec
from dse.space.knobs import KNOBS
from dse.space.tablemodel import row_problem
from dse.stats.table import read_table

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("examples/tables", "examples/studies", "examples/published")
OUT = ROOT / "dse" / "model" / "costmodel" / BASIS_FILE


def entry(path: Path) -> dict[str, Any]:
    rows = read_table(path)
    first = rows[0]
    model, sem, res = row_problem(
        first.model, first.world_size, first.hardware, [r.params for r in rows]
    )
    cm = CostModel(model, sem, res)
    points: list[list[Any]] = []
    ranges: dict[str, Any] = {c: [] for c in COORDINATES}
    ok = []
    mem_err: list[float] = []
    for i, r in enumerate(rows):
        params = {k: v for k, v in r.params.items() if k in KNOBS}
        if r.status not in ("ok", "oom"):
            continue
        c = coordinates(model, sem, res, params)
        point = [c[k] for k in COORDINATES]
        if point not in points:
            points.append(point)
        for k in COORDINATES:
            ranges[k].append(c[k])
        if r.status != "ok":
            continue
        est = cm.estimate_throughput(params)["tflops_per_gpu"]
        tf = r.metrics.get("tflops_per_gpu")
        if isinstance(tf, int | float) and tf > 0:
            ok.append((i, float(tf) / float(est)))
        peak = r.metrics.get("peak_mem_gib")
        if isinstance(peak, int | float) and peak > 0:
            pred = cm.predict_memory(params).allocated_gib
            mem_err.append(abs(pred - float(peak)) / float(peak))
    fit = [ratio for j, (_, ratio) in enumerate(ok) if j % 2 == 0]
    check = [ratio for j, (_, ratio) in enumerate(ok) if j % 2 == 1]
    speed_band = None
    scale = None
    if fit and check:
        scale = statistics.median(fit)
        speed_band = round(max(abs(scale / r - 1.0) for r in check), 4)
    out_ranges: dict[str, Any] = {}
    for k in COORDINATES:
        vals = ranges[k]
        out_ranges[k] = sorted(set(vals)) if k == "recompute" else [min(vals), max(vals)]
    return {
        "name": path.relative_to(ROOT).as_posix(),
        "family": family(model),
        "gpu": gpu_spec(res.gpu).name,
        "fingerprint": fingerprint(model),
        "params": total_params(model, sem.seq_length),
        "layer_kinds": sorted(k for k, n in model.layer_counts().items() if n),
        "ranges": out_ranges,
        "points": points,
        "rows": len(rows),
        "ok_rows": len(ok),
        "speed_scale": None if scale is None else round(scale, 4),
        "speed_band": speed_band,
        "memory_band": round(max(mem_err), 4) if mem_err else None,
    }


def derive() -> dict[str, Any]:
    files = sorted(p for d in SOURCES for p in (ROOT / d).glob("*.jsonl"))
    return {
        "note": "written by scripts/derive_estimate_basis.py; estimates, not measurements",
        "entries": [entry(p) for p in files],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = json.dumps(derive(), indent=1, sort_keys=True) + "\n"
    if args.check:
        if OUT.read_text() != text:
            sys.stderr.write(f"{OUT.name} is not what the measured data give: re-run {__file__}\n")
            return 1
        return 0
    OUT.write_text(text)
    sys.stdout.write(f"wrote {OUT.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
