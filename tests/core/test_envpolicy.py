"""The one environment policy (dse.core.envpolicy), wherever a variable enters a trial: env.fixed,
env.knobs, runner.options.env of the Ray and Slurm runners (the CloudAI import:
tests/interop/test_cloudai.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from dse.core.envpolicy import env_var_problem
from dse.core.exceptions import SpaceError
from dse.space.searchspace import parse_space
from tests.conftest import EXAMPLES

#: Variables a recipe's environment holds that must be kept (CloudAI scenarios set them).
KEPT = [
    "ENABLE_NUMA_CONTROL", "TORCHX_MAX_RETRIES", "TRANSFORMERS_OFFLINE",
    "NEMO_LOG_MEMORY_USAGE", "NCCL_DEBUG", "NVTE_FUSED_ATTN", "CUDA_DEVICE_MAX_CONNECTIONS",
    "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "_PRIVATE1",
]  # fmt: skip

#: Variables refused, and a word of the reason each must give.
REFUSED = {
    "LD_PRELOAD": "dynamic loader",
    "LD_LIBRARY_PATH": "dynamic loader",
    "LD_AUDIT": "dynamic loader",
    "PYTHONPATH": "Python interpreter",
    "PYTHONSTARTUP": "Python interpreter",
    "PATH": "programs found by name",
    "BASH_ENV": "bash runs this file",
    "NCCL_NET_PLUGIN": "NCCL loads",
    "NCCL_TUNER_PLUGIN": "NCCL loads",
    "CUDA_INJECTION64_PATH": "CUDA driver",
    "SLURM_TASK_PROLOG": "runs a program",
    "DSE_TRIAL_OWNER": "owner token",
    "MASTER_ADDR": "rendezvous",
    "A;B": "not an environment variable name",
    "A=B": "not an environment variable name",
    "1A": "not an environment variable name",
    "A\nB": "not an environment variable name",
}

_Place = Callable[[dict[str, Any], str, str], None]


def _fixed(d: dict[str, Any], var: str, value: str) -> None:
    d["env"] = {"fixed": {var: value}}


def _knob(d: dict[str, Any], var: str, value: str) -> None:
    d["env"] = {"knobs": {var: {"values": [value, value + "0"]}}}


def _runner(name: str) -> _Place:
    def put(d: dict[str, Any], var: str, value: str) -> None:
        d["runner"] = {"name": name, "options": {"env": {var: value}}}

    return put


PLACES: dict[str, _Place] = {
    "env.fixed": _fixed,
    "env.knobs": _knob,
    "runner.options.env (slurm)": _runner("slurm"),
    "runner.options.env (ray)": _runner("ray"),
}


def _space(place: str, var: str, value: str = "1") -> Any:
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    PLACES[place](d, var, value)
    return parse_space(d, "space.yaml")


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("var", KEPT)
def test_a_recipes_environment_is_kept_everywhere(place: str, var: str) -> None:
    assert env_var_problem(var) is None
    _space(place, var)


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("var", sorted(REFUSED))
def test_what_loads_code_is_refused_everywhere_with_the_reason(place: str, var: str) -> None:
    why = env_var_problem(var)
    assert why is not None and REFUSED[var] in why
    with pytest.raises(SpaceError) as e:
        _space(place, var)
    assert REFUSED[var] in str(e.value)


def test_a_value_with_a_nul_is_refused() -> None:
    with pytest.raises(SpaceError, match="NUL"):
        _space("runner.options.env (slurm)", "NCCL_DEBUG", "a\0b")
