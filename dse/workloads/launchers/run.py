"""The trial process of a launcher workload (``python -m dse.workloads.launchers.run``).

It reads the trial spec (whose ``workload.rendered`` holds the command and environment the
controller rendered), runs the pre-trial node steps, starts the recipe, copies its output to
this process's output (the trial log), parses it as it comes and writes the metrics JSONL:
one ``step`` line per logged iteration, then a ``summary`` line, or a ``failure`` line
classified from the recipe's log (``oom``, ``nan``, ``hang``, ``invalid`` with the recipe's
own message, ``error``).

The logged step times go through the trial's measurement rule (:mod:`dse.stats.measure`) as they
come: in ``adaptive`` mode (the recipe is given ``max_steps`` iterations) the recipe is
stopped, its whole process group, once the steady-state step time is known to the space's
precision; with ``prune`` it is stopped once its interval lies clearly below the study's
best (``dominated``: the trial is recorded ``pruned``). A recipe still running
``EXIT_GRACE_S`` after its last planned iteration is ended too (its exit is not measured).
The recipe runs in its own process group, and a SIGTERM to this process (the runner's stop)
is passed on to that group.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from dse.core.records import MetricsWriter, StopReason, TrialSpec
from dse.model.flops import model_flops_per_step
from dse.stats.measure import series_for
from dse.workloads.launchers import bridge_entry
from dse.workloads.launchers._core import run_node_steps
from dse.workloads.launchers.bridge import ENTRY_FILE
from dse.workloads.launchers.resolved import RESOLVED_ENV, check_for
from dse.workloads.logs import LogParser, LogStep
from dse.workloads.procgroup import kill_process_group

__all__ = ["main", "run_rendered"]


def _step_record(s: LogStep, parser: LogParser, flops: float, world: int) -> dict[str, Any] | None:
    """A step line: dse's TFLOP/s (model FLOPs over the logged step time, the one definition);
    the log's own figure only beside it (``tflops_per_gpu_log``)."""
    if s.step_time_s is None or s.loss is None or not math.isfinite(s.loss):
        return None
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
        "tflops_per_gpu_log": s.tflops_per_gpu,
    }


#: Stop reasons on which the recipe is stopped (``max_steps``: a recipe whose own iteration
#: count is larger, e.g. one that takes no model arguments from dse; ``fixed`` runs the
#: recipe's own window).
_EARLY_STOPS: tuple[StopReason, ...] = ("converged", "dominated", "max_steps")

#: Seconds a recipe may take to exit after its last planned iteration was logged before dse
#: ends its process group: upstream Megatron-LM's ``pretrain_gpt.py`` (core_v0.16.1) took 32 s
#: to exit after "[after training is done]" on one H200 (it never destroys its process group),
#: held GPU time in which nothing is measured.
EXIT_GRACE_S = 10.0


@contextlib.contextmanager
def _group_guard(proc: subprocess.Popen[str] | None) -> Iterator[None]:
    """While the recipe runs in its own process group: a SIGTERM to this process ends that
    group first; and the group never outlives this function."""
    if proc is None:
        yield
        return

    def on_term(signum: int, _frame: Any) -> None:
        kill_process_group(proc, grace_s=2.0)
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: the caller handles its own signals
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            kill_process_group(proc, grace_s=2.0)


