"""NeMo 2.0 recipes through NeMo-Run: ``nemo llm pretrain --factory NAME KEY=VALUE -y``.

Knob fields become NeMo-Run overrides of the recipe's ``run.Partial``: parallel sizes under
``trainer.strategy`` (``nl.MegatronStrategy``), DDP fields under ``trainer.strategy.ddp``,
other ``TransformerConfig`` fields under ``model.config``, ``OptimizerConfig`` fields under
``optim.config``, the micro-batch under ``data`` (reference knob catalog, section 3). The
MoE routing a study holds fixed (``semantics.moe_routing``, ``TransformerConfig`` field names)
is given field by field under ``model.config``, every field, over the recipe's own.
Values use Python literal syntax (``True``, ``None``, ``['core_attn']``). NeMo-Run's local
executor starts torchrun itself with ``trainer.devices`` processes per node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dse.workloads.launchers._core import (
    Launcher,
    NotTaken,
    _layout,
    dse_only,
    lora_fields,
    packing_fields,
    routing_fields,
)
from dse.workloads.launchers.nemo_installed import (
    CPU_ENTRY_MODULE,
    PYTHON_ENV,
    mismatch_reasons,
    nemo_python,
    request_for,
    resolvable,
    resolve,
)

__all__ = ["NemoLauncher", "python_value"]

_STRATEGY = {
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    # MegatronStrategy's pipeline split fields (nemo/lightning/pytorch/strategies/
    # megatron_strategy.py), passed on to the model's TransformerConfig
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
}
#: OptimizerConfig fields that hold a torch.dtype: a command-line override cannot build one.
_DTYPE_FIELDS = {"main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"}


def python_value(v: Any) -> str:
    """A value in the Python literal syntax NeMo-Run's CLI parses."""
    if isinstance(v, str):
        return v
    return repr(v)


class NemoLauncher(Launcher):
    name = "nemo"
    log_format = "nemo"
    # NeMo-Run's SlurmExecutor (no torchrun launcher) starts one task per GPU and Lightning's
    # SLURMEnvironment takes the ranks from them; one task per node with trainer.devices=8
    # is refused by Lightning (devices and --ntasks-per-node must agree)
    task_per_gpu = True

    def entry(self, python: str | None) -> list[str]:
        if not self.spec.recipe:
            raise NotTaken("workload.launcher.recipe", None, "a NeMo recipe factory is needed")
        if self.spec.module == CPU_ENTRY_MODULE and not self.spec.python:
            # dse's module runs in the interpreter that has NeMo 2.0, where one is named
            python = os.environ.get(PYTHON_ENV) or python
        if self.spec.module:
            head = [python or "python", "-m", self.spec.module]
        elif self.spec.script:
            head = [python or "python", self.spec.script]
        else:
            head = ["nemo", "llm", self.spec.task or "pretrain"]
        return [*head, "--factory", self.spec.recipe, "-y", *self.spec.args]

    def key(self, section: str, fld: str) -> str:
        if section == "model" and fld in _STRATEGY:
            return f"trainer.strategy.{fld}"
        if section == "model":
            return f"model.config.{fld}"
        if section == "ddp":
            return f"trainer.strategy.ddp.{fld}"
        if section == "optimizer":
            return f"optim.config.{fld}"
        return f"data.{fld}"

    def check_resolution(self, argvs: list[list[str]]) -> list[str]:
        """Where an interpreter has NeMo 2.0 (:mod:`.nemo_installed`): each rendered command's
        overrides applied to the recipe NeMo's own factory builds, resolved as NeMo's trainer
        resolves them; a field that ends another value than dse set, or a configuration NeMo
        refuses, is a problem naming it. Nothing is said where NeMo is not installed."""

        if not self.spec.recipe or not nemo_python():
            return []
        if not resolvable(self.spec.module, self.spec.script):
            return []
        unique = list({tuple(a): a for a in argvs}.values())
        requests = [
            req
            for argv in unique
            if (req := request_for(self.spec.recipe, self.spec.task, argv)) is not None
        ]
        got = resolve(requests)
        if not got.get("importable"):
            return []
        out: list[str] = []
        for res in got.get("results", []):
            out += [f"NeMo: {r}" for r in mismatch_reasons(res) if f"NeMo: {r}" not in out]
        return out

    def knob_overrides(self, params: Mapping[str, Any]) -> list[str]:
        out: dict[str, Any] = {}
        for name, value, a in self.assignments_of(params):
            why = dse_only(name, value)
            if why:
                raise NotTaken(name, value, why)
            if name == "use_megatron_fsdp" and value:
                raise NotTaken(
                    name,
                    value,
                    "NeMo 2.0's MegatronStrategy wraps the model in Megatron FSDP only with its "
                    "fsdp='megatron' argument (which sets ddp_config.use_custom_fsdp; "
                    "nemo/lightning/pytorch/strategies/megatron_strategy.py); "
                    "trainer.strategy.ddp.use_megatron_fsdp alone keeps the DDP wrapper. Set "
                    "fsdp in the recipe factory",
                )
            if a.section == "optimizer" and a.field in _DTYPE_FIELDS:
                raise NotTaken(
                    name,
                    value,
                    f"optim.config.{a.field} is a torch.dtype, which a NeMo-Run command-line "
                    "override cannot express; set it in the recipe factory",
                )
            out[self.key(a.section, a.field)] = a.value
        return [f"{k}={python_value(v)}" for k, v in out.items()]

    def semantics_overrides(self) -> list[str]:
        sem = self.space.semantics
        _world, per, nodes = _layout(self.space)
        return [
            f"trainer.num_nodes={nodes}",
            f"trainer.devices={per}",
            f"trainer.max_steps={self.space.measurement.steps(sem.steps)}",
            "trainer.log_every_n_steps=1",
            f"data.global_batch_size={sem.global_batch_size}",
            f"data.seq_length={sem.seq_length}",
            *(f"{self.key('model', f)}={python_value(v)}"
              for f, v in routing_fields(sem.moe_routing)),
            *(f"peft.{f}={python_value(v)}" for f, v in lora_fields(sem.peft)),
            *(f"{k}={python_value(v)}"
              for k, v in packing_fields(sem.packed_sequences, sem.seq_length, "nemo")),
        ]  # fmt: skip

    def fixed_overrides(self) -> list[str]:
        return [f"{k}={python_value(v)}" for k, v in self.spec.overrides.items()]

    def base_env(self) -> dict[str, str]:
        # NeMo logs peak memory per step with this set (NeMo PR "Added memory logger").
        return {"NEMO_LOG_MEMORY_USAGE": "1"}
