"""CLI pieces for users' own recipes: ``dse parse-log`` and ``dse start --dry-run``.

``dse parse-log FILE [--format auto|megatron|bridge|nemo] [--json] [--space SPACE]`` prints
what a trial would record from a recipe's log. ``dse start --space S --dry-run`` prints the
first trials the agent would launch (command, environment), running nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from dse.agents import create_agent
from dse.core.exceptions import SpaceError
from dse.loop.proposer import (
    Proposer,
    cost_model_memory_hint,
    cost_model_prescreen,
    cost_model_speed_hint,
)
from dse.loop.study import trial_launch
from dse.model.flops import model_flops_per_step
from dse.runners.slurm_runner import dry_run_script
from dse.space.searchspace import load_space
from dse.workloads import trial_command
from dse.workloads.launchers import check_launcher, launcher_for
from dse.workloads.logs import parse_log

__all__ = ["register", "cmd_parse_log", "dry_run", "check_recipe"]


def check_recipe(space: Any, source: str) -> int:
    """For a recipe launcher workload: every knob value renders as one of the recipe's own
    overrides (:class:`SpaceError` naming the knob otherwise). Returns renderings checked."""
    if space.workload.launcher is None:
        return 0

    return check_launcher(space, source)


def cmd_parse_log(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text(errors="replace")
    except OSError as e:
        raise SpaceError(f"{args.file}: cannot read the log ({e.strerror})") from e
    flops = world = None
    if args.space:
        space = load_space(args.space)
        tp = space.baseline().get("tensor_model_parallel_size", 1)
        flops = model_flops_per_step(space.model, space.semantics, tensor_model_parallel_size=tp)
        world = space.resources.world_size
    parsed = parse_log(text, args.format)
    out = parsed.summary(args.warmup, flops_per_step=flops, world_size=world)
    if not parsed.steps and parsed.failure is None:
        raise SpaceError(
            f"{args.file}: no iteration line of the {parsed.format} format and no known "
            "failure in this log"
        )
    if args.json:
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    fail = out["failure"]
    lines = [
        f"format:         {out['format']}",
        f"tflops_per_gpu: {num(out['tflops_per_gpu'], '.6g')}"
        + (f" ({out['tflops_source']})" if out["tflops_source"] else ""),
        f"tflops_log:     {num(out['tflops_per_gpu_log'], '.6g')}"
        + (
            f" ({out['tflops_log_source']}; the recipe's own count, not the objective)"
            if out["tflops_log_source"]
            else ""
        ),  # fmt: skip
        f"step_time_s:    {num(out['step_time_s'], '.6g')} (median after "
        f"{out['warmup_steps']} warm-up iteration(s))",
        f"loss:           {out['loss']}",
        f"peak_mem_gib:   {num(out['peak_mem_gib'], '.4f')}",
        f"steps:          {out['steps']} ({out['logged_steps']} logged, every "
        f"{out['log_interval'] or '-'})",
        "failure:        " + ("-" if fail is None else f"{fail['class']}: {fail['reason']}"),
    ]
    lines += [f"note:           {n}" for n in out["notes"]]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def dry_run(space: Any, n: int) -> str:
    """The first ``n`` trials the agent would launch, as text (nothing runs)."""
    from dse.model.costmodel import CostModel  # numpy

    cost_model = CostModel(space.model, space.semantics, space.resources)
    feats = space.resources.features
    agent = create_agent(
        space,
        cost_model_memory_hint(space, cost_model),
        cost_model_speed_hint(space, cost_model),
    )
    proposer = Proposer(
        space,
        agent,
        set(feats) if isinstance(feats, list) else None,
        prescreen=cost_model_prescreen(space, cost_model),
    )
    got = proposer.propose(n)
    out = [f"# dse start --dry-run: study {space.study!r}, workload {space.workload.name}, "
           f"first {len(got.proposals)} trial(s); nothing was run"]  # fmt: skip
    for rej in got.rejections:
        out.append(f"# rejected before launch ({rej.kind}): {rej.rule}: {rej.reason}")
    if not got.proposals and got.message:  # e.g. nothing launchable in the whole space
        out.append(f"# {got.message}")
    for i, prop in enumerate(got.proposals):
        params = prop.params
        env, workload = trial_launch(space, params)
        out.append("")
        out.append(f"## trial {i}: {json.dumps(params, sort_keys=True)}")
        if space.runner.name == "slurm":  # the batch script the runner submits, as it is
            out.append(dry_run_script(space, i, env, workload).rstrip("\n"))
        elif "rendered" in workload:
            r = launcher_for(space).render(
                space.full_params(params), python=space.workload.launcher.python
            )
            out.append(r.script().rstrip("\n"))
        else:
            out += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
            argv = trial_command(
                space.workload.name, "trial.json", world_size=space.resources.world_size,
                python="python",
            )  # fmt: skip
            out.append(shlex.join(argv))
    return "\n".join(out) + "\n"


def register(sub: Any) -> None:
    sp = sub.add_parser("parse-log", help="what a trial would record from a recipe's log")
    sp.add_argument("file")
    sp.add_argument("--format", choices=["auto", "megatron", "bridge", "nemo"], default="auto")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.add_argument(
        "--warmup", type=int, default=1, help="iterations excluded from the medians (default 1)"
    )
    sp.add_argument(
        "--space", help="space file: computes TFLOP/s from the step time when the log has none"
    )
    sp.set_defaults(fn=cmd_parse_log)
