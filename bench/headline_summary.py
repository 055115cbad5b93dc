"""The figures of ``bench/gpu_headline.sh`` in one table: per headline study its best with
the interval and tie, the busy shares of the held GPU time, each trial's first-step and build
cost, the warm worker's memory after each trial; then the speed A/B, the profile and the
process-vs-warm A/B.

    python bench/headline_summary.py RESULTS_DIR [--json summary.json]

``RESULTS_DIR`` holds ``study1/``, ``study2/``, ... (each from ``bench/gpu_study.sh``:
``study.db``, ``best.json``, ``status.json``, ``worker-events.jsonl``), ``speed_ab.json`` and
``warm_vs_process.json``; what is missing is left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def _load(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _trials(db: Path) -> list[dict[str, Any]]:
    from dse.storage import open_storage

    out: list[dict[str, Any]] = []
    with open_storage(f"sqlite:///{db}") as st:
        for study in st.list_studies():
            for t in st.list_trials(study.id):
                m = t.metrics or {}
                timing = m.get("timing") or {}
                out.append({
                    "number": t.number, "state": t.state, "value": t.value,
                    "remeasure_of": getattr(t, "remeasure_of", None),
                    "build_s": m.get("build_s"), "first_step_s": m.get("first_step_s"),
                    "warmup_steps_s": m.get("warmup_steps_s"),
                    "measured_steps_s": m.get("measured_steps_s"),
                    "held_s": timing.get("wall_s"), "adam_impl": m.get("adam_impl"),
                    "setup_s": m.get("setup_s"), "step_gaps_s": m.get("step_gaps_s"),
                    "steps": m.get("steps"), "worker": m.get("worker"),
                    "params": t.params,
                })  # fmt: skip
    return out


def _study(d: Path) -> dict[str, Any]:
    status = _load(d / "status.json") or {}
    best = _load(d / "best.json") or {}
    usage = status.get("gpu") or {}
    trials = _trials(d / "study.db") if (d / "study.db").exists() else []
    mem = []
    p = d / "worker-events.jsonl"
    if p.exists():
        for line in p.read_text().splitlines():
            e = json.loads(line)
            if e.get("event") in ("released", "ready", "recycle"):
                rel = e.get("release") or {}
                mem.append({
                    "event": e["event"], "pid": e.get("pid"),
                    "memory_mib": e.get("memory_mib", e.get("baseline_mib")),
                    "allocated_mib": rel.get("allocated_mib"), "why": e.get("why"),
                })  # fmt: skip
    return {"best": best, "usage": usage, "trials": trials, "worker_memory": mem}


def accounting_lines(usage: dict[str, Any]) -> list[str]:
    """The held GPU time by part (``dse status --format json``'s ``gpu.accounting``): one
    line per part, seconds, share of the held time and seconds per trial."""
    acc = usage.get("accounting") or {}
    if not acc:
        return []
    out = [f"held GPU time by part ({acc['held_s']:.1f} device-s, {acc['trials']} trials):"]
    for k, sec in acc["seconds"].items():
        out.append(f"  {k:15s} {sec:8.1f} s  {acc['shares'][k]:6.1%}  "
                   f"{acc['per_trial_s'][k]:6.2f} s/trial")  # fmt: skip
    return out


def _fmt(x: Any, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, int | float) else str(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    root = Path(args.results)
    out: dict[str, Any] = {"studies": {}}
    lines: list[str] = []
    for d in sorted(root.glob("study*")):
        if not d.is_dir():
            continue
        s = _study(d)
        out["studies"][d.name] = s
        b = s["best"]
        u = s["usage"]
        lines.append(f"== {d.name}")
        noise = (b.get("noise") or {}) if isinstance(b, dict) else {}
        fig = (noise.get("figures") or {}).get("tflops_per_gpu") or {}
        ci = fig.get("ci")
        lines.append(
            f"best: trial {b.get('trial')} {_fmt(fig.get('value', b.get('value')))} "
            f"TFLOP/s/GPU, 95% [{_fmt(ci[0]) if ci else '-'}, {_fmt(ci[1]) if ci else '-'}], "
            f"runs {noise.get('trials')}; {noise.get('message') or 'no tie'}; "
            f"params {json.dumps(b.get('params'))}"
        )
        lines.append("busy: measured steps {} of held, all steps {}, steps+builds {} "
                     "(held {} device-s)".format(
                         _fmt(u.get("measured_fraction"), ".1%"),
                         _fmt(u.get("busy_fraction"), ".1%"),
                         _fmt(u.get("kernel_fraction"), ".1%"),
                         _fmt(u.get("device_seconds_held"), ".1f")))  # fmt: skip
        lines.extend(accounting_lines(u))
        firsts = [t["first_step_s"] for t in s["trials"] if t["first_step_s"] is not None]
        builds = [t["build_s"] for t in s["trials"] if t["build_s"] is not None]
        if firsts:
            med_b = statistics.median(builds) if builds else None
            lines.append(f"first step per trial: median {statistics.median(firsts):.2f} s, "
                         f"max {max(firsts):.2f} s, sum {sum(firsts):.1f} s; build median "
                         f"{_fmt(med_b, '.2f')} s, sum {sum(builds):.1f} s")  # fmt: skip
        for t in s["trials"]:
            w = t.get("worker") or {}
            lines.append(
                f"  trial {t['number']:3d} {t['state']:9s} held {_fmt(t['held_s'], '6.2f')} s: "
                f"setup {_fmt(t['setup_s'], '.2f')} build {_fmt(t['build_s'], '.2f')} first "
                f"{_fmt(t['first_step_s'], '.2f')} warm-up {_fmt(t['warmup_steps_s'], '.2f')} "
                f"measured {_fmt(t['measured_steps_s'], '.2f')} gaps "
                f"{_fmt(t['step_gaps_s'], '.2f')} ({t['steps']} steps; worker "
                f"{w.get('pid', '-')}#{w.get('trial_in_worker', '-')})"
            )
        mems = [m for m in s["worker_memory"] if m["event"] == "released"]
        if mems:
            lines.append("worker memory after each trial (reserved MiB): "
                         + " ".join(_fmt(m["memory_mib"], ".0f") for m in mems))  # fmt: skip
            lines.append("                              (allocated MiB): "
                         + " ".join(_fmt(m["allocated_mib"], ".0f") for m in mems))  # fmt: skip
    ab = _load(root / "speed_ab.json")
    if ab:
        out["speed_ab"] = {k: ab.get(k) for k in ("summary", "errors", "parity", "adam_impl")}
        out["profile"] = ab.get("profile")
        lines.append("== speed A/B (one process, interleaved)")
        for c, v in (ab.get("summary") or {}).items():
            lines.append(f"{c:14s} {v['median_step_s']:.4f} s  {v['vs_default']:+.2%} vs "
                         f"default ({v['windows']} windows)")  # fmt: skip
        for c, e in (ab.get("errors") or {}).items():
            lines.append(f"{c:14s} refused/failed: {e[:300]}")
        for c, row in (ab.get("parity") or {}).items():
            lines.append(f"parity {c:14s} {row.get('max_rel_diff', row.get('error', 'ref'))}")
        alt = [
            w.get("even_over_odd") for w in ab.get("windows", []) if w["condition"] == "default"
        ]
        lines.append(f"default windows even/odd step ratio: {[_fmt(a, '.3f') for a in alt]}")
        p = ab.get("profile")
        if p:
            lines.append(f"profile ({p['steps']} steps, {p['device']}): " + ", ".join(
                f"{k} {v:.1%}" for k, v in p["by_kind_share"].items())
                + f"; idle {_fmt(p.get('idle_share'), '.1%')} of the step wall time")  # fmt: skip
    wvp = _load(root / "warm_vs_process.json")
    if wvp:
        out["warm_vs_process"] = wvp.get("summary")
        lines.append("== process per trial vs warm worker")
        for t in wvp.get("trials", []):
            lines.append(f"{t['mode']:10s} median step {_fmt(t['median_step_s'])} s, held "
                         f"{_fmt(t['held_s'], '.1f')} s, build {_fmt(t['build_s'], '.2f')} s, "
                         f"first step {_fmt(t['first_step_s'], '.2f')} s, even/odd "
                         f"{_fmt(t['even_over_odd'], '.3f')}")  # fmt: skip
        lines.append(json.dumps(wvp.get("summary")))
    text = "\n".join(lines)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
