"""What a trial runs, on the trial's side of the controller / trial boundary (where it runs
is :mod:`dse.runners`, on the controller's side).

Owns: ``megatron/`` (the built-in Megatron-Core trainer), ``replay`` (answers from a measured
table), ``sim`` (the cost model's simulator), ``launchers/`` (the recipe launchers:
Megatron-Bridge, NeMo 2.0, Megatron-LM, and their trial process), ``logs`` (log parsers and
failure classification), ``procgroup`` (trial process groups), and :func:`trial_command`.
Every workload writes the trial contract of :mod:`dse.core.records` with its
:class:`~dse.core.records.MetricsWriter`.

Importing this package never imports torch or megatron."""

from __future__ import annotations

import sys

from dse.core.registry import REGISTRY

__all__ = ["trial_command"]


def trial_command(
    workload: str, spec_path: str, *, world_size: int, python: str | None = None
) -> list[str]:
    """The command line of a trial process for ``workload`` (its registry entry's module,
    :data:`dse.core.registry.REGISTRY`).

    Built-in Megatron trials run under ``torchrun`` with one process per GPU (or CPU rank);
    the replay and sim workloads and a recipe launcher's trial process are a single process.
    """
    py = python or sys.executable
    plugin = REGISTRY.get("workload", workload, "workload.name")
    module = plugin.module
    if "torchrun" in plugin.traits:
        return [
            py, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world_size}", "-m", module, "--spec", spec_path,
        ]  # fmt: skip
    return [py, "-m", module, "--spec", spec_path]
