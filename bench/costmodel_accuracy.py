"""Accuracy of the cost model on a measured table (replay format).

Prints, uncalibrated and sequentially calibrated (row i predicted from a fit on rows < i):
the OOM-vs-fits accuracy (ok and oom rows; an ok row must be predicted to fit, an oom row
not to), the median and max absolute relative error of the predicted peak memory over the
ok rows, and the Spearman rank correlation of the estimated vs measured TFLOP/s.

    python bench/costmodel_accuracy.py [TABLE.jsonl ...] [--json] [--rows]

The default table is examples/tables/h200_llama1b_unfused_1gpu.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dse.model.costmodel.table import TableError, evaluate_rows, load_table, summarize

DEFAULT_TABLE = (
    Path(__file__).resolve().parents[1] / "examples" / "tables" / "h200_llama1b_unfused_1gpu.jsonl"
)


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("tables", nargs="*", help=f"measured tables (default: {DEFAULT_TABLE.name})")
    ap.add_argument("--json", action="store_true", help="print one JSON object per table")
    ap.add_argument("--rows", action="store_true", help="also print every row's prediction")
    args = ap.parse_args(argv)
    tables = [Path(t) for t in args.tables] or [DEFAULT_TABLE]
    for path in tables:
        try:
            rows = load_table(path)
        except TableError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        report = {"table": path.name}
        for mode, cal in (("uncalibrated", False), ("sequentially_calibrated", True)):
            results = evaluate_rows(rows, calibrate=cal)
            report[mode] = summarize(results)
            if args.rows and not args.json:
                print(f"{path.name} ({mode}):")
                for r in results:
                    print("  " + json.dumps(r.as_dict()))
        if args.json:
            print(json.dumps(report))
            continue
        print(f"{path.name}: {len(rows)} rows (all figures are cost-model estimates)")
        for mode in ("uncalibrated", "sequentially_calibrated"):
            s = report[mode]
            print(
                f"  {mode:<24} fits accuracy {_fmt(s['fits_accuracy'], True):>6} "
                f"({s['judged_rows']} ok/oom rows)   median |rel err| "
                f"{_fmt(s['median_abs_rel_error'], True):>6}   "
                f"max {_fmt(s['max_abs_rel_error'], True):>6}"
                f"   ({s['ok_rows']} ok rows)"
            )
        print(f"  throughput rank correlation (Spearman, ok rows): "
              f"{_fmt(report['uncalibrated']['tflops_spearman'])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
