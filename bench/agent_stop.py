"""The GP agent on CloudAI's DeepSeek-V3 grid (issue 39 item 4): how soon `dse start` says
that nothing is launchable, and how soon it ends after a SIGTERM while the agent searches.

    python bench/agent_stop.py [--case grid|sigterm|both] [--signal-at 20] [--timeout 600]

The space is the CloudAI scenario ``megatron_bridge_deepseekv3_bayesian.toml`` of
``tests/fixtures/cloudai_current`` (the current-schema DeepSeek-V3 Bayesian test, its system
file, ``--seq-length 4096``) as ``dse cloudai import`` writes it (GP agent, 256 knob
combinations, 192 configurations, 4 of them valid, the pre-screen on), with the workload set
to ``sim`` (the cost model's estimate instead of a Slurm job) and a local runner, so that it
runs on any machine. (Since issue 37 the import derives Bridge's DeepSeek-V3 pipeline
layouts and FP8 weights: 60 configurations pass the rules and most fit a GB200, so the
``grid`` case no longer finds nothing launchable on this space; BENCHMARKS section 38's
figures predate that.)

* ``grid``: ``dse start`` of that space; seconds from the launch to the line that starts
  with ``0 launchable configurations`` (None: never said before the end) and to the exit.
* ``sigterm``: the same space with one more knob, ``env.NCCL_IB_TIMEOUT`` of 9 values (the
  environment variable the scenario's system file sets), so that the space (2,304 knob
  combinations) is beyond what is enumerated up front and the agent searches it; a SIGTERM
  ``--signal-at`` seconds after the first ``agent searching`` line; seconds from the
  signal to the exit.

Prints the load average before and after each, and the command's CPU seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CUR = ROOT / "tests" / "fixtures" / "cloudai_current"
SCENARIO = CUR / "test_scenario" / "megatron_bridge_deepseekv3_bayesian.toml"


def space_file(folder: Path, extra_knob: bool) -> Path:
    """The imported DeepSeek-V3 space on the sim workload (``extra_knob``: one more knob)."""
    from dse.interop.cloudai import import_scenario

    imp = import_scenario(SCENARIO, tests_dir=CUR / "test",
                          system=CUR / "system" / "example_slurm_cluster.toml",
                          seq_length=4096)  # fmt: skip
    d: dict[str, Any] = yaml.safe_load(imp.to_yaml(str(SCENARIO.name)))
    d["workload"] = {"name": "sim"}
    d["runner"] = {"name": "local"}
    d["storage"] = f"sqlite:///{folder / 'study.db'}"
    if extra_knob:
        d["knobs"]["env.NCCL_IB_TIMEOUT"] = {"values": list(range(16, 25)), "baseline": 20}
    path = folder / ("space_knob.yaml" if extra_knob else "space.yaml")
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def run(path: Path, *, signal_at: float | None, timeout: float) -> dict[str, Any]:
    """``dse start --space path``; the lines' times, the signal's, the exit's."""
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "start", "--space", str(path)],
        cwd=path.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    seen: dict[str, float] = {}
    lines: list[str] = []
    signalled: list[float] = []

    def signal_later(after: float) -> None:
        time.sleep(after)
        if proc.poll() is None:
            signalled.append(time.perf_counter() - t0)
            proc.send_signal(signal.SIGTERM)

    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        now = time.perf_counter() - t0
        for key in ("0 launchable configurations", "agent searching", "stopped (signal"):
            if line.startswith(key) and key not in seen:
                seen[key] = now
                if key == "agent searching" and signal_at is not None:
                    threading.Thread(target=signal_later, args=(signal_at,), daemon=True).start()
        if now > timeout and proc.poll() is None:
            proc.kill()
    rc = proc.wait()
    end = time.perf_counter() - t0
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {
        "exit": rc,
        "end_s": round(end, 1),
        "cpu_s": round(cpu, 1),
        "lines": {k: round(v, 1) for k, v in seen.items()},
        "signal_s": round(signalled[0], 1) if signalled else None,
        "signal_to_exit_s": round(end - signalled[0], 1) if signalled else None,
        "stopped_after_signal_s": (
            round(seen["stopped (signal"] - signalled[0], 1)
            if signalled and "stopped (signal" in seen
            else None
        ),
        "load": (round(load0, 2), round(os.getloadavg()[0], 2)),
        "last_lines": lines[-3:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["grid", "sigterm", "both"], default="both")
    ap.add_argument("--signal-at", type=float, default=20.0,
                    help="sigterm: seconds after the first 'agent searching' line")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dse-agent-stop-") as d:
        if args.case in ("grid", "both"):
            folder = Path(d) / "grid"
            folder.mkdir()
            r = run(space_file(folder, False), signal_at=None, timeout=args.timeout)
            print(f"grid: exit {r['exit']}, '0 launchable configurations' at "
                  f"{r['lines'].get('0 launchable configurations')} s, exit at {r['end_s']} s, "
                  f"CPU {r['cpu_s']} s, load {r['load'][0]} -> {r['load'][1]}")  # fmt: skip
            for line in r["last_lines"]:
                print(f"  | {line[:300]}")
        if args.case in ("sigterm", "both"):
            folder = Path(d) / "sigterm"
            folder.mkdir()
            r = run(space_file(folder, True), signal_at=args.signal_at, timeout=args.timeout)
            print(f"sigterm: exit {r['exit']}, first 'agent searching' at "
                  f"{r['lines'].get('agent searching')} s, SIGTERM at {r['signal_s']} s, "
                  f"'stopped' line {r['stopped_after_signal_s']} s and exit "
                  f"{r['signal_to_exit_s']} s after it, CPU {r['cpu_s']} s, "
                  f"load {r['load'][0]} -> {r['load'][1]}")  # fmt: skip
            for line in r["last_lines"]:
                print(f"  | {line[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
