"""GPU-busy fraction of a study: a process per trial against warm trial workers.

Runs the same space twice with the same agent and seed, once with
``runner.options.warm_workers: false`` (a process per trial) and once with ``true`` (one warm
worker per GPU slot), and prints for each: the study's wall time, its GPU-busy fraction
(device-seconds in training steps / device-seconds held, ``dse.results.gpu_usage``, read from
``dse status --format json``), the median start-up and measured seconds of a trial, the
warm workers' recycles, and the best configuration and its value; then whether both runs name
the same best within 2%, and how the configurations both measured compare:

    python bench/gpu_busy.py examples/tiny_gpt_cpu.yaml --world-size 1 --trials 6 --out OUT
    python bench/gpu_busy.py examples/llama_1b_h200.yaml --out OUT          # a 2-GPU node

Options: ``--trials`` (budget), ``--steps`` (steps per trial), ``--world-size``,
``--agent`` (e.g. ``random``: the same configurations in both runs), ``--only
process|warm``. Results go to OUT (study databases, progress logs, ``report.json``). On a
GPU node without network run it through ``bench/gpu_busy.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

MODES = {"process": False, "warm": True}


def _variant(src: Path, out: Path, mode: str, args: argparse.Namespace) -> tuple[Path, str]:
    data = yaml.safe_load(src.read_text())
    data["study"] = f"{data['study']}-{mode}"
    runner = data.setdefault("runner", {})
    runner["workdir"] = str(out / mode / "runs")
    runner["options"] = {**(runner.get("options") or {}), "warm_workers": MODES[mode]}
    if args.trials:
        data["budget"]["n_trials"] = args.trials
    if args.steps:
        data["semantics"]["steps"] = args.steps
    if args.world_size:
        data["resources"]["world_size"] = args.world_size
    if args.agent:
        data["agent"] = {**data.get("agent", {}), "name": args.agent}
    p = out / mode / "space.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p, data["study"]


def _dse(*args: str, log: Path | None = None, timeout: float = 3600) -> str:
    cmd = [sys.executable, "-m", "dse.cli", *args]
    if log is None:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    with open(log, "w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    return ""


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_mode(src: Path, out: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    space, study = _variant(src, out, mode, args)
    db = f"sqlite:///{out / mode / 'study.db'}"
    t0 = time.monotonic()
    _dse("start", "--space", str(space), "--storage", db, log=out / mode / "progress.log")
    wall = time.monotonic() - t0
    status = json.loads(_dse("status", "--storage", db, "--study", study, "--format", "json"))
    trials = status["trials"]
    timing = [t["metrics"]["timing"] for t in trials if "timing" in t["metrics"]]
    workers = [t["metrics"].get("worker") or {} for t in trials]
    events = out / mode / "runs" / study / "workers" / "events.jsonl"
    recycles: list[str] = []
    if events.exists():
        for line in events.read_text().splitlines():
            e = json.loads(line)
            if e.get("event") == "recycle":
                recycles.append(str(e.get("why")))
    best = status["best"]
    per_trial = _per_trial(db, study)
    return {
        "mode": mode,
        "study": study,
        "wall_s": wall,
        "counts": status["counts"],
        "gpu": status["gpu"],
        "startup_s_median": _median([x["startup_s"] for x in timing]),
        "measure_s_median": _median([x["measure_s"] for x in timing]),
        "workers": sorted({w["pid"] for w in workers if w.get("pid")}),
        "recycles": recycles,
        "best": None
        if best is None
        else {"trial": best["number"], "value": best["value"], "params": best["params"]},
        "trials": per_trial,
        "values": {
            json.dumps(t["params"], sort_keys=True): t["value"]
            for t in trials
            if t["state"] == "complete" and t["value"] is not None
        },
    }


def _per_trial(db: str, study: str) -> list[dict[str, Any]]:
    """Each trial's worker, start-up, first step and steady step time (what the held time
    went to)."""
    from dse.storage import open_storage

    st = open_storage(db)
    try:
        rec = st.get_study(study)
        trials = st.list_trials(rec.id, with_steps=True)
    finally:
        st.close()
    out = []
    for t in trials:
        tm = t.metrics.get("timing") or {}
        w = t.metrics.get("worker") or {}
        steps = [s.step_time_s for s in t.steps]
        out.append({
            "number": t.number, "state": t.state, "value": t.value,
            "worker": w.get("pid"), "trial_in_worker": w.get("trial_in_worker"),
            "waited_for_worker_s": w.get("waited_for_worker_s"),
            "wall_s": tm.get("wall_s"), "startup_s": tm.get("startup_s"),
            "measure_s": tm.get("measure_s"), "first_step_s": steps[0] if steps else None,
            "steady_step_s": statistics.median(steps[1:]) if len(steps) > 1 else None,
        })  # fmt: skip
    return out


def _trial_table(r: dict[str, Any]) -> list[str]:
    lines = ["          #  worker(trial)  wall s  start-up s  steps s  first step s  steady s"]
    for t in r["trials"]:
        who = f"{t['worker']}({t['trial_in_worker']})" if t["worker"] else "process"
        lines.append(
            f"        {t['number']:>3}  {who:>13}  {_fmt(t['wall_s'], '7.2f')}  "
            f"{_fmt(t['startup_s'], '10.2f')}  {_fmt(t['measure_s'], '7.2f')}  "
            f"{_fmt(t['first_step_s'], '12.2f')}  {_fmt(t['steady_step_s'], '8.3f')}"
        )
    return lines


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def report(runs: dict[str, dict[str, Any]], device: str, detail: bool = False) -> str:
    lines = [f"device: {device}"]
    for mode, r in runs.items():
        g = r["gpu"]
        busy = g["busy_fraction"]
        lines.append(
            f"{mode:>8}: wall {r['wall_s']:.1f} s, {r['counts'].get('complete', 0)} complete of "
            f"{r['counts'].get('total', 0)}, busy {_fmt(busy and busy * 100, '.1f')}% "
            f"({_fmt(g['device_seconds_measure'])} s in steps / {_fmt(g['device_seconds_held'])} "
            f"s held), trial start-up median {_fmt(r['startup_s_median'])} s, steps median "
            f"{_fmt(r['measure_s_median'])} s, GPU-hours {_fmt(g['gpu_hours'])}"
            + (
                f", workers {len(r['workers'])}, recycles {len(r['recycles'])}"
                if mode == "warm"
                else ""
            )  # fmt: skip
        )
        b = r["best"]
        if b:
            lines.append(f"          best: trial {b['trial']} {_fmt(b['value'])} {b['params']}")
        if detail:
            lines += _trial_table(r)
    if len(runs) == 2:
        a, b = runs["process"], runs["warm"]
        if a["best"] and b["best"]:
            same = a["best"]["params"] == b["best"]["params"]
            ratio = b["best"]["value"] / a["best"]["value"] if a["best"]["value"] else None
            ok = ratio is not None and abs(ratio - 1) <= 0.02
            lines.append(
                f"best: {'same configuration' if same else 'different configurations'}, "
                f"value warm/process {_fmt(ratio)} ({'within' if ok else 'NOT within'} 2%)"
            )
        common = sorted(set(a["values"]) & set(b["values"]))
        if common:
            rel = [b["values"][k] / a["values"][k] - 1 for k in common if a["values"][k]]
            lines.append(
                f"configurations measured by both: {len(common)}, warm/process - 1: median "
                f"{statistics.median(rel):+.2%}, worst {max(rel, key=abs):+.2%}"
            )
        lines.append(
            f"wall time: {a['wall_s']:.1f} s -> {b['wall_s']:.1f} s; busy: "
            f"{_fmt(a['gpu']['busy_fraction'], '.1%')} -> {_fmt(b['gpu']['busy_fraction'], '.1%')}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("space", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--trials", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--world-size", type=int)
    p.add_argument("--agent")
    p.add_argument("--only", choices=sorted(MODES))
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    src = args.space.resolve()
    device = str(yaml.safe_load(src.read_text())["resources"].get("device", "cpu"))
    runs: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        if args.only and mode != args.only:
            continue
        print(f"running the study with {mode} trials ...", file=sys.stderr, flush=True)
        runs[mode] = run_mode(src, out, mode, args)
        print(report({mode: runs[mode]}, device, detail=True), file=sys.stderr, flush=True)
    text = report(runs, device)
    print(text)
    (out / "report.txt").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
