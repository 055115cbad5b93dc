"""dse's entry script of a Megatron-Bridge trial: the user's Bridge script, and what it resolved.

Runs inside the recipe's container, where dse is not installed: this file imports nothing of
dse (the trial process copies it into the trial folder as ``dse_bridge_entry.py``). Usage::

    torchrun ... dse_bridge_entry.py \\
        --script /opt/Megatron-Bridge/scripts/training/run_recipe.py -- --recipe NAME KEY=VALUE

It runs the script (or ``--module``) as ``__main__`` with the arguments after ``--``, changing
nothing of what the script does, with two of Bridge's own functions wrapped:

* ``megatron.bridge.training.utils.omegaconf_utils.process_config_with_overrides`` (how
  ``run_recipe.py`` and Bridge's example scripts apply ``KEY=VALUE`` overrides): where the
  overrides set fields of ``mixed_precision`` and the configuration names its mixed precision
  by a preset string (``mixed_precision=bf16_mixed``, in the recipe or an override), the
  preset is first resolved with Bridge's ``get_mixed_precision_config``, so that
  ``mixed_precision.grad_reduce_in_fp32=...`` lands on the config object that
  ``runtime_config_update`` copies onto the DDP, optimizer and model configs. Without a
  mixed-precision config such overrides are dropped (nothing copies then).
* ``megatron.bridge.training.pretrain.runtime_config_update`` (called by ``pretrain``, also
  under ``finetune``): after it ran, rank 0 writes the resolved fields (``section.field``:
  value, plain values only) as JSON to the path in ``DSE_RESOLVED_FILE``; the trial process
  compares them with what dse asked.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import runpy
import sys
from typing import Any

RESOLVED_ENV = "DSE_RESOLVED_FILE"
#: The sections of Bridge's ConfigContainer written to the resolved file.
SECTIONS = (
    "model", "ddp", "optimizer", "train", "dataset", "mixed_precision", "scheduler",
    "logger", "checkpoint", "dist", "rng", "comm_overlap", "tokenizer",
)  # fmt: skip
PRESET_KEY = "mixed_precision"


def plain(value: Any) -> Any:
    """A value as JSON holds it, or ``...`` where it is not a plain setting (a callable, a
    module, a nested config)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, list | tuple):
        items = [plain(v) for v in value]
        return ... if any(v is ... for v in items) else items
    mod = type(value).__module__
    if mod.startswith("torch") and type(value).__name__ == "dtype":
        return str(value)  # torch.bfloat16
    return ...


def resolved_fields(cfg: Any) -> dict[str, Any]:
    """``section.field`` -> plain value of every dataclass field of the config's sections."""
    import dataclasses

    out: dict[str, Any] = {}
    for section in SECTIONS:
        obj = getattr(cfg, section, None)
        if obj is None or not dataclasses.is_dataclass(obj):
            if isinstance(obj, str):
                out[section] = obj
            continue
        for f in dataclasses.fields(obj):
            v = plain(getattr(obj, f.name, None))
            if v is not ...:
                out[f"{section}.{f.name}"] = v
    return out


def _rank0() -> bool:
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def write_resolved(cfg: Any, path: str | None = None) -> None:
    path = path or os.environ.get(RESOLVED_ENV)
    if not path or not _rank0():
        return
    data = {
        "source": "Megatron-Bridge ConfigContainer after runtime_config_update",
        "fields": resolved_fields(cfg),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def split_preset(overrides: list[str]) -> tuple[str | None, list[str]]:
    """(the ``mixed_precision=PRESET`` override's preset, the other overrides)."""
    preset, rest = None, []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") == PRESET_KEY and value not in ("", "null", "None"):
            preset = value.strip("'\"")
        else:
            rest.append(o)
    return preset, rest


def prepare_mixed_precision(config: Any, overrides: list[str], resolve: Any) -> list[str]:
    """Resolve a mixed-precision preset (``resolve``: Bridge's get_mixed_precision_config)
    where the overrides set its fields; returns the overrides still to apply."""
    touches = any(o.lstrip("+~").startswith(PRESET_KEY + ".") for o in overrides)
    if not touches:
        return overrides
    preset, rest = split_preset(overrides)
    if preset is not None:
        config.mixed_precision = resolve(preset)
    elif isinstance(getattr(config, PRESET_KEY, None), str):
        config.mixed_precision = resolve(config.mixed_precision)
    if getattr(config, PRESET_KEY, None) is None:
        rest = [o for o in rest if not o.lstrip("+~").startswith(PRESET_KEY + ".")]
    return rest


def install_hooks() -> None:
    """Wrap Bridge's override and runtime-update functions (see the module docstring)."""
    import megatron.bridge.training.pretrain as pretrain_mod
    import megatron.bridge.training.utils.omegaconf_utils as ou
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    apply = ou.process_config_with_overrides

    def process_config_with_overrides(config: Any, *args: Any, **kwargs: Any) -> Any:
        overrides = kwargs.get("cli_overrides")
        if overrides:
            kwargs["cli_overrides"] = (
                prepare_mixed_precision(config, list(overrides), get_mixed_precision_config)
                or None
            )
        return apply(config, *args, **kwargs)

    ou.process_config_with_overrides = process_config_with_overrides
    update = pretrain_mod.runtime_config_update

    def runtime_config_update(cfg: Any) -> None:
        update(cfg)
        write_resolved(cfg)

    pretrain_mod.runtime_config_update = runtime_config_update


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--script", help="the Bridge script to run (run_recipe.py, an example)")
    g.add_argument("--module", help="a module to run instead")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="after --: the script's arguments")
    args = p.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    install_hooks()
    if args.script:
        sys.argv = [args.script, *rest]
        runpy.run_path(args.script, run_name="__main__")
    else:
        sys.argv = [args.module, *rest]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
