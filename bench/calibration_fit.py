"""Time of one cost-model calibration fit as a study's observations grow.

Builds the synthetic 8B table of ``bench/synthetic_tables.py`` (cost-model estimates made
deliberately wrong; about two OOM rows for every one that runs), feeds its rows to a
:class:`dse.model.costmodel.CostModel` in order, and times the refit at a few observation counts.
A study refits after every trial (for the pre-screen, the memory hint and the stored
calibration), so this is the controller's cost per trial.

Run:  python bench/calibration_fit.py [--counts 50,100,200,400,600]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_tables import build_table  # noqa: E402

from dse.model.costmodel import CostModel  # noqa: E402
from dse.workloads.replay import ReplayTable  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", default="50,100,200,400,600")
    args = ap.parse_args(argv)
    counts = sorted(int(c) for c in args.counts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = build_table("llama8b_h100x8", 0.01, 0.1, seed=0, out=Path(tmp))
        table = ReplayTable.load(path)
    space = table.to_space(study="calibration")
    cm = CostModel(space.model, space.semantics, space.resources)
    n = n_oom = 0
    print(f"{'observations':>12} {'of them OOM':>12} {'fit s':>8}")
    for row in table.rows:
        if row.status not in ("ok", "oom"):
            continue
        oom = row.status == "oom"
        cm.observe(space.full_params(row.params), float(row.metrics["peak_mem_gib"]), oom)
        n += 1
        n_oom += oom
        if n in counts:
            t0 = time.perf_counter()
            cm.calibration()  # refits
            print(f"{n:>12} {n_oom:>12} {time.perf_counter() - t0:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
