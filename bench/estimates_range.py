"""Estimates that know their range: the figures of the estimates issue in one run.

    python bench/estimates_range.py [--seeds 10] [--sim-seeds 3] [--sim-trials 30] [--skip-bench]

1. ``dse estimate --table`` on every measured table (examples/tables, examples/studies,
   and any given with ``--table``): rows, fits-vs-OOM accuracy, median / max peak error,
   TFLOP/s Spearman.
2. ``dse bench --table`` on the grids (examples/tables and ``--table``), TPE: the default
   start (knob-semantics prior), the cost-model start (``--no-prior``), a random start
   (``--no-prior --no-estimate``), and random search: median trials (baseline included) to
   within 2% of the table's best.
   2b. The same on the llama 2B table with its speeds reassigned in the inverse order of the
   estimate (:func:`inverted_table`; ``--inverted-seeds``, default 30).
3. The Omni space (examples/nemotron_omni.yaml) without its warm start, ``workload: sim``,
   ``--sim-seeds`` studies of ``--sim-trials`` trials: simulated OOMs, pre-screen rejections,
   the trials by trust label, the highest estimate's label and the best within the measured
   range.

Every figure of parts 1 and 3 is an estimate (cost model); part 2 replays measured tables.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from dse.cli.bench import bench
from dse.model.costmodel.table import evaluate_rows, load_table, summarize

ROOT = Path(__file__).resolve().parents[1]


def tables(extra: list[str]) -> list[Path]:
    """The measured grids (examples/tables) and any given."""
    return sorted((ROOT / "examples" / "tables").glob("*.jsonl")) + [Path(p) for p in extra]


def studies() -> list[Path]:
    """Measured studies as tables (examples/studies): a study's trials, not a grid, so not a
    bench terrain (its space holds many configurations no trial measured)."""
    return sorted((ROOT / "examples" / "studies").glob("*.jsonl"))


def estimate_part(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        s = summarize(evaluate_rows(load_table(p)))
        out.append({"table": p.name, **{k: s[k] for k in (
            "rows", "judged_rows", "fits_accuracy", "median_abs_rel_error", "max_abs_rel_error",
            "tflops_spearman")}})  # fmt: skip
    return out


def inverted_table(src: Path, out: Path) -> Path:
    """Write ``src`` with its TFLOP/s reassigned in the inverse order of the cost model's
    estimate (the estimate's best row measures the table's worst figure; step times follow).
    A terrain on which the estimate is exactly wrong; no measurement."""
    from dse.model.costmodel import CostModel
    from dse.model.costmodel.table import row_problem
    from dse.stats.table import read_table

    recs = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    est = []
    for r in read_table(src):
        model, sem, res, params = row_problem(r)
        est.append(CostModel(model, sem, res).estimate_throughput(params)["tflops_per_gpu"])
    ok = [i for i, r in enumerate(recs) if r["status"] == "ok"]
    values = sorted((recs[i]["metrics"]["tflops_per_gpu"] for i in ok), reverse=True)
    for i, v in zip(sorted(ok, key=lambda i: est[i]), values, strict=True):
        m = recs[i]["metrics"]
        m["step_time_s"] *= m["tflops_per_gpu"] / v
        m["tflops_per_gpu"] = v
        m.pop("step_time_ci_s", None)
        m.pop("tflops_per_gpu_ci", None)
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return out


def inverted_part(seeds: int) -> dict[str, Any]:
    """The cost-model start, a random start and random search on the inverted llama 2B table."""
    src = ROOT / "examples" / "tables" / "h200_llama2b_sdpa_1gpu.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        table = str(inverted_table(src, Path(tmp) / "inverted.jsonl"))

        def median(agent: str, **kw: Any) -> float | None:
            rep = bench(table, [agent], seeds=seeds, **kw)
            return rep["agents"][agent]["median_trials_to_target"]

        return {
            "table": f"{src.name}, speed order inverted against the estimate",
            "cost_model_start": median("tpe", prior=False),
            "random_start": median("tpe", prior=False, estimate=False),
            "random_search": median("random"),
        }


def bench_part(paths: list[Path], seeds: int) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        row: dict[str, Any] = {"table": p.name}
        modes = {
            "default_start": {"prior": True},
            "cost_model_start": {"prior": False},
            "random_start": {"prior": False, "estimate": False},
        }
        for name, kw in modes.items():
            rep = bench(str(p), ["tpe"], seeds=seeds, **kw)
            row[name] = rep["agents"]["tpe"]["median_trials_to_target"]
        rep = bench(str(p), ["random"], seeds=seeds)
        row["random_search"] = rep["agents"]["random"]["median_trials_to_target"]
        out.append(row)
    return out


def sim_part(n_seeds: int, n_trials: int) -> list[dict[str, Any]]:
    base = yaml.safe_load((ROOT / "examples" / "nemotron_omni.yaml").read_text())
    base["agent"].pop("warm_start", None)
    base["budget"]["n_trials"] = n_trials
    base["workload"] = {"name": "sim"}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/omni.db"
        for seed in range(n_seeds):
            d = dict(base, study=f"omni-sim-{seed}", storage=db)
            d["agent"] = dict(base["agent"], seed=seed)
            d["runner"] = {"name": "local", "workdir": f"{tmp}/runs"}
            path = Path(tmp) / f"omni{seed}.yaml"
            path.write_text(yaml.safe_dump(d))
            subprocess.run([sys.executable, "-m", "dse.cli", "start", "--space", str(path)],
                           check=True, capture_output=True, cwd=tmp)  # fmt: skip
            st = subprocess.run(
                [sys.executable, "-m", "dse.cli", "status", "--study", d["study"],
                 "--storage", db, "--format", "json"],
                check=True, capture_output=True, text=True, cwd=tmp,
            )  # fmt: skip
            s = json.loads(st.stdout)
            trials = s["trials"]
            oom = sum(1 for t in trials if t.get("failure_class") == "oom")
            tr = s.get("trust") or {}
            best, trusted = tr.get("best") or {}, tr.get("trusted_best") or {}
            out.append({
                "seed": seed,
                "trials": len(trials),
                "simulated_ooms": oom,
                "rejected_before_launch": sum(s["rejections"].values()),
                "trust_counts": tr.get("counts"),
                "highest_estimate": [best.get("number"), best.get("value"), best.get("label")],
                "best_within_measured_range": [trusted.get("number"), trusted.get("value"),
                                               trusted.get("label")],
            })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--inverted-seeds", type=int, default=30)
    ap.add_argument("--sim-seeds", type=int, default=3)
    ap.add_argument("--sim-trials", type=int, default=30)
    ap.add_argument("--table", action="append", default=[])
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args(argv)
    paths = tables(args.table)
    w = sys.stdout.write
    w("1. dse estimate --table (estimates, uncalibrated)\n")
    for r in estimate_part(paths + studies()):
        w(json.dumps(r) + "\n")
    if not args.skip_bench:
        w(f"2. dse bench --table, TPE, {args.seeds} seeds: median trials to within 2%\n")
        for r in bench_part(paths, args.seeds):
            w(json.dumps(r) + "\n")
    if not args.skip_bench:
        w(f"2b. an estimate that orders the table backwards, TPE, {args.inverted_seeds} seeds\n")
        w(json.dumps(inverted_part(args.inverted_seeds)) + "\n")
    w(f"3. Omni sim without warm start, {args.sim_seeds} seeds x {args.sim_trials} trials\n")
    for r in sim_part(args.sim_seeds, args.sim_trials):
        w(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
