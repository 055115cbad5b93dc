"""Megatron-Bridge recipes: ``torchrun scripts/training/run_recipe.py --recipe NAME KEY=VALUE``.

Knob fields become ``ConfigContainer`` overrides (``model.tensor_model_parallel_size=2``,
``ddp.overlap_grad_reduce=true``, ``optimizer.main_grads_dtype=bf16``,
``train.micro_batch_size=4``), in the Hydra syntax ``run_recipe.py`` applies
(``process_config_with_overrides``: ``null``, ``true``/``false``, ``[a,b]``). The dataset
owns the sequence length (``dataset.seq_length``; the runner syncs ``model.seq_length``).
The MoE routing a study holds fixed (``semantics.moe_routing``, ``TransformerConfig`` field
names, which Bridge's model providers share) is given field by field as ``model.<field>``,
every field, so a recipe's own routing (a provider's sigmoid router, its expert bias) cannot
stand in for the declared one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dse.core.exceptions import SpaceError
from dse.workloads.launchers._compare import compare
from dse.workloads.launchers._core import (
    Launcher,
    NotTaken,
    dse_only,
    lora_fields,
    packing_fields,
    routing_fields,
)
from dse.workloads.launchers.bridge_installed import recipe_problem, resolve_recipe

__all__ = [
    "BridgeLauncher",
    "ENTRY_FILE",
    "MIXED_PRECISION_FIELDS",
    "RUN_RECIPE",
    "hydra_value",
    "resolved_expectations",
]

#: A float in exponent form without a dot (``1e-05``, how Python prints small floats): a
#: float to Hydra's override grammar, a string to PyYAML's YAML 1.1 resolver.
EXPONENT_FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")
#: The launcher script of Megatron-Bridge, where the NeMo containers keep their Bridge
#: checkout: absolute, since a trial starts in its own folder (local runner) or with
#: ``--container-workdir=<trial dir>`` (Slurm + pyxis). ``workload.launcher.script`` overrides.
RUN_RECIPE = "/opt/Megatron-Bridge/scripts/training/run_recipe.py"
#: dse's entry script (:mod:`dse.workloads.launchers.bridge_entry`) as the trial process
#: copies it into the trial folder, where the trial starts (local runner: its cwd; Slurm:
#: ``--container-workdir``).
ENTRY_FILE = "dse_bridge_entry.py"
#: The fields of Bridge's ``MixedPrecisionConfig`` (training/mixed_precision.py, Bridge 0.6):
#: ``runtime_config_update`` runs after the CLI overrides and ``MixedPrecisionConfig.setup``
#: copies each of them onto the model, optimizer and DDP configs that have a field of that
#: name. A knob that sets one of them is also given as ``mixed_precision.<field>``.
MIXED_PRECISION_FIELDS = frozenset({
    "fp32", "fp16", "bf16", "params_dtype", "pipeline_dtype", "autocast_dtype",
    "autocast_enabled", "grad_reduce_in_fp32", "fp8", "fp8_recipe", "first_last_layers_bf16",
    "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_wgrad",
    "fp8_dot_product_attention", "fp8_multi_head_attention", "fp8_param", "fp8_param_gather",
    "fp4", "fp4_recipe", "fp4_param", "fp4_param_gather", "loss_scale", "initial_loss_scale",
    "min_loss_scale", "loss_scale_window", "hysteresis", "num_layers_at_start_in_bf16",
    "num_layers_at_end_in_bf16", "reuse_grad_buf_for_mxfp8_param_ag",
})  # fmt: skip


def hydra_value(v: Any) -> str:
    """A value in Hydra override syntax."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    return str(v)


