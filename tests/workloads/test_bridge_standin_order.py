"""The tests' stand-in of Megatron-Bridge (tests/workloads/bridge_standin) does what Bridge's
``runtime_config_update`` does, in Bridge's order: the calls of Bridge's function at the
pinned commit (tests/fixtures/upstream/bridge_config.json, ``runtime_config_update``,
extracted by scripts/extract_upstream_bridge.py and re-extracted by
test_upstream_names.py where the clones are at hand) are the stand-in's calls, in the same
order. A field the recipe's environment, the communication-overlap setup or the validation
overwrites is then checked against what Bridge would resolve, not against a shortcut."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.workloads import upstream

ROOT = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).resolve().parent / "bridge_standin"
CONFIG = STANDIN / "megatron" / "bridge" / "training" / "config.py"


def _common() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "extract_upstream_common", ROOT / "scripts" / "extract_upstream_common.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_the_standin_calls_what_bridge_calls_in_bridges_order() -> None:
    want = upstream.load("bridge_config")["runtime_config_update"]
    # the three steps the stand-in once left out are in Bridge's function
    for step in ("apply_environment_variables", "cfg.comm_overlap.setup", "cfg.validate"):
        assert step in want
    assert want.index("apply_environment_variables") == 0  # before everything else
    assert want[-1] == "cfg.validate"  # after everything else
    got = _common().call_order(CONFIG.read_text(), "runtime_config_update")
    assert got == want


def test_a_reordered_standin_fails_the_check() -> None:
    """The check is order-sensitive: the stand-in with the validation before the
    communication-overlap setup is not Bridge's."""
    text = CONFIG.read_text()
    setup = "        cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)\n"
    dp = "    cfg.set_data_parallel_size()\n"
    moved = text.replace(setup + "    cfg.validate()", setup.rstrip("\n"))
    moved = moved.replace(dp, "    cfg.validate()\n" + dp)
    assert moved != text
    common = _common()
    assert (
        common.call_order(moved, "runtime_config_update")
        != upstream.load("bridge_config")["runtime_config_update"]
    )
    with pytest.raises(LookupError):
        common.call_order(text, "no_such_function")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in [
        m for m in sys.modules if m == "megatron.bridge" or m.startswith("megatron.bridge.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    import megatron.bridge.training.config as cfgmod

    return cfgmod


def test_the_steps_overwrite_what_bridge_overwrites(
    standin: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("NCCL_DSE_KEPT", "from-the-launcher")
    monkeypatch.delenv("NCCL_DSE_DEFAULT", raising=False)
    cfg = standin.ConfigContainer(
        comm_overlap=standin.CommOverlapConfig(),
        env_vars={"NCCL_DSE_KEPT": "recipe", "NCCL_DSE_DEFAULT": 7},
    )
    cfg.ddp.use_distributed_optimizer = True
    cfg.ddp.overlap_grad_reduce = False  # an override the overlap setup undoes at DP 4
    standin.runtime_config_update(cfg)
    assert os.environ["NCCL_DSE_KEPT"] == "from-the-launcher"  # the process's value wins
    assert os.environ["NCCL_DSE_DEFAULT"] == "7"  # the recipe's default fills the gap
    assert cfg.data_parallel_size == 4
    assert cfg.ddp.overlap_grad_reduce is True and cfg.ddp.overlap_param_gather is True
    bad = standin.ConfigContainer()
    bad.train.global_batch_size = 6  # not a multiple of MBS 1 x DP 4
    with pytest.raises(AssertionError, match="divisible"):
        standin.runtime_config_update(bad)
