"""The loss-parity guard and the noise-aware best on a real study: what they decide and cost.

Runs ``dse start`` on a space file with the guard's and the best's settings given here
(``--baseline-repeats``: extra baseline runs that measure the run-to-run loss noise;
``--remeasure``: re-measures of configurations tied with the best), then reads the study
back and prints one JSON object:

* ``tolerance``: the guard's tolerance, its floor, the measured noise and from how many pairs;
* ``trials``: per trial its TFLOP/s, loss-parity status and drift, ``remeasure_of``;
* ``max_drift_ok``: the largest drift of a trial judged ok (execution knobs), and
  ``margin`` = tolerance / that drift (how far the execution knobs stay inside it);
* ``flagged``: the trials flagged numerics-changed;
* ``best``: trial, pooled value, interval, pooled trials, the tie message;
* ``remeasure_trials`` and the GPU-seconds they took (``remeasure_gpu_s``) against the
  study's (``study_gpu_s``).

``--drift-fastest F`` (replay workloads only) multiplies the losses of the table's fastest
ok row by ``F`` first, to show that row flagged and never best.

On the H200 (1 GPU per trial; the integrator's machine)::

    python bench/loss_parity.py --space examples/llama_1b_h200.yaml \\
        --storage sqlite:///parity_h200.db --baseline-repeats 2 --remeasure 2

On CPU (the measured H200 table replayed; a few seconds)::

    python bench/loss_parity.py --space examples/replay_llama1b.yaml \\
        --storage sqlite:///parity_replay.db --n-trials 48 --agent grid --drift-fastest 1.01
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def make_space(args: argparse.Namespace, work: Path) -> Path:
    src = Path(args.space)
    space = yaml.safe_load(src.read_text())
    if args.study:
        space["study"] = args.study
    lp = dict(space.get("loss_parity") or {})
    lp["baseline_repeats"] = args.baseline_repeats
    space["loss_parity"] = lp
    budget = dict(space.get("budget") or {})
    budget["remeasure"] = args.remeasure
    if args.n_trials:
        budget["n_trials"] = args.n_trials
    space["budget"] = budget
    if args.agent:
        space["agent"] = {**(space.get("agent") or {}), "name": args.agent}
    space["runner"] = {**(space.get("runner") or {}), "workdir": str(work / "runs")}
    wl = space.get("workload") or {}
    if wl.get("name") == "replay":
        table = Path(wl["table"])
        table = table if table.is_absolute() else (src.parent / table).resolve()
        if args.drift_fastest is not None:
            table = drifted_table(table, args.drift_fastest, work)
        space["workload"] = {**wl, "table": str(table)}
    elif args.drift_fastest is not None:
        sys.exit("--drift-fastest applies to replay workloads only")
    out = work / "space.yaml"
    out.write_text(yaml.safe_dump(space, sort_keys=False))
    return out


def drifted_table(table: Path, factor: float, work: Path) -> Path:
    rows = [json.loads(x) for x in table.read_text().splitlines() if x.strip()]
    ok = [r for r in rows if r["status"] == "ok"]
    fastest = max(ok, key=lambda r: r["metrics"]["tflops_per_gpu"])
    fastest["metrics"]["loss"] = [x * factor for x in fastest["metrics"]["loss"]]
    out = work / f"drifted-{table.name}"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def report(url: str, study_name: str, wall_s: float) -> dict[str, Any]:
    from dse.loop.loss_guard import LOSS_PARITY_ATTR
    from dse.results.best_formats import best_payload
    from dse.storage import open_storage

    with open_storage(url) as st:
        study = st.get_study(study_name)
        trials = st.list_trials(study.id)
        attrs = st.get_study_attrs(study.id)
        payload = best_payload(st, study)
    rows = []
    for t in trials:
        v = t.metrics.get("numerics") or {}
        rows.append({
            "trial": t.number, "state": t.state, "tflops_per_gpu": t.metrics.get("tflops_per_gpu"),
            "numerics": v.get("status"), "drift": v.get("drift"), "remeasure_of": t.remeasure_of,
            "params": t.params,
        })  # fmt: skip
    ok = [r["drift"] for r in rows if r["numerics"] == "ok" and r["drift"] is not None]
    tol = attrs.get(LOSS_PARITY_ATTR) or {}
    max_ok = max(ok) if ok else None
    again = [t for t in trials if t.remeasure_of is not None]
    noise = payload["noise"]
    fig = noise["figures"].get(payload["objective"]["metric"], {})
    return {
        "study": study_name,
        "wall_s": round(wall_s, 1),
        "tolerance": tol,
        "max_drift_ok": max_ok,
        "margin": (tol.get("tolerance") / max_ok) if max_ok and tol.get("tolerance") else None,
        "flagged": [r["trial"] for r in rows if r["numerics"] == "changed"],
        "best": {
            "trial": payload["trial"],
            "value": payload["objective"]["value"],
            "ci": fig.get("ci"),
            "trials": noise["trials"],
            "tie": noise["message"],
            "numerics": (payload.get("numerics") or {}).get("status"),
            "params": payload["params"],
        },  # fmt: skip
        "remeasure_trials": len(again),
        "remeasure_gpu_s": sum(t.gpu_seconds or 0.0 for t in again),
        "study_gpu_s": sum(t.gpu_seconds or 0.0 for t in trials),
        "trials": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=str(REPO / "examples" / "llama_1b_h200.yaml"))
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", help="study name (default: the space's)")
    ap.add_argument("--baseline-repeats", type=int, default=1)
    ap.add_argument("--remeasure", type=int, default=2)
    ap.add_argument("--n-trials", type=int)
    ap.add_argument("--agent")
    ap.add_argument("--drift-fastest", type=float, help="replay: scale the fastest row's loss")
    args = ap.parse_args()

    from dse.cli.main import main as dse_main

    with tempfile.TemporaryDirectory(prefix="dse-parity-") as tmp:
        space = make_space(args, Path(tmp))
        name = yaml.safe_load(space.read_text())["study"]
        t0 = time.monotonic()
        rc = dse_main(["start", "--space", str(space), "--storage", args.storage])
        wall = time.monotonic() - t0
        if rc != 0:
            print(json.dumps({"error": f"dse start exited {rc}"}))
            return rc
        print(json.dumps(report(args.storage, name, wall), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
