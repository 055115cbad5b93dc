"""runner.options of the local runner's warm trial workers: typed and bounded in the space
file, left out of the digest at their defaults, and resolved by the runner registry (on for
one-rank built-in trials on CUDA, off on CPU, never for several ranks or other workloads)."""

from __future__ import annotations

from typing import Any

import pytest

from dse.core.exceptions import SpaceError
from dse.runners import LocalRunner, make_runner
from dse.runners._registry import warm_settings
from dse.space.searchspace import LocalOptions, load_space, parse_space
from tests.conftest import EXAMPLES


def _space(**runner: Any) -> Any:
    data = load_space(EXAMPLES / "llama_1b_h200.yaml").model_dump(mode="json")
    data["runner"] = {**data["runner"], **runner}
    return data


def test_options_typed_and_out_of_the_digest() -> None:
    base = parse_space(_space(), "x")
    assert base.model_dump()["runner"]["options"] == {}
    on = parse_space(_space(options={"warm_workers": True, "warm_max_trials": 3}), "x")
    assert isinstance(on.runner.options, LocalOptions)
    assert on.runner.options.warm_workers is True and on.runner.options.warm_max_trials == 3
    assert on.model_dump()["runner"]["options"] == {"warm_workers": True, "warm_max_trials": 3}
    assert on.identity_digest() == base.identity_digest()  # a run setting, not identity
    with pytest.raises(SpaceError, match=r"runner\.options\.warm_max_trials"):
        parse_space(_space(options={"warm_max_trials": 0}), "x")
    with pytest.raises(SpaceError, match=r"runner\.options\.warm_memory_slack_mib"):
        parse_space(_space(options={"warm_memory_slack_mib": -1}), "x")


def test_defaults_by_device_ranks_and_workload() -> None:
    cuda = parse_space(_space(), "x")
    w = warm_settings(cuda)
    assert w is not None and w.spare and w.max_trials == 50 and w.memory_slack_mib == 512
    assert w.workdir.name == cuda.study and w.workdir.is_absolute()
    off = parse_space(_space(options={"warm_workers": False}), "x")
    assert warm_settings(off) is None
    cpu = load_space(EXAMPLES / "tiny_gpt_cpu.yaml")  # CPU, two ranks
    assert warm_settings(cpu) is None
    d = cpu.model_dump(mode="json")
    d["resources"]["world_size"] = 1
    assert warm_settings(parse_space(d, "x")) is None  # CPU default: a process per trial
    d["runner"]["options"] = {"warm_workers": True}
    one = warm_settings(parse_space(d, "x"))
    assert one is not None and not one.spare  # no spare on CPU unless asked
    d["resources"]["world_size"] = 2
    d["knobs"] = {"micro_batch_size": {"values": [1, 2]}}
    assert warm_settings(parse_space(d, "x")) is None  # several ranks: process groups
    d["resources"]["world_size"] = 1
    d["workload"] = {"name": "sim"}
    assert warm_settings(parse_space(d, "x")) is None


def test_the_cpu_runner_keeps_a_process_per_trial_by_default(tmp_path: Any) -> None:
    space = load_space(EXAMPLES / "tiny_gpt_cpu.yaml")
    r = make_runner(space)
    assert isinstance(r, LocalRunner) and r.warm is None
    assert r.devices_held == 2  # one slot of two ranks
