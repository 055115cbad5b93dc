"""Runners: where trial processes run (local process pool, Ray cluster, Slurm)."""

from __future__ import annotations

from dse.workloads.runners._base import OWNER_ENV, BaseRunner, Finished, Launch, classify_log
from dse.workloads.runners._registry import RUNNERS, check_runner, make_runner
from dse.workloads.runners.inprocess import InProcessRunner
from dse.workloads.runners.local import (
    TRIAL_ENV_DROP,
    LocalRunner,
    detect_gpus,
    kill_group,
    kill_owned_group,
)

__all__ = [
    "BaseRunner",
    "Finished",
    "InProcessRunner",
    "Launch",
    "LocalRunner",
    "OWNER_ENV",
    "RUNNERS",
    "TRIAL_ENV_DROP",
    "check_runner",
    "classify_log",
    "detect_gpus",
    "kill_group",
    "kill_owned_group",
    "make_runner",
]
