"""What the cluster runners (Slurm, Ray) share: trial shape, multi-node launch lines, placement,
and the outcome of a trial whose process (or job) ended."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dse.core.exceptions import SpaceError
from dse.core.records import FailureClass, Outcome, read_metrics
from dse.core.registry import REGISTRY
from dse.runners._base import Launch, classify_log, last_lines

__all__ = [
    "runner_options",
    "TrialShape",
    "trial_shape",
    "trial_device",
    "rendezvous_argv",
    "read_placement",
    "log_tail",
    "outcome_after_exit",
    "PLACEMENT_FILE",
]

#: Each node of a trial appends ``<node> <CUDA_VISIBLE_DEVICES>`` here when its processes start.
PLACEMENT_FILE = "placement.txt"

_TORCHRUN = "torch.distributed.run"


@dataclass(frozen=True)
class TrialShape:
    """How one trial spreads over nodes: ``nodes`` x ``per_node`` ranks (GPUs when cuda)."""

    nodes: int
    per_node: int
    device: str

    @property
    def gpus_per_node(self) -> int:
        return self.per_node if self.device == "cuda" else 0


_Opts = TypeVar("_Opts", bound=BaseModel)


def runner_options(space: Any, model: type[_Opts], name: str) -> _Opts:
    """The space's ``runner.options`` as ``model`` (typed and bounded by the space file, see
    :mod:`dse.space.searchspace`); a plain mapping is validated with a clear error naming the
    field."""
    opts = space.runner.options
    if isinstance(opts, model):
        return opts
    # another runner's typed options (the space names one runner, the command line another):
    # only the options the space file set travel, not the other model's defaults
    given = opts.model_dump(exclude_unset=True) if isinstance(opts, BaseModel) else opts
    try:
        return model.model_validate({**dict(given or {}), "runner": name})
    except ValidationError as e:
        errs = "; ".join(
            f"runner.options.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()
        )
        raise SpaceError(f"{name} runner options: {errs}") from e


def trial_device(space: Any) -> str:
    """Where a space's trials run: replay and sim trials are plain CPU processes whatever
    the space's device is; the workloads that train (the registry's trait ``trains``: the
    built-in trainer and the recipe launchers) use it."""

    trains = "trains" in REGISTRY.get("workload", space.workload.name, "workload.name").traits
    return str(space.resources.device) if trains else "cpu"


def trial_shape(world_size: int, device: str, gpus_per_node: int | None) -> TrialShape:
    """Nodes and ranks per node of a trial of ``world_size`` ranks.

    Raises:
        ValueError: ``world_size`` does not fill whole nodes of ``gpus_per_node``.
    """
    per = gpus_per_node or world_size
    if device != "cuda" or world_size <= per:
        return TrialShape(1, world_size, device)
    if world_size % per:
        raise ValueError(
            f"resources.world_size {world_size} is not a multiple of gpus_per_node {per}: "
            "a multi-node trial uses whole nodes"
        )
    return TrialShape(math.ceil(world_size / per), per, device)


def rendezvous_argv(
    argv: list[str], shape: TrialShape, *, master_addr: str, master_port: str, run_id: str
) -> list[str]:
    """``argv`` with its ``torchrun`` (``python -m torch.distributed.run``) set for ``shape``.

    Single-node trials keep ``--standalone``; a multi-node trial gets a c10d rendezvous at
    ``master_addr:master_port`` (every node runs the same line; torchrun assigns node ranks).
    Lines that do not run torchrun are returned unchanged.
    """
    if _TORCHRUN not in argv:
        return list(argv)
    i = argv.index(_TORCHRUN) + 1
    head, tail = argv[:i], argv[i:]
    # the torchrun options end where the trial module starts ("-m" or a script path)
    j = next((k for k, a in enumerate(tail) if a == "-m" or not a.startswith("-")), len(tail))
    opts = [a for a in tail[:j] if a != "--standalone" and not a.startswith("--nproc-per-node")]
    if shape.nodes == 1:
        new = ["--standalone", f"--nproc-per-node={shape.per_node}"]
    else:
        new = [
            f"--nnodes={shape.nodes}",
            f"--nproc-per-node={shape.per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={master_addr}:{master_port}",
            f"--rdzv-id={run_id}",
        ]
    return head + new + opts + tail[j:]


def read_placement(trial_dir: Path) -> str | None:
    """``node:gpus`` of each node the trial ran on (from its placement file), or None."""
    try:
        lines = (trial_dir / PLACEMENT_FILE).read_text().split("\n")
    except OSError:
        return None
    out: list[str] = []
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        node = parts[0]
        gpus = parts[1] if len(parts) > 1 else ""
        item = f"{node}:gpu{gpus}" if gpus else node
        if item not in out:
            out.append(item)
    return ",".join(out)[:255] or None


def log_tail(path: Path, n_bytes: int = 8000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def outcome_after_exit(launch: Launch, failure_class: FailureClass | None, what: str) -> Outcome:
    """The outcome of a trial whose process or job ended: its metrics file when it wrote a
    result, else ``failure_class`` (or the class its log suggests) with the log's last lines.
    A trial that only says it was stopped (``interrupted``: it got SIGTERM) takes the
    scheduler's ``failure_class`` when there is one (preempted, cancelled, timeout, ...)."""
    out = read_metrics(launch.metrics_path)
    if out is not None and out.failure_class == "interrupted" and failure_class is not None:
        return Outcome.failure(
            failure_class, f"{what}; the trial: {out.reason}", metrics=out.metrics, steps=out.steps
        )
    if out is not None:
        return out
    tail = log_tail(launch.log_path)
    cls = failure_class or classify_log(tail)
    last = last_lines(tail)
    return Outcome.failure(cls, f"{what} without a result" + (f"; log: {last}" if last else ""))


def container_python(argv: list[str]) -> list[str]:
    """In a container the controller's interpreter path means nothing: use ``python``."""
    if argv and argv[0] == sys.executable:
        return ["python", *argv[1:]]
    return list(argv)
