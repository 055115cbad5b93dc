"""A trial program for the runner tests: notes where it runs, optionally leaves a child
process behind it, sleeps, then writes a summary line (the metrics contract of a real trial).

    python trial_program.py METRICS_PATH SECONDS [--child] [--fail]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

metrics = Path(sys.argv[1])
seconds = float(sys.argv[2])
seen = {
    "pid": os.getpid(),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "master_addr": os.environ.get("MASTER_ADDR"),
    "start": time.time(),
    # what Slurm set for the trial's job (a controller inside a job must not pass its own on)
    "slurm": {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SRUN_"))},
}
if "--child" in sys.argv:
    seen["child"] = subprocess.Popen(["sleep", "600"]).pid
(metrics.parent / f"seen.{os.getpid()}.json").write_text(json.dumps(seen))
print("trial program started", flush=True)
time.sleep(seconds)
if "--fail" in sys.argv:
    print("trial program: giving up with exit code 3", flush=True)
    sys.exit(3)
with open(metrics, "a") as f:
    summary = {"type": "summary", "tflops_per_gpu": 1.0, "step_time_s": seconds or 0.1,
               "peak_mem_gib": 0.1, "end": time.time()}  # fmt: skip
    f.write(json.dumps(summary) + "\n")
