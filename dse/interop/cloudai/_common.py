"""The mapping tables (the one place the CloudAI field names live), the import's result types
and the TOML reading every part of the CloudAI interop shares.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dse.core.bounds import MAX_SPACE_BYTES, read_regular_file
from dse.core.exceptions import SpaceError
from dse.core.safeyaml import comment
from dse.space.knobs import KNOBS

# --- the mapping tables (CloudAI field -> dse) -------------------------------------------

#: NeMoRun ``cmd_args`` paths that set one dse knob, value for value (CloudAI's
#: ``NeMoRunCmdArgs``: trainer.strategy, trainer.plugins, data, optim.config): the knob
#: catalog's ``Knob.cloudai["NeMoRun"]``.
NEMO_RUN_KNOBS: dict[str, str] = {
    k.cloudai["NeMoRun"]: name for name, k in KNOBS.items() if "NeMoRun" in k.cloudai
}

#: MegatronBridge ``cmd_args`` (CloudAI's ``MegatronBridgeCmdArgs``) that set one dse knob,
#: value for value (Megatron-Bridge's perf launcher flags -tp ... --moe_a2a_overlap, which
#: Bridge's _set_moe_a2a_overlap_overrides turns into
#: comm_overlap.overlap_moe_expert_parallel_comm): ``Knob.cloudai["MegatronBridge"]``.
BRIDGE_KNOBS: dict[str, str] = {
    k.cloudai["MegatronBridge"]: name for name, k in KNOBS.items() if "MegatronBridge" in k.cloudai
}

#: MegatronBridge fields renamed by CloudAI (December 2025), still read on import: old ->
#: current. The old ``model_name`` + ``model_size`` together name the recipe
#: (``qwen3`` + ``30b_a3b`` -> ``qwen3_30b_a3b``).
BRIDGE_RENAMED: dict[str, str] = {
    "model_name": "model_family_name",
    "model_size": "model_recipe_name",
}

#: MegatronBridge ``compute_dtype`` -> dse's FP8 knobs (fp8, fp8_recipe), as Megatron-Bridge's
#: perf scripts' get_precision_config picks the MixedPrecisionConfig preset:
#: fp8_cs bf16_with_fp8_current_scaling_mixed, fp8_mx bf16_with_mxfp8_mixed, fp8_sc
#: bf16_with_fp8_subchannel_scaling_mixed, fp8_ds (older ``fp8`` + ``fp8_recipe = "ds"``)
#: bf16_with_fp8_delayed_scaling_mixed.
COMPUTE_DTYPES: dict[str, tuple[str | None, str | None]] = {
    "bf16": (None, None),
    "fp8_cs": ("hybrid", "tensorwise"),
    "fp8_mx": ("e4m3", "mxfp8"),
    "fp8_sc": ("hybrid", "blockwise"),
    "fp8_ds": ("hybrid", "delayed"),
}
#: Older MegatronBridge ``compute_dtype = "fp8"`` with ``fp8_recipe`` (ds/cs/mx/ss).
_OLD_FP8_RECIPES = {"ds": "fp8_ds", "cs": "fp8_cs", "mx": "fp8_mx", "ss": "fp8_sc"}
#: Megatron-Bridge mixed_precision preset names (a launcher override) -> compute_dtype.
_MIXED_PRECISION = {
    "bf16_mixed": "bf16",
    "bf16_with_fp8_current_scaling_mixed": "fp8_cs",
    "bf16_with_mxfp8_mixed": "fp8_mx",
    "bf16_with_fp8_subchannel_scaling_mixed": "fp8_sc",
    "bf16_with_fp8_delayed_scaling_mixed": "fp8_ds",
    "bf16_with_fp8_mixed": "fp8_ds",
}
#: The Megatron-Bridge mixed_precision presets that keep the parameters in FP8: they set
#: ``fp8_param_gather = True``, which Bridge's MixedPrecisionConfig copies to the model's
#: ``fp8_param`` (src/megatron/bridge/training/mixed_precision.py); the subchannel-scaling,
#: NVFP4 and BF16 presets leave it False. The performance recipes' ``_perf_precision`` keeps it.
_FP8_PARAM_PRESETS = frozenset({
    "bf16_with_fp8_current_scaling_mixed",
    "bf16_with_mxfp8_mixed",
    "bf16_with_fp8_delayed_scaling_mixed",
})  # fmt: skip

#: Training semantics (never knobs): CloudAI field -> ``semantics`` field.
_SEMANTICS = {
    "nemo": {
        "data.global_batch_size": "global_batch_size",
        "data.seq_length": "seq_length",
        "trainer.max_steps": "steps",
    },
    "bridge": {"gb": "global_batch_size", "seq_length": "seq_length", "max_steps": "steps"},
}

#: MegatronBridge fields that are CloudAI's or the launcher's bookkeeping, not part of what a
#: trial trains (listed as not mapped when set, with this reason).
_BRIDGE_BOOKKEEPING = {
    "log_dir", "dryrun", "enable_nsys", "save_config_filepath", "max_retries", "nemo_home",
    "wandb_key", "wandb_project_name", "wandb_entity_name", "wandb_experiment_name",
    "wandb_save_dir", "pytorch_profiler", "profiling_start_step", "profiling_stop_step",
    "record_memory_history", "profiling_gpu_metrics", "profiling_ranks", "nsys_trace",
    "nsys_extra_args", "list_config_variants", "config_variant", "use_recipes",
    "venv_path", "megatron_bridge_dir", "pretrained_checkpoint", "save_dir", "load_dir",
    "save_interval", "most_recent_k",
}  # fmt: skip


#: CloudAI agents -> dse agents by meaning (CloudAI's own registry ships grid_search; the
#: others are the plug-in agents' names: bo_gp a Bayesian optimisation with a Gaussian
#: process, ga a genetic algorithm).
AGENTS: dict[str, str] = {
    "grid_search": "grid",
    "bo_gp": "gp",
    "bo": "gp",
    "bayesian_optimization": "gp",
    "random": "random",
    "random_search": "random",
    "ga": "nsga2",
    "genetic_algorithm": "nsga2",
    "tpe": "tpe",
}

#: CloudAI ``gpu_type`` -> the GPU name dse's cost model knows.
_GPU_NAMES = {
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "gb200": "NVIDIA GB200",
    "b300": "NVIDIA B300",
    "gb300": "NVIDIA GB300",
}

#: CloudAI agent metrics -> dse objective (NeMoRun "default" is the step time).
_METRICS = {
    "step-time": ("step_time_s", "minimize"),
    "iteration-time": ("step_time_s", "minimize"),
    "tflops-per-gpu": ("tflops_per_gpu", "maximize"),
}

_WORKLOADS = {"NeMoRun": "nemo", "MegatronBridge": "bridge"}
#: NeMoRun ``task`` values: CloudAI's run script calls llm.pretrain or llm.finetune
#: (cloudai_nemorun.py); dse's NeMo launcher runs ``nemo llm TASK``.
_NEMO_TASKS = ("pretrain", "finetune")
_TEMPLATES = {v: k for k, v in _WORKLOADS.items()}

#: Recipe names (CloudAI's / Bridge's) -> dse catalog entries where the names differ.
_CATALOG_ALIASES = {
    "llama31_405b": "llama3_405b",
    "llama3_1_405b": "llama3_405b",
    "nemotron_15b": "nemotron4_15b",
    "nemotron_340b": "nemotron4_340b",
    "nemotron_3_nano": "nemotron_3_nano_30b_a3b",
    "nemotron3_nano": "nemotron_3_nano_30b_a3b",
    "deepseekv3": "deepseek_v3",
    "qwen3_30b": "qwen3_30b_a3b",
}

#: Megatron-Bridge recipe families (``recipes/<family>/``, the perf launcher's
#: --model_family_name), by the recipe's first words, most specific first.
_FAMILIES = (
    ("nemotron_omni", "nemotron_omni"),
    ("nemotron_3_nano", "nemotronh"),
    ("nemotron_nano", "nemotronh"),
    ("nemotronh", "nemotronh"),
    ("nemotron", "nemotron"),
    ("llama", "llama"),
    ("qwen", "qwen"),
    ("deepseek", "deepseek"),
    ("gpt_oss", "gpt_oss"),
    ("kimi", "kimi"),
    ("mixtral", "mixtral"),
    ("gemma", "gemma"),
)

#: A Bridge recipe function name: <recipe>_<task>[_<N>gpu][_<gpu>][_<dtype>][_<variant>]_config
#: (a performance recipe writes its dtype without the underscore: fp8cs, fp8mx).
_RECIPE_RE = re.compile(
    r"^(?P<stem>.+?)_(?P<task>pretrain|sft|finetune|peft|lora)"
    r"(?:_(?P<gpus>\d+)gpu)?(?:_(?P<gpu>[hb]\d+|gb\d+|vr\d+))?"
    r"(?:_(?P<dtype>bf16|fp8_cs|fp8_mx|fp8_sc|fp8_ds|nvfp4|fp8cs|fp8mx|fp8sc|fp8))?"
    r"(?:_(?P<variant>[a-z0-9_]+?))?_config$"
)


@dataclass(frozen=True)
class Unmapped:
    """A CloudAI field dse has no equivalent for, and what the import did about it."""

    key: str
    value: Any
    why: str


@dataclass
class CloudAIImport:
    """The space a CloudAI scenario became, what could not be mapped, what was assumed."""

    space: dict[str, Any]
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_yaml(self, source: str) -> str:
        """The space file, headed by comments that list every unmapped field.

        The header's text comes from the scenario (a refused variable's name, a file name):
        each line is written by :func:`~dse.core.safeyaml.comment`, so no part of it can
        end the comment and become YAML.
        """
        head = [f"Imported by `dse cloudai import` from the CloudAI scenario {source}."]
        head += [f"note: {n}" for n in self.notes]
        if self.unmapped:
            head.append("Not mapped (no dse equivalent):")
            head += [f"  {u.key} = {u.value!r}: {u.why}" for u in self.unmapped]
        lines = [comment(h) for h in head]
        return "\n".join(lines) + "\n" + yaml.safe_dump(self.space, sort_keys=False)


@dataclass(frozen=True)
class CloudAISystem:
    """What dse takes from a CloudAI system TOML (``SlurmSystem`` fields)."""

    name: str
    scheduler: str
    gpus_per_node: int | None = None
    partition: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    container_mount_home: bool = False
    env: tuple[tuple[str, str], ...] = ()
    gpu_type: str | None = None


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:  # a CloudAI file is a few KiB, as a space file is
        raw = read_regular_file(path, MAX_SPACE_BYTES)
        return tomllib.loads(raw.decode("utf-8"))
    except OSError as e:
        raise SpaceError(f"{path}: cannot read the CloudAI file ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise SpaceError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except tomllib.TOMLDecodeError as e:
        raise SpaceError(f"{path}: not valid TOML: {e}") from e
    except ValueError as e:  # read_regular_file: a device, a FIFO, too large
        raise SpaceError(f"{path}: {e}; a CloudAI file is a TOML file") from None