class BridgeLauncher(Launcher):
    name = "bridge"
    log_format = "bridge"

    def entry(self, python: str | None) -> list[str]:
        spec = self.spec
        if spec.config_file and not (spec.script or spec.module):
            raise SpaceError(
                f"workload.launcher.config_file needs a script that takes --config-file "
                f"(Bridge's example pretrain_*.py scripts); {RUN_RECIPE} takes --recipe "
                f"(config_file={spec.config_file!r})"
            )
        if not (spec.recipe or spec.module or spec.script):
            raise SpaceError(
                "workload.launcher: a Bridge recipe function (recipe), or a script/module that "
                "builds its own ConfigContainer, is needed"
            )
        head = self.torchrun(python)
        if self.wrapped:  # dse's entry script runs the user's script and dumps what it resolved
            head += [ENTRY_FILE, *(["--module", spec.module] if spec.module else
                                   ["--script", spec.script or RUN_RECIPE]), "--"]  # fmt: skip
        elif spec.module:
            head += ["-m", spec.module]
        else:
            head.append(spec.script or RUN_RECIPE)
        if spec.recipe:
            head += ["--recipe", spec.recipe]
        if spec.config_file:
            head += ["--config-file", spec.config_file]
        return head + list(spec.args)

    @property
    def wrapped(self) -> bool:
        """The trial runs under dse's entry script (:mod:`.bridge_entry`): whenever the
        resolved-configuration check is on."""
        return self.spec.check_resolved

    def check_installed(self) -> str | None:
        if not self.spec.recipe or self.spec.module or self.spec.script:
            return None  # a script of the user's own builds its own configuration
        return recipe_problem(self.spec.recipe, python=self.spec.python)

    def check_resolution(self, argvs: list[list[str]]) -> list[str]:
        if not self.spec.recipe or self.spec.module or self.spec.script:
            return []
        unique = list({tuple(a): a for a in argvs}.values())
        runs = resolve_recipe(self.spec.recipe, unique, python=self.spec.python) or []
        out: list[str] = []
        for argv, run in zip(unique, runs, strict=False):
            texts = (
                [f"Bridge refuses a rendered configuration: {run['error']}"] if "error" in run
                else [f"the recipe overwrites {m}"
                      for m in compare(resolved_expectations(argv), run["fields"])]
            )  # fmt: skip
            out += [t for t in texts if t not in out]
        return out

    def knob_overrides(self, params: Mapping[str, Any]) -> list[str]:
        out: dict[str, Any] = {}
        for name, value, a in self.assignments_of(params):
            why = dse_only(name, value)
            if why:
                raise NotTaken(name, value, why)
            out[f"{a.section}.{a.field}"] = a.value
            if self.wrapped and a.section in ("model", "ddp", "optimizer"):
                if a.field in MIXED_PRECISION_FIELDS:  # else runtime_config_update undoes it
                    out[f"mixed_precision.{a.field}"] = a.value
        return [f"{k}={hydra_value(v)}" for k, v in out.items()]

    def semantics_overrides(self) -> list[str]:
        sem = self.space.semantics
        return [
            f"train.train_iters={self.space.measurement.steps(sem.steps)}",
            f"train.global_batch_size={sem.global_batch_size}",
            f"dataset.seq_length={sem.seq_length}",
            "logger.log_interval=1",
            *(f"model.{f}={hydra_value(v)}" for f, v in routing_fields(sem.moe_routing)),
            *(f"peft.{f}={hydra_value(v)}" for f, v in lora_fields(sem.peft)),
            *(
                f"{k}={hydra_value(v)}"
                for k, v in packing_fields(sem.packed_sequences, sem.seq_length, "bridge")
            ),
        ]

    def fixed_overrides(self) -> list[str]:
        return [f"{k}={hydra_value(v)}" for k, v in self.spec.overrides.items()]


def resolved_expectations(argv: list[str]) -> dict[str, Any]:
    """The ``ConfigContainer`` fields a Bridge command sets: dotted key -> value, from its
    ``key=value`` overrides (Hydra syntax, read back as Hydra reads it). What dse's entry
    script's ``resolved.json`` must show after ``runtime_config_update``."""
    import yaml

    out: dict[str, Any] = {}
    for tok in argv:
        if tok.startswith("-") or "=" not in tok or tok.startswith("~"):
            continue
        key, _, raw = tok.partition("=")
        key = key.lstrip("+")
        if "." not in key or not key.replace(".", "").replace("_", "").isalnum():
            continue
        try:
            out[key] = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            out[key] = raw
        out[key] = _exponent_floats(out[key])
    return out


def _exponent_floats(v: Any) -> Any:
    """``v`` as read by PyYAML, with each string that is a float in exponent form (``1e-05``)
    the float Hydra reads there (in lists too; a quoted '1e-05' is taken as the float)."""
    if isinstance(v, str) and EXPONENT_FLOAT.fullmatch(v):
        return float(v)
    if isinstance(v, list):
        return [_exponent_floats(x) for x in v]
    return v
