"""A whole study on a Megatron-Bridge-style MoE space: wall time and the longest silence.

``examples/bridge_moe_sim.yaml`` (16 knobs, MoE, TP in {1, 2, 4, 8}, the recipe's
``sequence_parallel: true``, ``workload: sim`` = the cost model's estimates, no GPU) runs
as ``dse start`` in a subprocess, once as written (``derived:`` lets Bridge's rules set SP
and ETP from the layout) and once without its ``derived:`` section (SP stays on at TP 1,
so a quarter of the space breaks a rule: the agent must not spin on it). For each variant
it prints the wall time of the whole command, the CPU time it used (controller and trial
processes: the machine's load does not inflate it), the longest gap between two output lines
(a silent agent shows up here), the trials, and the proposals rejected before launch.

    python bench/bridge_study.py [--n-trials 30] [--agents tpe] [--variants derived,plain]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SPACE = REPO / "examples" / "bridge_moe_sim.yaml"


def run_variant(variant: str, agent: str, n_trials: int, tmp: Path) -> dict[str, object]:
    d = yaml.safe_load(SPACE.read_text())
    if variant == "plain":
        d.pop("derived", None)
    d["study"] = f"bridge-{variant}-{agent}"
    d["agent"] = {**d.get("agent", {}), "name": agent}
    d["budget"] = {**d.get("budget", {}), "n_trials": n_trials}
    d["runner"] = {**d.get("runner", {}), "workdir": str(tmp / "runs")}
    path = tmp / f"{d['study']}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    url = f"sqlite:///{tmp / (d['study'] + '.db')}"
    cmd = [sys.executable, "-m", "dse.cli", "start", "--space", str(path), "--storage", url]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    last = t0
    gap = 0.0
    lines: list[str] = []
    with subprocess.Popen(
        cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            now = time.monotonic()
            gap = max(gap, now - last)
            last = now
            lines.append(line.rstrip())
        rc = proc.wait()
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    done = next((ln for ln in reversed(lines) if ln.startswith("done:")), lines[-1:] or [""])
    return {
        "variant": variant,
        "agent": agent,
        "rc": rc,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "longest_silence_s": round(gap, 1),
        "rejection_lines": sum("rejected before launch (" in ln for ln in lines),
        "progress_lines": sum(ln.startswith("agent searching") for ln in lines),
        "done": done if isinstance(done, str) else done[0],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--n-trials", type=int, default=30)
    ap.add_argument("--agents", default="tpe")
    ap.add_argument("--variants", default="derived,plain")
    args = ap.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory() as t:
        for agent in args.agents.split(","):
            for variant in args.variants.split(","):
                r = run_variant(variant, agent, args.n_trials, Path(t))
                print(
                    f"{r['variant']:8s} {r['agent']:6s} rc {r['rc']}  wall {r['wall_s']:6.1f} s  "
                    f"cpu {r['cpu_s']:5.1f} s  "
                    f"longest silence {r['longest_silence_s']:5.1f} s  "
                    f"rejected {r['rejection_lines']:4d}  progress lines {r['progress_lines']}"
                )
                print(f"    {r['done']}")
                failed |= r["rc"] != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
