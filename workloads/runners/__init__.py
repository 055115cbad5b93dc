"""Runners: where trial processes run (local process pool, Ray cluster, Slurm)."""

from __future__ import annotations

from dse.workloads.runners._base import BaseRunner, Finished, Launch, classify_log
from dse.workloads.runners.local import LocalRunner, detect_gpus, kill_group

__all__ = [
    "BaseRunner",
    "Finished",
    "Launch",
    "LocalRunner",
    "classify_log",
    "detect_gpus",
    "kill_group",
]
