"""Runners: where trial processes run, on the controller's side of the controller / trial
boundary (the controller never imports the trainer, :mod:`dse.workloads.megatron`).

Owns: ``_registry`` (the runner factory a space's ``runner`` names), ``local`` (a process pool
on this machine), ``warm`` (its warm workers), ``inprocess`` (each trial answered by a
function of its spec, for ``dse bench`` and tests), ``slurm_runner`` (batch jobs),
``ray_runner`` (placement groups), over ``_cluster`` (what the cluster runners share) and
``_base`` (``BaseRunner``)."""

from __future__ import annotations

from dse.runners._base import OWNER_ENV, BaseRunner, Finished, Launch, classify_log
from dse.runners._registry import RUNNERS, check_runner, make_runner
from dse.runners.inprocess import InProcessRunner
from dse.runners.local import (
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
