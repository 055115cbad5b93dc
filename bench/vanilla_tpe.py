"""Vanilla Optuna TPE on a measured table, counted like ``dse bench`` (the comparison point).

What a user would write without dse: a study with ``optuna.samplers.TPESampler(seed=s)``
(default settings: 10 random start-up trials, independent sampling), every knob a
categorical over the table's values, the table's baseline enqueued first, a configuration
that ran out of memory or has no row returned as a failed trial. A repeated configuration
is answered from the first measurement and is not counted (as in ``dse bench``, where
duplicates are never run). Prints, per seed, the trials (baseline included) until one within
``--target-gap`` of the table's best, and the median. Also runs ``dse bench``'s agents on
the same table with ``--no-prior --no-estimate`` (the samplers alone; ``--estimate``: with
the cost model's speed estimate as their start) for the side-by-side figure.

    python bench/vanilla_tpe.py --table ../shared/data/h200_llama1b_unfused_1gpu.jsonl
        [--seeds 20] [--agents tpe,gp,random] [--startup 10] [--multivariate] [--estimate]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import optuna

from dse.cli.bench import bench
from dse.model.rules import check
from dse.space.searchspace import params_key
from dse.workloads.replay import ReplayTable


def vanilla_run(
    table: ReplayTable, seed: int, target: float, budget: int, startup: int, multivariate: bool
) -> int | None:
    space = table.to_space(study="vanilla")
    knobs = {name: spec.values() for name, spec in space.knobs.items()}
    sampler = optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=startup, multivariate=multivariate
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline())
    measured: set[str] = set()
    trials = 0
    for _ in range(budget * 50):
        trial = study.ask()
        params = {k: trial.suggest_categorical(k, v) for k, v in knobs.items()}
        # twins that differ only in a knob Megatron ignores are one row of the table
        params = space.apply_conditions(params)
        key = params_key(params)
        row = table.lookup(params)
        ok = row is not None and row.status == "ok" and not check(space, params, [])
        if key not in measured and row is not None and row.status != "invalid":
            measured.add(key)
            trials += 1
        value = float(row.metrics["tflops_per_gpu"]) if ok and row is not None else None
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)
        if value is not None and value >= target - 1e-12:
            return trials
        if trials >= budget:
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--agents", default="tpe,random")
    ap.add_argument("--startup", type=int, default=10, help="TPESampler n_startup_trials")
    ap.add_argument("--multivariate", action="store_true")
    ap.add_argument("--target-gap", type=float, default=0.02)
    ap.add_argument("--estimate", action="store_true", help="dse's agents with the speed estimate")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rep = bench(
        args.table, args.agents.split(","), seeds=args.seeds, prior=False, estimate=args.estimate
    )
    table = ReplayTable.load(args.table)
    target = rep["best_value"] * (1 - args.target_gap)
    ttt = [
        vanilla_run(table, s, target, rep["n_valid"], args.startup, args.multivariate)
        for s in range(args.seeds)
    ]
    vals = sorted(float("inf") if t is None else float(t) for t in ttt)
    out: dict[str, Any] = {
        "table": args.table,
        "n_valid": rep["n_valid"],
        "medians": {a: r["median_trials_to_target"] for a, r in rep["agents"].items()},
        "vanilla_tpe": {"median": statistics.median(vals), "trials_to_target": ttt},
    }
    if args.json:
        print(json.dumps(out))
        return 0
    how = "speed estimate" if args.estimate else "no speed estimate"
    print(
        f"{args.table}: {rep['n_valid']} valid configurations, {args.seeds} seeds, no prior, {how}"
    )
    for a, r in rep["agents"].items():
        per = " ".join("-" if t is None else str(t) for t in r["trials_to_target"])
        print(f"  dse {a:8s} median {r['median_trials_to_target']!s:>5}   {per}")
    per = " ".join("-" if t is None else str(t) for t in ttt)
    label = f"vanilla TPE (startup {args.startup}{', multivariate' if args.multivariate else ''})"
    print(f"  {label} median {statistics.median(vals):g}   {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
