"""The built-in workload vs the same trainer through the megatron_lm launcher.

Runs two space files (the built-in one and its megatron_lm twin) on the same few
configurations, alternating the two studies for ``--rounds`` rounds so that machine load
falls on both alike, and prints each configuration's TFLOP/s per GPU, step time and final
loss for both, and the best of each:

    python bench/launcher_vs_builtin.py examples/tiny_gpt_cpu.yaml \\
        examples/tiny_gpt_cpu_megatron_lm.yaml --set micro_batch_size=1,4 --rounds 2 --out OUT

``--set knob=v1,v2`` restricts a knob to those values (every other knob at its baseline);
``--fix knob=v`` holds one. Results go to OUT (study databases, progress logs, JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def _value(text: str) -> Any:
    return yaml.safe_load(text)


def _variant(src: Path, out: Path, tag: str, sets: dict[str, list], fixes: dict[str, Any]) -> Path:
    data = yaml.safe_load(src.read_text())
    base_knobs = data["knobs"]
    knobs = {}
    for k, vals in sets.items():
        knobs[k] = {"values": vals, "baseline": vals[0]}
    fixed = dict(data.get("fixed") or {})
    for k, spec in base_knobs.items():
        if k not in knobs and k not in fixes:
            fixed[k] = spec.get("baseline", (spec.get("values") or [None])[0])
    fixed.update(fixes)
    data["knobs"], data["fixed"] = knobs, fixed
    data["study"] = f"{data['study']}-{tag}"
    data["agent"] = {"name": "grid", "seed": 0}
    n = 1
    for v in sets.values():
        n *= len(v)
    data["budget"]["n_trials"] = n
    data["prescreen"] = {"enabled": False}
    data["runner"]["workdir"] = str(out / "runs")
    p = out / f"{data['study']}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _results(db: str, study: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "dse.cli", "status", "--storage", db, "--study", study,
         "--format", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(out)["trials"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builtin")
    ap.add_argument("launcher")
    ap.add_argument("--set", action="append", default=[], help="knob=v1,v2")
    ap.add_argument("--fix", action="append", default=[], help="knob=v")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sets = {k: [_value(x) for x in v.split(",")] for k, v in (s.split("=", 1) for s in args.set)}
    fixes = {k: _value(v) for k, v in (s.split("=", 1) for s in args.fix)}
    db = f"sqlite:///{out}/bench.db"
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {"builtin": {}, "megatron_lm": {}}
    for r in range(args.rounds):
        for kind, src in (("builtin", args.builtin), ("megatron_lm", args.launcher)):
            space = _variant(Path(src), out, f"{kind}-r{r}", sets, fixes)
            study = yaml.safe_load(space.read_text())["study"]
            with open(out / f"{study}.log", "w") as log:
                rc = subprocess.run(
                    [sys.executable, "-m", "dse.cli", "start", "--space", str(space),
                     "--storage", db],
                    stdout=log, stderr=subprocess.STDOUT,
                ).returncode  # fmt: skip
            if rc != 0:
                sys.stdout.write(f"{study}: dse start exited {rc} (see {out}/{study}.log)\n")
            for t in _results(db, study):
                key = json.dumps({k: t["params"][k] for k in sorted(sets)})
                rows[kind].setdefault(key, []).append(t)
    report: dict[str, Any] = {"configs": {}, "best": {}}
    lines = [f"{'configuration':<40} {'workload':<12} {'TFLOP/s/GPU (each round)':<34} "
             f"{'step s':>8} {'loss':>9}"]  # fmt: skip
    for kind, by_cfg in rows.items():
        best = 0.0
        for key, ts in sorted(by_cfg.items()):
            tf = [t["metrics"].get("tflops_per_gpu") for t in ts if t["state"] == "complete"]
            st = [t["metrics"].get("step_time_s") for t in ts if t["state"] == "complete"]
            loss = [t["metrics"].get("loss") for t in ts if t["state"] == "complete"]
            states = [t["state"] if t["state"] == "complete" else t["failure_class"] for t in ts]
            report["configs"].setdefault(key, {})[kind] = {
                "tflops_per_gpu": tf, "step_time_s": st, "loss": loss, "states": states,
            }  # fmt: skip
            if tf:
                best = max(best, statistics.median(tf))
            lines.append(
                f"{key:<40} {kind:<12} {', '.join(f'{x:.4g}' for x in tf) or str(states):<34} "
                f"{statistics.median(st) if st else float('nan'):>8.4f} "
                f"{loss[-1] if loss else float('nan'):>9.6f}"
            )
        report["best"][kind] = best
    b, m = report["best"]["builtin"], report["best"]["megatron_lm"]
    lines.append(
        f"best (median over rounds): built-in {b:.4g}, megatron_lm {m:.4g} TFLOP/s/GPU, "
        f"ratio {m / b if b else float('nan'):.4f}"
    )
    (out / "report.json").write_text(json.dumps(report, indent=1))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
