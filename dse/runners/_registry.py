"""The runners ``runner.name`` may name: the ``runner`` entries of the plugin registry
(:data:`dse.core.registry.REGISTRY`), each a factory ``space -> BaseRunner``.

``dse validate`` and ``dse start`` both ask the registry, so a space that validates is one
that starts. To add a runner, register its factory there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from dse.core.exceptions import SpaceError
from dse.core.registry import REGISTRY
from dse.runners._base import BaseRunner
from dse.runners._cluster import trial_device
from dse.runners.local import LocalRunner
from dse.runners.warm import WarmSettings
from dse.space.knobs import trial_env
from dse.space.searchspace import LocalOptions

if TYPE_CHECKING:
    from dse.space.searchspace import SearchSpace

__all__ = ["RUNNERS", "make_runner", "check_runner", "local_runner", "warm_settings"]


def local_runner(space: SearchSpace) -> BaseRunner:
    """The local process pool of a space (``runner: local``)."""

    return LocalRunner(
        device=trial_device(space),
        world_size=space.resources.world_size,
        gpus=space.runner.gpus,
        max_parallel=space.runner.max_parallel,
        warm=warm_settings(space),
    )


def warm_settings(space: SearchSpace) -> WarmSettings | None:
    """The warm workers a space's local runner keeps (None: a process per trial).

    ``runner.options.warm_workers`` (default: on for CUDA, off on CPU) applies to one-rank
    trials of the built-in trainer; trials of several ranks and other workloads always run
    a process group per trial.
    """
    import sys
    from pathlib import Path

    opts = space.runner.options
    if not isinstance(opts, LocalOptions):
        return None
    device = space.resources.device
    on = opts.warm_workers if opts.warm_workers is not None else device == "cuda"
    if not on or space.workload.name != "megatron" or space.resources.world_size != 1:
        return None
    spare = opts.warm_spare if opts.warm_spare is not None else device == "cuda"
    return WarmSettings(
        python=space.runner.python or sys.executable,
        workdir=(Path(space.runner.workdir) / space.study).resolve(),
        spare=spare,
        max_trials=opts.warm_max_trials,
        memory_slack_mib=opts.warm_memory_slack_mib,
        env=trial_env(space.full_params(space.baseline()), space.env.fixed),
    )


class _Runners(Mapping[str, Callable[["SearchSpace"], BaseRunner]]):
    """Read-only ``name -> factory``; a factory's module is imported when it is looked up."""

    def __getitem__(self, name: str) -> Callable[[SearchSpace], BaseRunner]:
        if ("runner", name) not in REGISTRY:
            raise KeyError(name)
        factory: Callable[[SearchSpace], BaseRunner] = REGISTRY.get("runner", name).load()
        return factory

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY.names("runner"))

    def __len__(self) -> int:
        return len(REGISTRY.names("runner"))


#: runner name -> factory. The names a space may use.
RUNNERS: Mapping[str, Callable[[SearchSpace], BaseRunner]] = _Runners()


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
