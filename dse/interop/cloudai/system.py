"""A CloudAI system TOML: the parts of it a dse space uses (:func:`read_system`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from dse.core.exceptions import SpaceError
from dse.interop.cloudai._common import CloudAISystem, _read_toml


def read_system(path: str | Path) -> CloudAISystem:
    """The parts of a CloudAI system TOML a dse space uses.

    Raises:
        SpaceError: unreadable TOML or a field of the wrong type, naming the file and field.
    """
    src = Path(path)
    data = _read_toml(src)
    where = str(src)
    if "scheduler" not in data:
        raise SpaceError(f"{where}: not a CloudAI system TOML (no scheduler field)")

    def opt_int(key: str) -> int | None:
        v = data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpaceError(f"{where}: {key} must be a positive integer, got {v!r}")
        return v

    def opt_str(key: str) -> str | None:
        v = data.get(key)
        if v is None or v == "":
            return None
        if not isinstance(v, str):
            raise SpaceError(f"{where}: {key} must be a string, got {v!r}")
        return v

    sbatch = data.get("extra_sbatch_args") or []
    if not isinstance(sbatch, list) or not all(isinstance(x, str) for x in sbatch):
        raise SpaceError(f"{where}: extra_sbatch_args must be a list of strings")
    srun = opt_str("extra_srun_args")
    try:
        srun_args = tuple(shlex.split(srun)) if srun else ()
    except ValueError as e:  # shlex: "No closing quotation", "No escaped character"
        raise SpaceError(
            f"{where}: extra_srun_args is not a command line ({str(e).lower()}): {srun!r}"
        ) from None
    env = data.get("global_env_vars") or {}
    if not isinstance(env, Mapping):
        raise SpaceError(f"{where}: global_env_vars must be a table")
    return CloudAISystem(
        name=str(data.get("name") or src.stem),
        scheduler=str(data["scheduler"]),
        gpus_per_node=opt_int("gpus_per_node"),
        partition=opt_str("default_partition"),
        account=opt_str("account"),
        sbatch_args=tuple(sbatch),
        srun_args=srun_args,
        container_mount_home=bool(data.get("container_mount_home", False)),
        env=tuple((str(k), str(v)) for k, v in env.items()),
        gpu_type=opt_str("gpu_type"),
    )
