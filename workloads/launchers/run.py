"""The trial process of a launcher workload (``python -m dse.workloads.launchers.run``).

It reads the trial spec (whose ``workload.rendered`` holds the command and environment the
controller rendered), runs the pre-trial node steps, starts the recipe, copies its output to
this process's output (the trial log), parses it as it comes and writes the metrics JSONL:
one ``step`` line per logged iteration, then a ``summary`` line, or a ``failure`` line
classified from the recipe's log (``oom``, ``nan``, ``hang``, ``invalid`` with the recipe's
own message, ``error``).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from dse.flops import model_flops_per_step
from dse.records import MetricsWriter, TrialSpec
from dse.workloads.launchers._core import run_node_steps
from dse.workloads.logs import LogParser, LogStep

__all__ = ["main", "run_rendered"]


def _step_record(s: LogStep, parser: LogParser, flops: float, world: int) -> dict[str, Any] | None:
    if s.step_time_s is None or s.loss is None or not math.isfinite(s.loss):
        return None
    tf = s.tflops_per_gpu
    if tf is None:
        tf = flops / (s.step_time_s * world * 1e12)
    peak = parser.result.peak_mem_gib or 0.0
    return {
        "step": s.step - 1,
        "step_time_s": s.step_time_s,
        "tflops_per_gpu": tf,
        "peak_mem_gib": peak,
        "peak_reserved_gib": parser.result.peak_reserved_gib or peak,
        "loss": s.loss,
        "grad_norm": s.grad_norm,
    }


def run_rendered(
    spec: TrialSpec,
    writer: MetricsWriter,
    out: Any = None,
    *,
    command: Sequence[str] | None = None,
    node_steps_done: bool = False,
) -> int:
    """Run the rendered recipe of ``spec``; write its metrics; return 0 or 3.

    ``command`` replaces the rendered command by the one that starts it (a Slurm batch
    script's ``srun`` of the recipe on every node); ``node_steps_done``: the node steps ran
    already (the batch script ran them on every node)."""
    out = out or sys.stdout
    r = spec.workload["rendered"]
    if "not_taken" in r:
        writer.failure("invalid", str(r["not_taken"]))
        return 3
    argv = list(command) if command else list(r["argv"])
    notes = [] if node_steps_done else run_node_steps(list(r.get("node_step_names", [])))
    for n in notes:
        out.write(f"dse: {n}\n")
    env = {**os.environ, **r["env"]}
    world = int(r.get("world_size", spec.world_size))
    tp = int(spec.params.get("tensor_model_parallel_size", 1) or 1)
    flops = model_flops_per_step(spec.model, spec.semantics, tensor_model_parallel_size=tp)
    parser = LogParser(r.get("log_format", "auto"))
    pending: LogStep | None = None
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
            bufsize=1, errors="replace",
        )  # fmt: skip
    except OSError as e:
        writer.failure("error", f"cannot start the recipe ({argv[0]}): {e}")
        return 3
    with proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            new = parser.feed(line)
            if new is not None:
                if pending is not None:
                    rec = _step_record(pending, parser, flops, world)
                    if rec:
                        writer.step(rec)
                pending = new
        rc = proc.wait()
    if pending is not None:
        rec = _step_record(pending, parser, flops, world)
        if rec:
            writer.step(rec)
    parsed = parser.finish()
    summary = parsed.summary(
        spec.semantics.get("warmup_steps", 1), flops_per_step=flops, world_size=world
    )
    summary["notes"] = notes + summary["notes"]
    metrics = {k: summary[k] for k in ("peak_mem_gib", "peak_reserved_gib") if summary[k]}
    if parsed.failure and (rc != 0 or parsed.failure[0] == "nan"):
        cls, reason = parsed.failure
        writer.failure(cls, reason, metrics)
        return 3
    if rc != 0:
        writer.failure(
            "error", f"the recipe exited with code {rc}; its log names no known failure"
        )
        return 3
    if summary["step_time_s"] is None or all(x is None for x in summary["loss"]):
        writer.failure(
            "error",
            f"the recipe exited 0 but its log has no iteration line (format {parsed.format})",
        )
        return 3
    sem = spec.semantics
    tokens = sem["global_batch_size"] * sem["seq_length"]
    peak = summary["peak_mem_gib"] or 0.0
    writer.summary(
        {
            "step_time_s": summary["step_time_s"],
            "tflops_per_gpu": summary["tflops_per_gpu"],
            "tflops_source": summary["tflops_source"],
            "peak_mem_gib": peak,
            "peak_reserved_gib": summary["peak_reserved_gib"] or peak,
            "loss": [x for x in summary["loss"] if x is not None][-1],
            "losses": summary["loss"],
            "steps": summary["steps"],
            "log_interval": summary["log_interval"],
            "tokens_per_s_per_gpu": tokens / (summary["step_time_s"] * world),
            "model_flops_per_step": flops,
            "world_size": world,
            "launcher": r.get("launcher"),
            "log_format": parsed.format,
            "env": r["env"],
            "notes": summary["notes"],
        }
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="trial spec JSON with workload.rendered")
    p.add_argument(
        "--node-steps-done", action="store_true", help="the node steps ran already (Slurm)"
    )
    p.add_argument(
        "command", nargs=argparse.REMAINDER,
        help="after --: the command that starts the recipe (default: the rendered one)",
    )  # fmt: skip
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with open(args.spec) as f:
        spec = TrialSpec.model_validate_json(f.read())
    return run_rendered(
        spec, MetricsWriter(spec.metrics_path), command=command or None,
        node_steps_done=args.node_steps_done,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
