"""bench/host_jitter.py: the conditions run interleaved on a real (CPU, tiny) Megatron-Core
model in a process of its own, each window's steps are recorded, and bad arguments are
refused naming what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_megatron

REPO = Path(__file__).resolve().parents[2]


def _bench(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "host_jitter.py"),
         "--space", str(REPO / "examples" / "tiny_gpt_cpu.yaml"), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


@needs_megatron
def test_conditions_are_interleaved_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "jitter.json"
    conditions = "default,legacy_loss,legacy_norm"
    r = _bench("--config", "micro_batch_size=2", "--steps", "5", "--repeats", "2", "--conditions",
               conditions, "--json", str(out), tmp_path=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    (cfg,) = data["configs"]
    assert cfg["config"] == {"micro_batch_size": 2}
    order = [(w["condition"], w["repeat"]) for w in cfg["windows"]]
    assert order == [("default", 0), ("legacy_loss", 0), ("legacy_norm", 0),
                     ("default", 1), ("legacy_loss", 1), ("legacy_norm", 1)]  # fmt: skip
    for w in cfg["windows"]:
        assert len(w["steps"]) == 5
        assert all(s["step_time_s"] > 0 and s["thread_cpu_s"] >= 0 for s in w["steps"])
        assert w["summary"]["median_step_s"] > 0
    assert cfg["syncs_per_step"] == {}  # counted on CUDA only


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--config", "micro_batch_size=1", "--conditions", "default,fast"],
            "'fast' is not one of",
        ),
        (["--config", "micro_batch_size"], "is not KNOB=VALUE"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    r = _bench(*args, tmp_path=tmp_path)
    assert r.returncode != 0
    assert message in r.stderr


_SWAP_PROBE = r"""
import json, sys, types
sys.path.insert(0, sys.argv[1])
import host_jitter as hj
from megatron.core import utils
from megatron.core.optimizer import clip_grads
from dse.workloads.megatron import _compat

_compat.apply()
tr = types.SimpleNamespace(trainer=types.SimpleNamespace(_loss_func="dse"))
seen = {}
for cond in ("default", "legacy_loss", "legacy_norm"):
    try:
        with hj._legacy_parts(tr, cond):
            ref = utils.local_multi_tensor_l2_norm
            seen[cond] = {"loss": tr.trainer._loss_func is hj._legacy_loss_func,
                          "megatron_norm": clip_grads.l2_norm_impl is ref}
            if cond == "legacy_norm":
                raise RuntimeError("the window failed")
    except RuntimeError:
        pass
seen["after"] = {"loss": tr.trainer._loss_func == "dse",
                 "dse_norm": clip_grads.l2_norm_impl is _compat.l2_norm_on_device}
print(json.dumps(seen))
"""


@needs_megatron
def test_legacy_conditions_swap_one_part_each_and_restore_it() -> None:
    r = subprocess.run([sys.executable, "-c", _SWAP_PROBE, str(REPO / "bench")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["default"] == {"loss": False, "megatron_norm": False}
    assert seen["legacy_loss"] == {"loss": True, "megatron_norm": False}
    assert seen["legacy_norm"] == {"loss": False, "megatron_norm": True}
    assert seen["after"] == {"loss": True, "dse_norm": True}  # restored, even after an error
