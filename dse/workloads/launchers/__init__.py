"""Launchers of a user's own recipe: Megatron-Bridge, NeMo 2.0 (NeMo-Run), Megatron-LM.

A launcher turns a trial's knob values into the recipe's own overrides and environment
(:meth:`Launcher.render`); the trial process :mod:`dse.workloads.launchers.run` runs that
command (under Slurm: the batch script's ``srun`` of it; the Slurm runner writes every batch
script), reads the recipe's log (:mod:`dse.workloads.logs`) and writes the metrics contract.
"""

from __future__ import annotations

from dse.workloads.launchers._core import (
    Launcher,
    NotTaken,
    RenderedTrial,
    check_launcher,
    launcher_for,
    run_node_steps,
)

__all__ = [
    "Launcher",
    "NotTaken",
    "RenderedTrial",
    "check_launcher",
    "launcher_for",
    "run_node_steps",
    "RUN_MODULE",
]

#: The trial process of a launcher workload: ``python -m RUN_MODULE --spec trial.json``.
RUN_MODULE = "dse.workloads.launchers.run"
