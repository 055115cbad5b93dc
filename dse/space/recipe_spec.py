"""Space-file sections for a user's own recipe: ``workload.launcher`` and ``env``.

``workload.launcher`` names the recipe a launcher workload (``bridge``, ``nemo``,
``megatron_lm``) runs, the container image and fixed overrides in the recipe's own syntax.
``env`` holds environment variables every rank of a trial gets (fixed values) and
pre-trial node steps; environment variables to *explore* are written under ``env.knobs``
and become knobs named ``env.VAR`` (:func:`dse.space.knobs.get_knob`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dse.core.registry import REGISTRY
from dse.space.knobs import check_env_var

__all__ = ["LAUNCHERS", "CloudAISource", "LauncherSpec", "EnvSpec", "NODE_STEPS"]

#: Workload names that launch a user's recipe (the registry's launchers).
LAUNCHERS: tuple[str, ...] = REGISTRY.names("launcher")

#: Pre-trial node steps: name -> the command it runs once per node before a trial
#: (CloudAI's ENABLE_VBOOST runs the same command under sudo).
NODE_STEPS: dict[str, list[str]] = {
    "vboost": ["nvidia-smi", "boost-slider", "--vboost", "1"],
}

OverrideValue = int | float | bool | str | list[int | float | bool | str] | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CloudAISource(_Strict):
    """Where a space imported from a CloudAI test took its recipe, kept as the test wrote it
    so that ``dse cloudai export`` writes it back unchanged (nothing of it reaches a trial)."""

    git_repos: list[dict[str, str | bool]] = Field(
        default_factory=list,
        description="The test's [[git_repos]] (url, commit, mount_as, init_submodules, ...).",
    )
    recipe_fields: dict[str, str] = Field(
        default_factory=dict,
        description="The test's cmd_args naming its recipe (NeMoRun recipe_name; "
        "MegatronBridge model_family_name, model_recipe_name).",
    )


class LauncherSpec(_Strict):
    """The recipe a launcher workload runs."""

    recipe: str | None = Field(
        None,
        description="bridge: recipe function (run_recipe.py --recipe); nemo: recipe factory "
        "(nemo llm pretrain --factory), e.g. 'llama3_8b'.",
    )
    config_file: str | None = Field(
        None,
        description="bridge: a YAML of ConfigContainer overrides, passed as --config-file to "
        "a Bridge script that takes one (examples/models/.../pretrain_*.py).",
    )
    script: str | None = Field(
        None,
        description="Entry script: bridge default /opt/Megatron-Bridge/scripts/training/"
        "run_recipe.py (the NeMo containers' Bridge checkout); megatron_lm "
        "default pretrain_gpt.py (path inside the container).",
    )
    module: str | None = Field(
        None, description="A Python module to run instead of a script (torchrun -m MODULE)."
    )
    args: list[str] = Field(
        default_factory=list,
        description="Base arguments after the script (megatron_lm: data, tokenizer, other "
        "flags of the recipe's command line).",
    )
    overrides: dict[str, OverrideValue] = Field(
        default_factory=dict,
        description="Fixed overrides in the recipe's own syntax: bridge/nemo dotted keys "
        "(model.seq_length), megatron_lm flags ('--use-mcore-models': true).",
    )
    container_image: str | None = Field(
        None, description="Container image the trial runs in (Slurm with pyxis/enroot)."
    )
    python: str | None = Field(None, description="Interpreter of the recipe (default: python).")
    task: Literal["pretrain", "finetune"] | None = Field(
        None,
        description="nemo: the NeMo CLI task the factory runs under (nemo llm TASK --factory "
        "RECIPE; CloudAI NeMoRun's task); default pretrain. bridge: the task is part of the "
        "recipe function's name.",
    )
    model_args: bool = Field(
        True,
        description="megatron_lm: render the model and semantics sections as Megatron-LM "
        "flags (--num-layers ..., --global-batch-size ...).",
    )
    log_format: Literal["auto", "megatron", "bridge", "nemo"] = Field(
        "auto", description="Format of the recipe's log (auto: the launcher's own)."
    )
    cloudai: CloudAISource | None = Field(
        None,
        description="What a CloudAI test named its recipe and repositories by, as written "
        "(set by dse cloudai import; written back by dse cloudai export).",
    )
    check_resolved: bool = Field(
        True,
        description="Read back the configuration the recipe resolved (Megatron-LM's argument "
        "table, the Bridge entry script's resolved.json) and fail the trial as invalid where "
        "a field dse set resolved to another value.",
    )

    @field_validator("recipe", "config_file", "script", "module", "container_image", "python")
    @classmethod
    def _no_controls(cls, v: str | None, info: ValidationInfo) -> str | None:
        # names and paths: a line break would end the comment that names the image in the
        # dry run's script (everything else of the command is quoted; docs/SECURITY.md)
        if v is not None and any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError(
                f"{info.field_name} must not contain control characters (newline, tab, NUL): {v!r}"
            )
        return v

    @model_validator(mode="after")
    def _one_entry(self) -> LauncherSpec:
        if self.script and self.module:
            raise ValueError(
                f"give either script or module, not both (script={self.script!r}, "
                f"module={self.module!r})"
            )
        return self


class EnvSpec(_Strict):
    """Environment of every rank of every trial, and pre-trial node steps."""

    fixed: dict[str, str | int | bool] = Field(
        default_factory=dict,
        description="Environment variables set on every rank (CUDA_DEVICE_MAX_CONNECTIONS, "
        "NCCL_*, NVTE_*, HybridEP variables).",
    )
    node_steps: list[Literal["vboost"]] = Field(
        default_factory=list,
        description="Steps run once per node before a trial: vboost = nvidia-smi "
        "boost-slider --vboost 1 (skipped with a note where not permitted).",
    )

    @field_validator("fixed")
    @classmethod
    def _known_vars(cls, v: dict[str, Any]) -> dict[str, Any]:
        for var in v:
            why = check_env_var(var)
            if why:
                raise ValueError(why)
        return v