def _place_entry_script(argv: Sequence[str], trial_dir: str) -> None:
    """Copy dse's Bridge entry script where the recipe's command names it (relative: the
    folder the recipe starts in, this process's and the trial's, which are the same under
    the local runner and Slurm's ``--chdir``/``--container-workdir``)."""

    if ENTRY_FILE not in argv:
        return
    import shutil

    for folder in {os.getcwd(), trial_dir}:
        shutil.copyfile(bridge_entry.__file__, os.path.join(folder, ENTRY_FILE))


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
    sem = spec.semantics
    tokens = sem["global_batch_size"] * sem["seq_length"]
    series = series_for(spec, tokens_per_step_per_gpu=tokens / world)
    trial_dir = os.path.dirname(os.path.abspath(spec.metrics_path))
    _place_entry_script(argv, trial_dir)
    check = check_for(spec, argv, trial_dir)
    if check is not None and check.file is not None:
        env[RESOLVED_ENV] = str(check.file)
    if check is not None and check.ahead is not None:
        # a recipe resolved before it runs (NeMo 2.0): a field it overwrites, or a
        # configuration it refuses, ends the trial here, before any GPU time
        ahead = check.start()
        if ahead is not None:
            out.write(f"dse: not starting the recipe: {ahead}\n")
            writer.failure("invalid", ahead)
            return 3
        out.write(f"dse: {check.note}\n")
        out.flush()
    may_stop = series.adaptive or series.prune is not None
    # its own process group always: a recipe may be ended after its last step (EXIT_GRACE_S)
    own_group = True
    refused: str | None = None  # the check's reason: the recipe resolved other values
    timed: set[int] = set()  # logged iterations already fed to the series
    stopped: StopReason | None = None
    pending: LogStep | None = None
    exit_timer: threading.Timer | None = None  # started at the last planned step
    ended_after_last = threading.Event()  # dse ended a recipe that had logged every step

    def end_slow_exit() -> None:
        ended_after_last.set()
        kill_process_group(proc, grace_s=2.0)

    def feed(s: LogStep) -> StopReason | None:
        rec = _step_record(s, parser, flops, world)
        if rec is None or s.step in timed:
            return None
        timed.add(s.step)
        return series.add(rec["step_time_s"], rec["tflops_per_gpu"])

    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
            bufsize=1, errors="replace", process_group=0 if own_group else None,
        )  # fmt: skip
    except OSError as e:
        writer.failure("error", f"cannot start the recipe ({argv[0]}): {e}")
        return 3
    with proc, _group_guard(proc if own_group else None):
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if stopped is not None or refused is not None:
                continue  # what the recipe printed while it was being stopped is not measured
            if check is not None:
                refused = check.feed(line)
                if refused is not None:
                    out.write(f"dse: stopping the recipe: {refused}\n")
                    out.flush()
                    kill_process_group(proc, grace_s=5.0)
                    continue
            new = parser.feed(line)
            if new is not None:
                if pending is not None:
                    rec = _step_record(pending, parser, flops, world)
                    if rec:
                        writer.step(rec)
                    feed(pending)  # a step whose time came after its first line
                pending = new
                why = feed(new)
                if (
                    why is not None
                    and exit_timer is None
                    and not (may_stop and why in _EARLY_STOPS)
                ):
                    exit_timer = threading.Timer(EXIT_GRACE_S, end_slow_exit)
                    exit_timer.daemon = True
                    exit_timer.start()
                if may_stop and why in _EARLY_STOPS:
                    stopped = why
                    out.write(f"dse: stopping the recipe after {len(series.times)} timed "
                              f"iterations ({why})\n")  # fmt: skip
                    out.flush()
                    kill_process_group(proc, grace_s=5.0)
        rc = proc.wait()
    if exit_timer is not None:
        exit_timer.cancel()
    if ended_after_last.is_set():
        notes.append(
            f"the recipe had not exited {EXIT_GRACE_S:.0f} s after its last planned "
            "iteration; dse ended it (its exit is not measured)"
        )
        if stopped is None:
            stopped = "fixed"
    if pending is not None:
        rec = _step_record(pending, parser, flops, world)
        if rec:
            writer.step(rec)
        feed(pending)
    if refused is None and check is not None:
        refused = check.finish()
    if refused is not None:
        writer.failure("invalid", refused)
        return 3
    parsed = parser.finish()
    summary = parsed.summary(
        spec.semantics.get("warmup_steps", 1), flops_per_step=flops, world_size=world
    )
    summary["notes"] = notes + summary["notes"] + ([check.note] if check and check.note else [])
    metrics = {k: summary[k] for k in ("peak_mem_gib", "peak_reserved_gib") if summary[k]}
    # a recipe dse stopped exits non-zero (the signal): that is not its failure
    if parsed.failure and ((rc != 0 and stopped is None) or parsed.failure[0] == "nan"):
        cls, reason = parsed.failure
        writer.failure(cls, reason, metrics)
        return 3
    if rc != 0 and stopped is None:
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
    peak = summary["peak_mem_gib"] or 0.0
    measured: dict[str, Any] = {}
    if series.times:
        # adaptive: the steady-state estimate; fixed: the log's medians with their interval
        m = (
            series.result()
            if series.adaptive
            else series.result(summary["step_time_s"], summary["tflops_per_gpu"])
        )
        measured = m.fields()
        if m.tflops_per_gpu is None:
            measured.pop("tflops_per_gpu", None)
    step_time = measured.get("step_time_s", summary["step_time_s"])
    writer.summary(
        {
            "step_time_s": step_time,
            "tflops_per_gpu": measured.get("tflops_per_gpu", summary["tflops_per_gpu"]),
            **{k: v for k, v in measured.items() if k not in ("step_time_s", "tflops_per_gpu")},
            "tflops_source": summary["tflops_source"],
            # the recipe's own figures beside dse's, never the objective (one FLOP definition)
            **{
                k: summary[k]
                for k in ("tflops_per_gpu_log", "tflops_log_source")
                if summary[k] is not None
            },  # fmt: skip
            "step_time_s_log": summary["step_time_s"],
            "resolved_check": None if check is None else check.note,
            "peak_mem_gib": peak,
            "peak_reserved_gib": summary["peak_reserved_gib"] or peak,
            "loss": [x for x in summary["loss"] if x is not None][-1],
            "losses": summary["loss"],
            "steps": summary["steps"],
            "log_interval": summary["log_interval"],
            "tokens_per_s_per_gpu": tokens / (step_time * world),
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
