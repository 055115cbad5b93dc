"""What a trial runs (built-in Megatron-Core trainer, replay of a measured table, the cost
model's simulator) and where it runs (``dse.workloads.runners``). Every workload writes the
trial contract of :mod:`dse.records` with its :class:`~dse.records.MetricsWriter`.

Importing this package never imports torch or megatron.
"""

from __future__ import annotations

import sys

__all__ = ["trial_command"]

_MODULES = {
    "megatron": "dse.workloads.megatron.trainer",
    "replay": "dse.workloads.replay",
    "sim": "dse.workloads.sim",
    # a user's recipe: the trial process runs the command the launcher rendered
    "bridge": "dse.workloads.launchers.run",
    "nemo": "dse.workloads.launchers.run",
    "megatron_lm": "dse.workloads.launchers.run",
}


def trial_command(
    workload: str, spec_path: str, *, world_size: int, python: str | None = None
) -> list[str]:
    """The command line of a trial process for ``workload``.

    Megatron trials run under ``torchrun`` with one process per GPU (or CPU rank); the
    replay and sim workloads are a single process.
    """
    py = python or sys.executable
    module = _MODULES[workload]
    if workload == "megatron":
        return [
            py, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world_size}", "-m", module, "--spec", spec_path,
        ]  # fmt: skip
    return [py, "-m", module, "--spec", spec_path]
