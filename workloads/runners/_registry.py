"""The runners ``runner.name`` may name: one entry per runner.

``dse validate`` and ``dse start`` both ask this registry, so a space that validates is one
that starts. To add a runner, add its factory here (``space -> BaseRunner``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dse.exceptions import SpaceError
from dse.workloads.runners._base import BaseRunner

if TYPE_CHECKING:
    from dse.space import SearchSpace

__all__ = ["RUNNERS", "make_runner", "check_runner"]


def _local(space: SearchSpace) -> BaseRunner:
    from dse.recipe_spec import LAUNCHERS
    from dse.workloads.runners.local import LocalRunner

    # replay and sim trials are plain CPU processes whatever the space's device is
    trains = space.workload.name in ("megatron", *LAUNCHERS)
    device = space.resources.device if trains else "cpu"
    return LocalRunner(
        device=device,
        world_size=space.resources.world_size,
        gpus=space.runner.gpus,
        max_parallel=space.runner.max_parallel,
    )


def _slurm(space: SearchSpace) -> BaseRunner:
    from dse.workloads.runners.slurm_runner import make_runner as make

    return make(space)


def _ray(space: SearchSpace) -> BaseRunner:
    from dse.workloads.runners.ray_runner import make_runner as make

    return make(space)


#: runner name -> factory. The names a space may use.
RUNNERS: dict[str, Callable[[SearchSpace], BaseRunner]] = {
    "local": _local,
    "slurm": _slurm,
    "ray": _ray,
}


def check_runner(space: SearchSpace, source: str = "space") -> None:
    """Refuse a space whose ``runner.name`` this dse cannot run.

    Raises:
        SpaceError: names the runner and the known ones.
    """
    name = space.runner.name
    if name not in RUNNERS:
        raise SpaceError(
            f"{source}: runner.name: runner {name!r} is not available in this dse version "
            f"(available: {', '.join(sorted(RUNNERS))})"
        )


def make_runner(space: SearchSpace) -> BaseRunner:
    """The runner ``space.runner`` names.

    Raises:
        SpaceError: an unknown runner.
        TrialLaunchError: the runner cannot work here (e.g. no GPU).
    """
    check_runner(space)
    return RUNNERS[space.runner.name](space)
