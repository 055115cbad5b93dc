"""Wall time of a 16-trial study through each runner with 1, 2 and 4 trials at once.

The trials are the replay workload (each a real subprocess that looks its configuration up in
the measured table and sleeps ``--delay`` seconds: no training), so the figure is the
runners' and controller's own cost. For each runner and parallelism: the study's wall time
from the controller's start, its start-up (to the first trial launched: Ray's start is here),
and the controller's overhead per trial = (wall - start-up) x parallel / trials - delay.
Slurm needs the one-node cluster of scripts/slurm_up.sh (SLURM_CONF set). Prints a Markdown
table and one JSON line per run.

    python bench/cluster_runners.py --runners local slurm ray --parallel 1 2 4 --delay 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TABLE = REPO / "examples" / "tables" / "h200_llama1b_unfused_1gpu.jsonl"


def run_one(runner: str, parallel: int, trials: int, delay: float, tmp: Path) -> dict:
    from dse.core.figures import figure

    space = yaml.safe_load((REPO / "examples" / "replay_llama1b.yaml").read_text())
    study = f"bench-{runner}-{parallel}"
    space["study"] = study
    space["workload"] = {"name": "replay", "table": str(TABLE), "delay_s": delay}
    space["budget"] = {"n_trials": trials, "trial_timeout_s": 120, "hang_timeout_s": 120}
    space["prescreen"] = {"enabled": False}
    space["agent"] = {"name": "random", "seed": 0}
    opts: dict = {}
    if runner == "slurm":
        opts = {"poll_interval_s": 0.5}
    elif runner == "ray":
        opts = {"num_cpus": 4}
    space["runner"] = {
        "name": runner, "max_parallel": parallel, "workdir": str(tmp / "runs"), "options": opts,
    }  # fmt: skip
    p = tmp / f"{study}.yaml"
    p.write_text(yaml.safe_dump(space))
    url = f"sqlite:///{tmp / (study + '.db')}"
    cmd = [sys.executable, "-m", "dse.cli", "start", "--space", str(p), "--storage", url]
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    first = None
    done = 0
    proc = subprocess.Popen(cmd, cwd=tmp, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if first is None and re.match(r"trial \d+ started", line):
            first = time.monotonic() - t0
        if re.match(r"trial \d+ (complete|infeasible|failed)", line):
            done += 1
    rc = proc.wait()
    wall = time.monotonic() - t0
    startup = first or 0.0
    per_trial = (wall - startup) * parallel / trials - delay
    return {
        "runner": runner,
        "parallel": parallel,
        "trials": trials,
        "finished": done,
        "rc": rc,
        "wall_s": figure(wall),
        "startup_s": figure(startup),
        "ideal_s": figure(trials * delay / parallel),
        "overhead_per_trial_s": figure(per_trial),
        "load_avg_1m": [figure(load0), figure(os.getloadavg()[0])],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runners", nargs="+", default=["local", "slurm", "ray"])
    ap.add_argument("--parallel", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--delay", type=float, default=1.0)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for runner in args.runners:
            for par in args.parallel:
                r = run_one(runner, par, args.trials, args.delay, Path(d))
                print(json.dumps(r), flush=True)
                rows.append(r)
    print("\n| runner | at once | trials | wall s | start-up s | ideal s | overhead/trial s "
          "| load 1m |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['runner']} | {r['parallel']} | {r['finished']}/{r['trials']} | {r['wall_s']} "
            f"| {r['startup_s']} | {r['ideal_s']} | {r['overhead_per_trial_s']} "
            f"| {r['load_avg_1m'][0]}-{r['load_avg_1m'][1]} |"
        )
    return 0 if all(r["rc"] == 0 and r["finished"] == r["trials"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
