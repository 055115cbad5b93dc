"""Run inside a Slurm job by the tests: the Slurm runner submits one trial from inside this
job, and, as a control, a plain ``sbatch`` with this job's environment as it is. Writes what
the controller's job, the trial's job and the control job saw to ``OUT/driver.json``.

    python -m tests.runners.slurm_job_driver OUT
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dse.runners.slurm_runner import SlurmOptions, SlurmRunner
from tests.runners.conftest import drain, make_launch, seen


def main() -> int:
    out = Path(sys.argv[1])
    mine = {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}
    # the control: what a trial job would inherit if sbatch got this job's environment
    control = out / "control.env"
    subprocess.run(
        ["sbatch", "--parsable", "--wait", f"--output={control}", "--wrap", "env"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    r = SlurmRunner(
        SlurmOptions(poll_interval_s=0.5, cpus_per_task=2), device="cpu", world_size=1,
        job_prefix="dse-test-inner",
    )  # fmt: skip
    launch = make_launch(out, 1, 0.2)
    r.submit(launch)
    t0 = time.monotonic()
    fin = drain(r, 1, timeout=120)[1]
    inherited = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in control.read_text().splitlines()
        if line.startswith("SLURM_") and "=" in line
    }
    (out / "driver.json").write_text(
        json.dumps(
            {
                "controller_job": mine,
                "control_job": inherited,
                "trial": seen(launch)[0]["slurm"],
                "ok": fin.outcome.ok,
                "reason": fin.outcome.reason,
                "placement": fin.placement,
                "wait_s": time.monotonic() - t0,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
