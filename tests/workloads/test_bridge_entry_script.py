"""dse's Bridge entry script (dse/workloads/launchers/bridge_entry.py) run as a script, the way a
trial runs it (a copy named ``dse_bridge_entry.py`` in the trial folder), on the stand-in
Bridge of tests/workloads/bridge_standin: the user's script or module runs as ``__main__``
with the arguments after ``--``; a mixed-precision preset is resolved before its fields are
overridden; rank 0 alone writes the resolved fields; nothing of dse is imported. Then the
helpers it is built from, on the edge cases a trial rarely shows."""

from __future__ import annotations

import enum
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dse.workloads.launchers import bridge_entry as be
from dse.workloads.launchers.bridge import ENTRY_FILE
from dse.workloads.logs import parse_log
from tests.conftest import needs_megatron

STANDIN = Path(__file__).resolve().parent / "bridge_standin"
RUN_RECIPE = STANDIN / "run_recipe.py"


def _entry(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python dse_bridge_entry.py ARGS`` in ``tmp_path`` with the stand-in Bridge on the
    path and the resolved file at ``tmp_path/resolved.json``."""
    script = tmp_path / ENTRY_FILE
    if not script.exists():
        shutil.copyfile(Path(be.__file__), script)
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")}
    full |= {"PYTHONPATH": str(STANDIN), be.RESOLVED_ENV: str(tmp_path / "resolved.json")}
    full |= env
    return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _resolved(tmp_path: Path) -> dict[str, Any]:
    data = json.loads((tmp_path / "resolved.json").read_text())
    assert data["source"] == "Megatron-Bridge ConfigContainer after runtime_config_update"
    fields: dict[str, Any] = data["fields"]
    return fields


def test_runs_the_bridge_script_with_its_arguments_and_writes_what_it_resolved(
    tmp_path: Path,
) -> None:
    proc = _entry(tmp_path, "--script", str(RUN_RECIPE), "--", "--recipe", "omni_like",
                  "mixed_precision.grad_reduce_in_fp32=true", "train.train_iters=3",
                  "ddp.overlap_grad_reduce=true")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    parsed = parse_log(proc.stdout)  # the script's own output, unchanged
    assert [s.step for s in parsed.steps] == [1, 2, 3] and parsed.total_steps == 3
    fields = _resolved(tmp_path)
    # the override landed on the recipe's mixed-precision config, which runtime_config_update
    # copied onto the model, optimizer and DDP configs (the recipe itself has it off)
    assert fields["mixed_precision.grad_reduce_in_fp32"] is True
    assert fields["ddp.grad_reduce_in_fp32"] is True
    assert fields["model.bf16"] is True and fields["optimizer.bf16"] is True
    assert fields["train.train_iters"] == 3 and fields["ddp.overlap_grad_reduce"] is True
    assert fields["optimizer.lr"] == 1e-4 and fields["logger.log_interval"] == 10
    # only the sections the container has, each field as section.field
    assert {k.split(".")[0] for k in fields} == {
        "model", "ddp", "optimizer", "train", "dataset", "logger", "mixed_precision",
    }  # fmt: skip
    assert not (tmp_path / "resolved.json.tmp").exists()  # written whole, then renamed


def test_without_the_entry_the_same_command_keeps_the_recipes_setting(tmp_path: Path) -> None:
    """The capability the entry adds: run directly, the stand-in Bridge script takes the
    override too, but writes no resolved file for dse to check."""
    env = {**os.environ, "PYTHONPATH": str(STANDIN), be.RESOLVED_ENV: str(tmp_path / "r.json")}
    proc = subprocess.run([sys.executable, str(RUN_RECIPE), "--recipe", "omni_like",
                           "train.train_iters=1"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("preset", ["bf16_mixed", "'bf16_mixed'", '"bf16_mixed"'])
def test_a_preset_override_is_resolved_before_its_fields_are_set(
    tmp_path: Path, preset: str
) -> None:
    """``mixed_precision=bf16_mixed`` replaces the recipe's config with Bridge's preset (fp32
    reduction on), then ``mixed_precision.grad_reduce_in_fp32=false`` sets it off again."""
    proc = _entry(tmp_path, "--script", str(RUN_RECIPE), "--", "--recipe", "omni_like",
                  f"+mixed_precision={preset}", "mixed_precision.grad_reduce_in_fp32=false",
                  "train.train_iters=1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    fields = _resolved(tmp_path)
    assert fields["mixed_precision.grad_reduce_in_fp32"] is False
    assert fields["ddp.grad_reduce_in_fp32"] is False and fields["model.bf16"] is True


def test_a_recipes_preset_string_is_resolved_before_its_fields_are_set(tmp_path: Path) -> None:
    """Without the entry the stand-in (as OmegaConf) cannot set a field below a string; the
    entry resolves the recipe's preset first."""
    args = ["--recipe", "preset_like", "mixed_precision.grad_reduce_in_fp32=false",
            "train.train_iters=1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(STANDIN)}
    plain = subprocess.run([sys.executable, str(RUN_RECIPE), *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert plain.returncode != 0 and "Could not override" in plain.stderr
    proc = _entry(tmp_path, "--script", str(RUN_RECIPE), "--", *args)
    assert proc.returncode == 0, proc.stderr
    fields = _resolved(tmp_path)
    assert fields["ddp.grad_reduce_in_fp32"] is False and fields["model.bf16"] is True


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"SLURM_PROCID": "2"}])
def test_only_rank_0_writes_the_resolved_file(tmp_path: Path, env: dict[str, str]) -> None:
    proc = _entry(tmp_path, "--script", str(RUN_RECIPE), "--", "--recipe", "omni_like",
                  "train.train_iters=1", **env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "iteration" in proc.stdout and not (tmp_path / "resolved.json").exists()
    # RANK decides where torchrun sets it, whatever Slurm's task id says
    proc = _entry(tmp_path, "--script", str(RUN_RECIPE), "--", "--recipe", "omni_like",
                  "train.train_iters=1", RANK="0", SLURM_PROCID="3")  # fmt: skip
    assert proc.returncode == 0 and (tmp_path / "resolved.json").exists()


_PROBE = """
import json, sys
import megatron.bridge.training.pretrain as pretrain_mod
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.utils import omegaconf_utils

cfg = omegaconf_utils.process_config_with_overrides(
    ConfigContainer(mixed_precision="bf16_mixed"), cli_overrides=sys.argv[1:])
pretrain_mod.runtime_config_update(cfg)  # the module attribute: the entry's wrapper
print("PROBE", json.dumps({"argv": sys.argv[1:], "name": __name__,
                           "dse": sorted(m for m in sys.modules if m.split(".")[0] == "dse")}))
"""


def test_runs_a_module_as_main_and_imports_nothing_of_dse(tmp_path: Path) -> None:
    """``--module`` runs a module as ``__main__`` with the same hooks; the entry runs in the
    recipe's container, where dse is not installed, so it must import none of it."""
    (tmp_path / "probe_main.py").write_text(_PROBE)
    args = ["mixed_precision.grad_reduce_in_fp32=false", "train.micro_batch_size=2"]
    proc = _entry(tmp_path, "--module", "probe_main", "--", *args,
                  PYTHONPATH=f"{STANDIN}{os.pathsep}{tmp_path}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    got = json.loads(line.removeprefix("PROBE "))
    assert got == {"argv": args, "name": "__main__", "dse": []}
    fields = _resolved(tmp_path)
    assert fields["train.micro_batch_size"] == 2 and fields["ddp.grad_reduce_in_fp32"] is False


@pytest.mark.parametrize(
    "args",
    [[], ["--script", "a.py", "--module", "m"]],
    ids=["neither", "both"],
)
def test_exactly_one_of_script_and_module(tmp_path: Path, args: list[str]) -> None:
    proc = _entry(tmp_path, *args)
    assert proc.returncode == 2 and "--script" in proc.stderr and "--module" in proc.stderr
    assert not (tmp_path / "resolved.json").exists()


# --- the helpers -----------------------------------------------------------------------------


class _Color(enum.Enum):
    RED = 1


def test_plain_keeps_json_values_and_marks_the_rest() -> None:
    for v in (None, True, 3, 2.5, "x"):
        assert be.plain(v) == v
    assert be.plain(_Color.RED) == "RED"
    assert be.plain((1, "a", [2, None])) == [1, "a", [2, None]]
    assert be.plain([1, object()]) is ...
    assert be.plain(print) is ... and be.plain({"a": 1}) is ...


@needs_megatron
def test_plain_writes_a_torch_dtype_by_its_name() -> None:
    import torch

    assert be.plain(torch.bfloat16) == "torch.bfloat16"
    assert be.plain([torch.float32]) == ["torch.float32"]
    assert be.plain(torch.zeros(1)) is ...  # a tensor is not a setting


def test_resolved_fields_of_sections_strings_and_others() -> None:
    from dataclasses import dataclass, field

    @dataclass
    class Model:
        bf16: bool = True
        init: Any = print  # a callable: not a plain setting
        layers: tuple[int, ...] = (1, 2)

    @dataclass
    class Container:
        model: Model = field(default_factory=Model)
        mixed_precision: Any = "bf16_mixed"  # a preset left unresolved
        ddp: Any = None
        train: Any = field(default_factory=dict)  # not a dataclass: left out

    assert be.resolved_fields(Container()) == {
        "model.bf16": True, "model.layers": [1, 2], "mixed_precision": "bf16_mixed",
    }  # fmt: skip


def test_split_preset() -> None:
    assert be.split_preset(["a=1", "+mixed_precision='bf16_mixed'", "b=2"]) == (
        "bf16_mixed", ["a=1", "b=2"],
    )  # fmt: skip
    for empty in ("mixed_precision=", "mixed_precision=null", "~mixed_precision=None"):
        assert be.split_preset([empty]) == (None, [empty])
    # a field of the config is no preset
    assert be.split_preset(["mixed_precision.bf16=true"]) == (None, ["mixed_precision.bf16=true"])


def test_prepare_mixed_precision_branches() -> None:
    resolved: list[str] = []

    def resolve(name: str) -> Any:
        resolved.append(name)
        return SimpleNamespace(preset=name)

    # no field of it overridden: the overrides go through untouched, nothing resolved
    cfg = SimpleNamespace(mixed_precision="bf16_mixed")
    ov = ["mixed_precision=fp16_mixed", "train.x=1"]
    assert be.prepare_mixed_precision(cfg, ov, resolve) == ov and resolved == []
    assert cfg.mixed_precision == "bf16_mixed"
    # the recipe's string preset, resolved first
    cfg = SimpleNamespace(mixed_precision="bf16_mixed")
    ov = ["mixed_precision.bf16=false", "train.x=1"]
    assert be.prepare_mixed_precision(cfg, ov, resolve) == ov
    assert cfg.mixed_precision.preset == "bf16_mixed" and resolved == ["bf16_mixed"]
    # an override's preset wins over the recipe's config and is not applied again
    cfg = SimpleNamespace(mixed_precision=SimpleNamespace(preset="recipe"))
    ov = ["~mixed_precision.grad_reduce_in_fp32=false", "mixed_precision=fp16_mixed"]
    assert be.prepare_mixed_precision(cfg, ov, resolve) == ov[:1]
    assert cfg.mixed_precision.preset == "fp16_mixed"
    # a config object and no preset: kept as it is
    mp = SimpleNamespace(preset="recipe")
    cfg = SimpleNamespace(mixed_precision=mp)
    assert be.prepare_mixed_precision(cfg, ["mixed_precision.bf16=true"], resolve) == [
        "mixed_precision.bf16=true"
    ]
    assert cfg.mixed_precision is mp
    # no mixed-precision config at all: its fields are dropped (nothing would copy them)
    cfg = SimpleNamespace(mixed_precision=None)
    assert be.prepare_mixed_precision(cfg, ["+mixed_precision.bf16=true", "a=1"], resolve) == [
        "a=1"
    ]
    assert cfg.mixed_precision is None and resolved == ["bf16_mixed", "fp16_mixed"]


def test_write_resolved_needs_a_path_and_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import dataclass

    @dataclass
    class Train:
        train_iters: int = 5

    cfg = SimpleNamespace(train=Train())
    monkeypatch.delenv(be.RESOLVED_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    be.write_resolved(cfg)  # no path: nothing written, no error
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "r.json"
    monkeypatch.setenv(be.RESOLVED_ENV, str(out))
    be.write_resolved(cfg)
    assert json.loads(out.read_text())["fields"] == {"train.train_iters": 5}
    other = tmp_path / "given.json"
    monkeypatch.setenv("RANK", "1")
    be.write_resolved(cfg, str(other))  # another rank: not even a given path
    assert not other.exists()
    monkeypatch.setenv("RANK", "0")
    be.write_resolved(cfg, str(other))  # the given path wins over the environment's
    assert json.loads(other.read_text())["fields"] == {"train.train_iters": 5}
