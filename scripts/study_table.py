"""Write a measured table (replay format) from a ``dse export`` of a study of measured trials.

    python scripts/study_table.py study.json -o table.jsonl [--source TEXT]

One row per finished trial (complete or pruned -> ``ok``, an OOM -> ``oom``, invalid ->
``invalid``, other failures -> ``error``); queued, running and estimated (sim) trials are left
out. The row's ``model`` comes from the study's own space file through the one schema every
table reader shares (:mod:`dse.space.tablemodel`), its ``params`` are the trial's full
configuration (fixed values included), its ``hardware`` the space's GPU and memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dse.space.searchspace import SearchSpace
from dse.space.tablemodel import model_row

_OK_KEYS = ("tflops_per_gpu", "step_time_s", "peak_mem_gib", "peak_reserved_gib",
            "step_time_ci_s", "tflops_per_gpu_ci", "measurement", "first_step_s")  # fmt: skip


def rows_of(export: dict[str, Any], source: str | None = None) -> list[dict[str, Any]]:
    """The table rows of an exported study (see the module docstring)."""
    import yaml

    space = SearchSpace.model_validate(yaml.safe_load(export["study"]["space_yaml"]))
    model = model_row(space.model, space.semantics)
    res = space.resources
    hw: dict[str, Any] = {"gpu": res.gpu, "gpu_memory_gib": res.gpu_memory_gib}
    out: list[dict[str, Any]] = []
    for t in sorted(export.get("trials", []), key=lambda t: t.get("number", 0)):
        m = t.get("metrics") or {}
        if t.get("source") not in (None, "measured"):
            continue
        state, fc = t.get("state"), t.get("failure_class")
        if state in ("complete", "pruned"):
            status = "ok"
            metrics = {k: m[k] for k in _OK_KEYS if k in m}
            metrics["loss"] = list(m.get("losses") or [m.get("loss")])
        elif state in ("failed", "infeasible") and fc in ("oom", "invalid"):
            status = fc
            metrics = {k: m[k] for k in ("peak_mem_gib",) if k in m}
            metrics["error"] = t.get("reason") or fc
        elif state == "failed":
            status, metrics = "error", {"error": t.get("reason") or fc or "failed"}
        else:
            continue
        feats = m.get("features")
        row = {
            "params": space.full_params(t.get("params") or {}),
            "status": status,
            "metrics": metrics,
            "world_size": res.world_size,
            "model": model,
            "hardware": {**hw, **({"features": feats} if isinstance(feats, list) else {})},
        }
        if source:
            row["source"] = f"{source}, trial {t.get('number')}"
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("export", help="a `dse export` JSON file")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--source", help="where the study was measured (kept in each row)")
    args = ap.parse_args(argv)
    rows = rows_of(json.loads(Path(args.export).read_text()), args.source)
    if not rows:
        sys.stderr.write(f"{args.export}: no measured trial\n")
        return 2
    Path(args.out).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    sys.stdout.write(f"{len(rows)} rows -> {args.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
