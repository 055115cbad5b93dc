"""Summarise a hybrid (Mamba-MoE) GPU run: a ``dse start`` study and/or a measured table.

    python bench/hybrid_summary.py --space SPACE.yaml [--export study.json] \
        [--table table.jsonl] -o summary.json

Study (``dse export`` JSON): the best TFLOP/s/GPU and its configuration; per trial its peak
memory against the cost model's prediction (estimates: median |relative error|, OOM-vs-fits),
its loss curve against the baseline's (largest |difference| per step, and the loss guard's
verdict where the study stored one), the first-step and build seconds (the first trial of a
worker compiles the Triton kernels; later ones read them) and the Mamba kernels it ran on.

Table (``bench/measure_table.py`` rows): the cost model's accuracy before any fit (all
rows), and after a fit on the even-numbered rows checked on the odd-numbered ones (held
out; row numbers from 0 in file order), as :func:`dse.model.costmodel.table.summarize` reports it.
Every predicted figure is an estimate and says so (``source: estimate``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from dse.model.costmodel import CostModel
from dse.model.costmodel.table import evaluate_rows, load_table, row_problem, summarize
from dse.space.searchspace import load_space

_TRIAL_KEYS = ("tflops_per_gpu", "step_time_s", "peak_mem_gib", "peak_reserved_gib",
               "first_step_s", "build_s", "warmup_steps_s", "measured_steps_s", "mamba_kernels",
               "init", "worker", "triton_autotune", "measurement", "setup_s",
               "step_gaps_s")  # fmt: skip


def study_summary(space_path: str, export_path: str) -> dict[str, Any]:
    space = load_space(space_path)
    data = json.loads(Path(export_path).read_text())
    cm = CostModel(space.model, space.semantics, space.resources)
    trials = sorted(data.get("trials", []), key=lambda t: t.get("number", 0))
    rows: list[dict[str, Any]] = []
    base_loss: list[float] | None = None
    for t in trials:
        m = t.get("metrics") or {}
        params = space.full_params(t.get("params") or {})
        est = cm.predict_memory(params)
        fits, total = cm.fits(params, 0.0)
        losses = [float(x) for x in m.get("losses") or []]
        if base_loss is None and losses and t.get("state") == "complete":
            base_loss = losses
        row = {
            "number": t.get("number"),
            "state": t.get("state"),
            "failure_class": t.get("failure_class"),
            "params": t.get("params"),
            **{k: m.get(k) for k in _TRIAL_KEYS},
            "predicted_peak_mem_gib": round(est.allocated_gib, 3),
            "predicted_total_gib": round(total, 3),
            "predicted_fits": fits,
            "losses": losses,
            "numerics": m.get("numerics"),
        }
        if base_loss and losses:
            n = min(len(base_loss), len(losses))
            row["max_abs_loss_diff_vs_baseline"] = max(
                abs(a - b) for a, b in zip(base_loss[:n], losses[:n], strict=True)
            )
        rows.append(row)
    done = [r for r in rows if r["state"] == "complete" and r["tflops_per_gpu"]]
    best = max(done, key=lambda r: r["tflops_per_gpu"]) if done else None
    errs = [abs(r["predicted_peak_mem_gib"] - r["peak_mem_gib"]) / r["peak_mem_gib"]
            for r in done if r["peak_mem_gib"]]  # fmt: skip
    judged = [r for r in rows if r["state"] == "complete" or r["failure_class"] == "oom"]
    right = [r["predicted_fits"] == (r["state"] == "complete") for r in judged]
    first = [r["first_step_s"] for r in rows if r["first_step_s"] is not None]
    diffs = [r["max_abs_loss_diff_vs_baseline"] for r in rows
             if "max_abs_loss_diff_vs_baseline" in r]  # fmt: skip
    return {
        "trials": len(rows),
        "complete": len(done),
        "best": best
        and {
            k: best[k]
            for k in ("number", "params", "tflops_per_gpu", "step_time_s", "peak_mem_gib")
        },  # fmt: skip
        "memory_estimate": {
            "median_abs_rel_error": statistics.median(errs) if errs else None,
            "fits_accuracy": sum(right) / len(right) if right else None,
            "judged": len(right),
            "source": "estimate",
        },
        "first_step_s": {
            "first_trial": first[0] if first else None,
            "later_median": statistics.median(first[1:]) if len(first) > 1 else None,
        },  # fmt: skip
        "max_abs_loss_diff_vs_baseline": max(diffs) if diffs else None,
        "rows": rows,
    }


def table_summary(table_path: str) -> dict[str, Any]:
    rows = load_table(table_path)
    before = summarize(evaluate_rows(rows))
    fit_idx = [i for i in range(len(rows)) if i % 2 == 0]
    check_idx = [i for i in range(len(rows)) if i % 2 == 1]
    models: dict[str, CostModel] = {}

    def model_of(i: int) -> tuple[CostModel, dict[str, Any]]:
        model, sem, res, params = row_problem(rows[i])
        key = json.dumps([model.model_dump(), sem.model_dump(), res.model_dump()],
                         sort_keys=True, default=str)  # fmt: skip
        if key not in models:
            models[key] = CostModel(model, sem, res)
        return models[key], params

    for i in fit_idx:
        r = rows[i]
        peak = r.metrics.get("peak_mem_gib")
        if r.status in ("ok", "oom") and isinstance(peak, int | float):
            cm, params = model_of(i)
            cm.observe(params, float(peak), r.status == "oom")
    # the held-out rows, predicted by the fitted models (evaluate_rows builds fresh ones, so
    # the check is done here with the same arithmetic as summarize's)
    held = []
    for i in check_idx:
        r = rows[i]
        cm, params = model_of(i)
        fits, _total = cm.fits(params, 0.0)
        held.append((r, cm.predict_memory(params).allocated_gib, fits))
    errs = [abs(p - r.metrics["peak_mem_gib"]) / r.metrics["peak_mem_gib"]
            for r, p, _ in held if r.status == "ok" and r.metrics.get("peak_mem_gib")]  # fmt: skip
    judged = [(r, f) for r, _, f in held if r.status in ("ok", "oom")]
    return {
        "rows": len(rows),
        "status_counts": {s: sum(r.status == s for r in rows) for s in {r.status for r in rows}},
        "before_fit_all_rows": before,
        "fit_rows": fit_idx,
        "check_rows": check_idx,
        "after_fit_on_check_rows": {
            "median_abs_rel_error": statistics.median(errs) if errs else None,
            "max_abs_rel_error": max(errs) if errs else None,
            "fits_accuracy": (sum(f == (r.status == "ok") for r, f in judged) / len(judged))
            if judged
            else None,  # fmt: skip
            "calibration": [cm.calibration() for cm in models.values()],
            "source": "estimate",
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--space", required=True)
    ap.add_argument("--export", help="dse export JSON of the study")
    ap.add_argument("--table", help="measured table (JSONL)")
    ap.add_argument("--status", help="dse status --format json of the study")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    out: dict[str, Any] = {}
    if args.export:
        out["study"] = study_summary(args.space, args.export)
    if args.table:
        out["table"] = table_summary(args.table)
    if args.status:  # dse status --format json: the GPU time and its accounting
        try:
            gpu = json.loads(Path(args.status).read_text()).get("gpu") or {}
        except (OSError, ValueError):
            gpu = {}
        out["gpu_time"] = {
            k: gpu.get(k)
            for k in ("device_seconds_held", "measured_fraction", "busy_fraction",
                      "kernel_fraction", "first_step_s_median", "first_step_s_max",
                      "accounting")
        }  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    short = {k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in out.items()}
    if "study" in out:  # each trial's first step and where it ran (which worker, its n-th trial)
        short["study"]["first_steps"] = [
            [r["number"], r["first_step_s"], (r.get("worker") or {}).get("pid"),
             (r.get("worker") or {}).get("trial_in_worker"), r.get("triton_autotune")]
            for r in out["study"]["rows"]
        ]  # fmt: skip
    print(json.dumps(short, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
