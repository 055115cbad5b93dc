"""The knob catalog: every execution knob dse can explore and the exact fields it sets.

A knob's value is turned into *field assignments* on Megatron-Core's config objects
(``TransformerConfig`` / ``ModelParallelConfig`` = section ``model``,
``DistributedDataParallelConfig`` = ``ddp``, ``OptimizerConfig`` = ``optimizer``, the
training loop = ``train``). Each recipe target's launcher plugin (``dse/workloads/launchers/``)
turns those assignments into its own Megatron-LM arguments, Megatron-Bridge
``ConfigContainer`` overrides or NeMo 2.0 (nemo_run) overrides, in the launch command and in
the ``dse best`` export alike; this module keeps no flag table of its own.
Sources: reference knob catalog (megatron-core transformer_config.py, model_parallel_config.py,
optimizer_config.py, distributed_data_parallel_config.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dse.core.bounds import MAX_KNOBS
from dse.core.envpolicy import env_var_problem
from dse.core.exceptions import UnknownKnobError

__all__ = [
    "KNOBS",
    "Knob",
    "Preference",
    "CLOUDAI_TEMPLATES",
    "FieldAssignment",
    "Section",
    "get_knob",
    "assignments",
    "FEATURES",
    "RECOMPUTE_MODULES",
    "ModulesKnob",
    "modules_list",
    "FIELD_SOURCES",
    "effective_params",
    "IGNORED",
    "ignored_knobs",
    "knob_value",
    "ENV_PREFIX",
    "ENV_VARS",
    "ENV_VAR_PREFIXES",
    "check_env_var",
    "requires_nothing",
    "trial_env",
    "env_value",
]

#: ``env`` assignments are environment variables of every rank, not config fields;
#: ``checkpoint`` is Megatron-Bridge's CheckpointConfig.
Section = Literal["model", "ddp", "optimizer", "train", "env", "checkpoint"]

#: Optional software features a knob value may need where the trial runs.
FEATURES = ("transformer_engine", "apex", "deepep", "hybridep", "flash_attn", "mamba_ssm")


@dataclass(frozen=True)
class FieldAssignment:
    """One Megatron-Core config field set by a knob value."""

    section: Section
    field: str
    value: Any


@dataclass(frozen=True)
class Preference:
    """What the knob-semantics prior (:mod:`dse.agents._prior`) assumes of a knob before
    anything is measured: which values tend to train faster and how memory moves with the
    value (reference knob catalog; Megatron-Core's performance guide).

    Attributes:
        order: the faster values: ``true`` / ``false`` (a switch on / off), ``larger`` /
            ``smaller`` (by log2 of the value), or a table value -> preference in [0, 1]
            (values not in it: 0.5).
        weight: rough effect of the knob on log throughput (its preference is scaled by it).
        memory: how peak memory per GPU orders with the value: ``larger`` (grows with it),
            ``smaller`` (shrinks as it grows), a table value -> rank (larger = more memory),
            or None (no first-order effect).
        scale: ``up``: peak memory grows at most in proportion to the value; ``down``: at
            most in proportion to 1/value; None: no bound.
    """

    order: Literal["true", "false", "larger", "smaller"] | Mapping[Any, float]
    weight: float
    memory: Literal["larger", "smaller"] | Mapping[Any, float] | None = None
    scale: Literal["up", "down"] | None = None


#: CloudAI's test templates whose ``cmd_args`` name knobs (:attr:`Knob.cloudai`).
CLOUDAI_TEMPLATES = ("NeMoRun", "MegatronBridge")


def requires_nothing(value: Any) -> tuple[str, ...]:
    """``Knob.requires`` of a knob no value of which needs optional software (the default:
    a rule that checks features may skip such a knob without asking it)."""
    return ()


@dataclass(frozen=True)
class Knob:
    """A catalog entry: every fact dse holds about one knob.

    Attributes:
        name: the knob's name in space files (the Megatron field name where it maps 1:1).
        kind: ``int``, ``bool`` or ``choice``.
        choices: the values the real stack accepts, for ``choice`` knobs.
        default: Megatron-Core's default (used for the baseline when a space does not say).
        fields: value -> field assignments (the launcher plugin of each recipe target turns
            them into that target's flags or overrides).
        requires: value -> features that value needs (e.g. ``transformer_engine``).
        description: what the knob does.
        moe_only: acts only on a MoE model (a dense model's space may not switch it on:
            rule ``moe_only`` of :mod:`dse.model.rules`).
        prefer: what the knob-semantics prior assumes of it (None: neutral).
        cloudai: CloudAI ``cmd_args`` name of the knob per test template
            (:data:`CLOUDAI_TEMPLATES`): what ``dse cloudai import`` reads and export writes.
        abbrev: its short name in progress lines (``trial 3 started: tp=2 mbs=4``).
    """

    name: str
    kind: Literal["int", "bool", "choice", "env", "text"]
    default: Any
    description: str
    fields: Callable[[Any], list[FieldAssignment]]
    choices: tuple[Any, ...] = ()
    requires: Callable[[Any], tuple[str, ...]] = requires_nothing
    min_value: int = 1
    moe_only: bool = False
    prefer: Preference | None = None
    cloudai: Mapping[str, str] = field(default_factory=dict)
    abbrev: str | None = None

    def check_value(self, value: Any) -> str | None:
        """Return why ``value`` is not a value of this knob, or None when it is."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else f"expected true/false, got {value!r}"
        if self.kind == "int":
            if value is None and self.default is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int):
                return f"expected an integer, got {value!r}"
            if value < self.min_value:
                return f"expected an integer >= {self.min_value}, got {value}"
            return None
        if self.kind == "text":
            if value is None and self.default is None:
                return None
            ok = isinstance(value, str) and 0 < len(value) <= 4096 and value.isprintable()
            return None if ok else f"expected a non-empty string, got {value!r}"
        if self.kind == "env":
            ok = isinstance(value, (str, int)) and not (isinstance(value, str) and not value)
            return None if ok else f"expected a string, integer or true/false, got {value!r}"
        if value not in self.choices:
            return f"expected one of {list(self.choices)}, got {value!r}"
        return None


def _one(section: Section, name: str) -> Callable[[Any], list[FieldAssignment]]:
    return lambda v: [FieldAssignment(section, name, v)]


def _recompute_fields(v: Any) -> list[FieldAssignment]:
    if v == "none":
        return [FieldAssignment("model", "recompute_granularity", None)]
    if v == "selective":
        # Megatron's default selective modules: ["core_attn"].
        return [
            FieldAssignment("model", "recompute_granularity", "selective"),
            FieldAssignment("model", "recompute_modules", ["core_attn"]),
        ]
    # full: uniform, one layer per checkpoint (Megatron-LM --recompute-num-layers 1)
    return [
        FieldAssignment("model", "recompute_granularity", "full"),
        FieldAssignment("model", "recompute_method", "uniform"),
        FieldAssignment("model", "recompute_num_layers", 1),
    ]


def _attention_fields(v: Any) -> list[FieldAssignment]:
    if v == "unfused":
        return [
            FieldAssignment("model", "transformer_impl", "local"),
            FieldAssignment("model", "attention_backend", "unfused"),
        ]
    if v == "sdpa":
        # dse's built-in trainer swaps the local spec's core attention for
        # torch.nn.functional.scaled_dot_product_attention. Megatron-LM/Bridge have no such
        # value; their nearest equivalent is the TE flash backend (their launchers refuse
        # sdpa saying so).
        return [
            FieldAssignment("model", "transformer_impl", "local"),
            FieldAssignment("model", "attention_backend", "flash"),
        ]
    if v == "te":
        return [
            FieldAssignment("model", "transformer_impl", "transformer_engine"),
            FieldAssignment("model", "attention_backend", "auto"),
        ]
    return [
        FieldAssignment("model", "transformer_impl", "transformer_engine"),
        FieldAssignment("model", "attention_backend", v),
    ]


def _te_if(*values: Any) -> Callable[[Any], tuple[str, ...]]:
    return lambda v: ("transformer_engine",) if v in values else ()


def _knobs() -> dict[str, Knob]:
    ks = [
        Knob(
            "tensor_model_parallel_size",
            "int",
            1,
            "Tensor parallel size (TP).",
            _one("model", "tensor_model_parallel_size"),
            prefer=Preference("smaller", 0.3, memory="smaller", scale="down"),
            cloudai={
                "NeMoRun": "trainer.strategy.tensor_model_parallel_size",
                "MegatronBridge": "tp",
            },
            abbrev="tp",
        ),
        Knob(
            "pipeline_model_parallel_size",
            "int",
            1,
            "Pipeline parallel size (PP).",
            _one("model", "pipeline_model_parallel_size"),
            prefer=Preference("smaller", 0.2, memory="smaller", scale="down"),
            cloudai={
                "NeMoRun": "trainer.strategy.pipeline_model_parallel_size",
                "MegatronBridge": "pp",
            },
            abbrev="pp",
        ),
        Knob(
            "virtual_pipeline_model_parallel_size",
            "int",
            None,
            "Virtual pipeline stages per PP rank (VPP, interleaved 1F1B); needs PP>1.",
            _one("model", "virtual_pipeline_model_parallel_size"),
            cloudai={
                "NeMoRun": "trainer.strategy.virtual_pipeline_model_parallel_size",
                "MegatronBridge": "vp",
            },
        ),
        Knob(
            "context_parallel_size",
            "int",
            1,
            "Context parallel size (CP).",
            _one("model", "context_parallel_size"),
            prefer=Preference("smaller", 0.2, memory="smaller", scale="down"),
            cloudai={"NeMoRun": "trainer.strategy.context_parallel_size", "MegatronBridge": "cp"},
            abbrev="cp",
        ),
        Knob(
            "expert_model_parallel_size",
            "int",
            1,
            "Expert parallel size (EP), MoE only.",
            _one("model", "expert_model_parallel_size"),
            moe_only=True,
            prefer=Preference({}, 0.0, memory="smaller", scale="down"),
            cloudai={
                "NeMoRun": "trainer.strategy.expert_model_parallel_size",
                "MegatronBridge": "ep",
            },
        ),
        Knob(
            "expert_tensor_parallel_size",
            "int",
            None,
            "Tensor parallel size inside experts (ETP); Megatron default: TP.",
            _one("model", "expert_tensor_parallel_size"),
            moe_only=True,
            cloudai={
                "NeMoRun": "trainer.strategy.expert_tensor_parallel_size",
                "MegatronBridge": "et",
            },
        ),
        Knob(
            "sequence_parallel",
            "bool",
            False,
            "Sequence parallelism over the TP group; needs TP>1 and a TE or apex norm.",
            _one("model", "sequence_parallel"),
            requires=lambda v: ("transformer_engine",) if v else (),
            prefer=Preference("true", 0.03, memory={True: 0.0, False: 1.0}),
            cloudai={"NeMoRun": "trainer.strategy.sequence_parallel"},
        ),
        Knob(
            "micro_batch_size",
            "int",
            1,
            "Micro-batch size (MBS).",
            _one("train", "micro_batch_size"),
            prefer=Preference("larger", 0.05, memory="larger", scale="up"),
            cloudai={"NeMoRun": "data.micro_batch_size", "MegatronBridge": "mb"},
            abbrev="mbs",
        ),
        Knob(
            "recompute",
            "choice",
            "none",
            "Activation recompute: none; selective (recompute_granularity=selective, "
            "recompute_modules=[core_attn]); full (granularity=full, method=uniform, "
            "num_layers=1).",
            _recompute_fields,
            choices=("none", "selective", "full"),
            prefer=Preference(
                {"none": 1.0, "selective": 0.75, "full": 0.0},
                0.3,
                memory={"none": 2.0, "selective": 1.0, "full": 0.0},
            ),
        ),
        Knob(
            "attention_backend",
            "choice",
            "unfused",
            "Core attention: unfused (Megatron-Core local spec DotProductAttention), sdpa "
            "(torch scaled_dot_product_attention in the local spec, dse trainer), te/flash/"
            "fused (Transformer Engine DotProductAttention).",
            _attention_fields,
            choices=("unfused", "sdpa", "te", "flash", "fused"),
            requires=_te_if("te", "flash", "fused"),
            prefer=Preference(
                {"unfused": 0.0, "sdpa": 0.8, "te": 1.0, "flash": 1.0, "fused": 1.0},
                0.8,
                memory={"unfused": 1.0, "sdpa": 0.0, "te": 0.0, "flash": 0.0, "fused": 0.0},
            ),
            abbrev="attn",
        ),
        Knob(
            "bias_activation_fusion",
            "bool",
            False,
            "Fuse bias + activation (gelu/silu/swiglu only).",
            _one("model", "bias_activation_fusion"),
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "bias_dropout_fusion",
            "bool",
            False,
            "Fuse bias + dropout + add.",
            _one("model", "bias_dropout_fusion"),
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "masked_softmax_fusion",
            "bool",
            False,
            "Fused scaled masked softmax (local attention; needs the Megatron CUDA extension).",
            _one("model", "masked_softmax_fusion"),
            requires=lambda v: ("apex",) if v else (),
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "apply_rope_fusion",
            "bool",
            False,
            "Fused RoPE kernel (Transformer Engine >= 1.4).",
            _one("model", "apply_rope_fusion"),
            requires=_te_if(True),
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "cross_entropy_loss_fusion",
            "bool",
            False,
            "Fused vocab-parallel cross entropy.",
            _one("model", "cross_entropy_loss_fusion"),
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "cross_entropy_fusion_impl",
            "choice",
            "native",
            "Implementation of the fused cross entropy (te needs Transformer Engine).",
            _one("model", "cross_entropy_fusion_impl"),
            choices=("native", "te"),
            requires=_te_if("te"),
        ),
        Knob(
            "gradient_accumulation_fusion",
            "bool",
            False,
            "Fuse weight-gradient accumulation into main_grad (needs apex or TE linears).",
            _one("model", "gradient_accumulation_fusion"),
            requires=lambda v: ("apex",) if v else (),
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "moe_token_dispatcher_type",
            "choice",
            "allgather",
            "MoE token dispatcher.",
            _one("model", "moe_token_dispatcher_type"),
            choices=("allgather", "alltoall", "flex"),
            moe_only=True,
            prefer=Preference({"allgather": 0.0, "alltoall": 1.0, "flex": 1.0}, 0.05),
        ),
        Knob(
            "moe_flex_dispatcher_backend",
            "choice",
            "deepep",
            "Backend of the flex dispatcher.",
            _one("model", "moe_flex_dispatcher_backend"),
            choices=("deepep", "hybridep"),
            requires=lambda v: ("deepep",) if v == "deepep" else ("hybridep",),
            moe_only=True,
        ),
        Knob(
            "moe_grouped_gemm",
            "bool",
            False,
            "Grouped GEMM for the experts.",
            _one("model", "moe_grouped_gemm"),
            moe_only=True,
            prefer=Preference("true", 0.05),
        ),
        Knob(
            "moe_permute_fusion",
            "bool",
            False,
            "Fused token permutation (TE >= 2.1).",
            _one("model", "moe_permute_fusion"),
            requires=_te_if(True),
            moe_only=True,
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "moe_router_fusion",
            "bool",
            False,
            "Fused router top-k (TE >= 2.6).",
            _one("model", "moe_router_fusion"),
            requires=_te_if(True),
            moe_only=True,
            prefer=Preference("true", 0.02),
        ),
        Knob(
            "use_mamba_mem_eff_path",
            "bool",
            True,
            "Mamba layers' memory-efficient path (MambaMixer: conv1d, SSD scan and gate in "
            "mamba_split_conv1d_scan_combined, the conv recomputed in backward); False: conv1d "
            "then mamba_chunk_scan_combined. Hybrid models only (Megatron-LM: "
            "--disable-mamba-mem-eff-path).",
            _one("model", "use_mamba_mem_eff_path"),
        ),
        Knob(
            "moe_shared_expert_overlap",
            "bool",
            False,
            "Overlap shared-expert compute with dispatch (alltoall/flex only).",
            _one("model", "moe_shared_expert_overlap"),
            moe_only=True,
            prefer=Preference("true", 0.03),
        ),
        Knob(
            "use_distributed_optimizer",
            "bool",
            False,
            "Shard optimizer state over data-parallel ranks.",
            lambda v: [
                FieldAssignment("ddp", "use_distributed_optimizer", v),
                FieldAssignment("optimizer", "use_distributed_optimizer", v),
            ],
            prefer=Preference("true", 0.01, memory={True: 0.0, False: 1.0}),
            cloudai={"NeMoRun": "optim.config.use_distributed_optimizer"},
            abbrev="distopt",
        ),
        Knob(
            "overlap_grad_reduce",
            "bool",
            False,
            "Overlap gradient reduce with backward.",
            _one("ddp", "overlap_grad_reduce"),
            prefer=Preference("true", 0.03),
        ),
        Knob(
            "overlap_param_gather",
            "bool",
            False,
            "Overlap parameter all-gather with forward (distributed optimizer only).",
            _one("ddp", "overlap_param_gather"),
            prefer=Preference("true", 0.03),
        ),
        Knob(
            "grad_reduce_in_fp32",
            "bool",
            True,
            "fp32 gradient buffer and reduction (Megatron-LM's bf16 default, "
            "--accumulate-allreduce-grads-in-fp32; Bridge bf16_mixed).",
            _one("ddp", "grad_reduce_in_fp32"),
            prefer=Preference("false", 0.02, memory={True: 1.0, False: 0.0}),
            cloudai={"NeMoRun": "trainer.plugins.grad_reduce_in_fp32"},
        ),
        Knob(
            "use_precision_aware_optimizer",
            "bool",
            False,
            "Precision-aware optimizer (TE FusedAdam with per-state dtypes).",
            _one("optimizer", "use_precision_aware_optimizer"),
            requires=_te_if(True),
            cloudai={"NeMoRun": "optim.config.use_precision_aware_optimizer"},
        ),
        Knob(
            "main_grads_dtype",
            "choice",
            "fp32",
            "dtype of the main gradients.",
            _one("optimizer", "main_grads_dtype"),
            choices=("fp32", "bf16"),
        ),
        Knob(
            "main_params_dtype",
            "choice",
            "fp32",
            "dtype of the master weights.",
            _one("optimizer", "main_params_dtype"),
            choices=("fp32", "fp16"),
        ),
        Knob(
            "exp_avg_dtype",
            "choice",
            "fp32",
            "dtype of Adam's first moment.",
            _one("optimizer", "exp_avg_dtype"),
            choices=("fp32", "fp16", "bf16", "fp8"),
        ),
        Knob(
            "exp_avg_sq_dtype",
            "choice",
            "fp32",
            "dtype of Adam's second moment.",
            _one("optimizer", "exp_avg_sq_dtype"),
            choices=("fp32", "fp16", "bf16", "fp8"),
        ),
        Knob(
            "tp_comm_overlap",
            "bool",
            False,
            "Overlap TP communication with GEMMs (TE userbuffers; needs SP).",
            _one("model", "tp_comm_overlap"),
            requires=_te_if(True),
            prefer=Preference("true", 0.03),
        ),
    ]
    ks += _hybrid_moe_knobs()
    ks += _pipeline_split_knobs()
    return {k.name: k for k in ks}


def _split_cloudai(name: str) -> dict[str, str]:
    """A pipeline split field in CloudAI's tests: NeMoRun's dotted MegatronStrategy path; a
    MegatronBridge test's field of the same name."""
    return {"NeMoRun": f"trainer.strategy.{name}", "MegatronBridge": name}


def _pipeline_split_knobs() -> list[Knob]:
    """The TransformerConfig fields that move layers between pipeline stages
    (:data:`dse.space.layout.PIPELINE_SPLIT_KNOBS`; their rules: ``pipeline_split`` of
    :mod:`dse.model.rules`, the placement: :func:`dse.space.layout.pipeline_chunks`)."""
    return [
        Knob(
            "num_layers_in_first_pipeline_stage",
            "int",
            None,
            "Decoder layers on the first pipeline stage (uneven pipeline; None: the even "
            "split). Not with account_for_* or a layout.",
            _one("model", "num_layers_in_first_pipeline_stage"),
            cloudai=_split_cloudai("num_layers_in_first_pipeline_stage"),
        ),
        Knob(
            "num_layers_in_last_pipeline_stage",
            "int",
            None,
            "Decoder layers on the last pipeline stage (uneven pipeline; None: the even "
            "split). Not with account_for_* or a layout.",
            _one("model", "num_layers_in_last_pipeline_stage"),
            cloudai=_split_cloudai("num_layers_in_last_pipeline_stage"),
        ),
        Knob(
            "account_for_embedding_in_pipeline_split",
            "bool",
            False,
            "Count the embedding as one layer when splitting the layers over pipeline stages.",
            _one("model", "account_for_embedding_in_pipeline_split"),
            cloudai=_split_cloudai("account_for_embedding_in_pipeline_split"),
        ),
        Knob(
            "account_for_loss_in_pipeline_split",
            "bool",
            False,
            "Count the loss (output layer) as one layer when splitting the layers over "
            "pipeline stages.",
            _one("model", "account_for_loss_in_pipeline_split"),
            cloudai=_split_cloudai("account_for_loss_in_pipeline_split"),
        ),
        Knob(
            "pipeline_model_parallel_layout",
            "text",
            None,
            "Megatron-Core's pipeline layout string: one virtual stage per '|' (rank i % PP, "
            "chunk i // PP), E embedding, t decoder layer, L loss, (..)*n / x*n repeats, e.g. "
            "'Etttt|(tttt|)*14tL'; sets VPP when VPP is unset.",
            _one("model", "pipeline_model_parallel_layout"),
            cloudai=_split_cloudai("pipeline_model_parallel_layout"),
        ),
    ]


# --- knobs of the tuned hybrid/MoE recipes (Nemotron 3 Nano Omni) --------------------------

#: ``recompute_modules`` choices (TransformerConfig.recompute_modules, selective recompute),
#: in Megatron-Core's order; ``mla_up_proj`` needs Multi-Latent Attention
#: (``model.multi_latent_attention``); ``gdn_norm_out`` needs a model kind dse does not
#: describe (gated delta net).
RECOMPUTE_MODULES = (
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"
)  # fmt: skip


@dataclass(frozen=True)
class ModulesKnob(Knob):
    """A list-valued knob written as a comma-separated string (``"moe,layernorm"``), so a
    domain stays a list of scalars; the field receives the list."""

    def check_value(self, value: Any) -> str | None:
        if value is None and self.default is None:
            return None
        if not isinstance(value, str) or not value:
            return f"expected a comma-separated list of {list(self.choices)}, got {value!r}"
        parts = [p.strip() for p in value.split(",")]
        bad = [p for p in parts if p not in self.choices]
        if bad:
            return f"unknown modules {bad}; known: {list(self.choices)}"
        if len(set(parts)) != len(parts):
            return f"a module is repeated in {value!r}"
        return None


def modules_list(value: Any) -> list[str]:
    """The list a :class:`ModulesKnob` value stands for (``[]`` for None)."""
    return [] if value is None else [p.strip() for p in str(value).split(",")]


#: Where each of these knobs' fields is defined, for the fields that Megatron-Core 0.16.1
#: (the version the built-in trainer runs) lacks: the trainer refuses them by this table.
FIELD_SOURCES: Mapping[str, str] = {
    "moe_flex_dispatcher_num_sms": "Megatron-Core after 0.16 (replaces moe_deepep_num_sms / "
    "moe_hybridep_num_sms; Megatron-Bridge main sets it)",
    "moe_hybridep_pad_uneven_dispatch_inputs": "Megatron-Core after 0.16 (Megatron-Bridge "
    "models/transformer_config.py turns it on for eager HybridEP)",
    "fused_residual_rmsnorm": "Megatron-Core 0.19 (TransformerConfig)",
    "use_grouped_gemm_for_shared_expert": "Megatron-Core 0.19 (TransformerConfig)",
    "optimizer_cuda_graph": "Megatron-Core after 0.16 (OptimizerConfig; Megatron-Bridge "
    "training/train.py reads it)",
    "stage_precision_aware_optimizer_state_on_cpu": "Megatron-Bridge CheckpointConfig "
    "(PR #5524, the tuned Nemotron Omni recipe)",
}


def _hybrid_moe_knobs() -> list[Knob]:
    return [
        ModulesKnob(
            "recompute_modules",
            "choice",
            None,
            "Modules recomputed by selective recompute (with recompute: selective; None: "
            "Megatron's default [core_attn]), written 'moe,layernorm'.",
            lambda v: [FieldAssignment("model", "recompute_modules", modules_list(v))],
            choices=RECOMPUTE_MODULES,
        ),
        Knob(
            "moe_flex_dispatcher_num_sms",
            "int",
            None,
            "SMs the flex dispatcher's communication kernels use (DeepEP/HybridEP); None: "
            "the backend's default.",
            _one("model", "moe_flex_dispatcher_num_sms"),
            moe_only=True,
        ),
        Knob(
            "moe_hybridep_pad_uneven_dispatch_inputs",
            "bool",
            False,
            "HybridEP: pad uneven dispatch inputs (Bridge turns it on for eager HybridEP).",
            _one("model", "moe_hybridep_pad_uneven_dispatch_inputs"),
            moe_only=True,
        ),
        Knob(
            "use_fused_weighted_squared_relu",
            "bool",
            False,
            "Fused weighted squared-ReLU in the MoE experts (squared_relu, no GLU, no bias).",
            _one("model", "use_fused_weighted_squared_relu"),
            moe_only=True,
        ),
        Knob(
            "store_param_remainders",
            "bool",
            True,
            "Precision-aware optimizer with bf16 params: keep fp32 master weights as 16-bit "
            "remainders of the bf16 params (TE >= 2.1).",
            _one("optimizer", "store_param_remainders"),
        ),
        Knob(
            "stage_precision_aware_optimizer_state_on_cpu",
            "bool",
            False,
            "Stage the precision-aware optimizer's state on the CPU when saving a checkpoint "
            "(Megatron-Bridge checkpoint section; torch_dist format).",
            _one("checkpoint", "stage_precision_aware_optimizer_state_on_cpu"),
        ),
        Knob(
            "overlap_param_gather_with_optimizer_step",
            "bool",
            False,
            "Overlap the first model chunk's parameter all-gather with the optimizer step.",
            _one("optimizer", "overlap_param_gather_with_optimizer_step"),
        ),
        Knob(
            "data_parallel_sharding_strategy",
            "choice",
            "no_shard",
            "Megatron FSDP sharding (read only with use_megatron_fsdp).",
            _one("ddp", "data_parallel_sharding_strategy"),
            choices=("no_shard", "optim", "optim_grads", "optim_grads_params"),
        ),
        Knob(
            "use_megatron_fsdp",
            "bool",
            False,
            "Megatron FSDP: the model is wrapped in Megatron-Core's fully sharded data "
            "parallel, which shards by data_parallel_sharding_strategy and always trains with "
            "the distributed optimizer (DistributedDataParallelConfig.use_megatron_fsdp; "
            "Megatron-LM --use-megatron-fsdp, Bridge ddp.use_megatron_fsdp). The cost and "
            "memory models estimate it as the distributed optimizer.",
            _one("ddp", "use_megatron_fsdp"),
            cloudai={"MegatronBridge": "use_megatron_fsdp"},
        ),
        Knob(
            "cuda_graph_impl",
            "choice",
            "none",
            "CUDA graphs: none, local (Megatron-Core's), transformer_engine.",
            _one("model", "cuda_graph_impl"),
            choices=("none", "local", "transformer_engine"),
            requires=_te_if("transformer_engine"),
            cloudai={"MegatronBridge": "cuda_graph_impl"},
        ),
        ModulesKnob(
            "cuda_graph_scope",
            "choice",
            None,
            "Parts captured by CUDA graphs, written 'attn,moe_router' (None: whole layers).",
            lambda v: [FieldAssignment("model", "cuda_graph_scope", modules_list(v) or "full")],
            choices=("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"),
        ),
        Knob(
            "fp8",
            "choice",
            None,
            "FP8 GEMMs (Transformer Engine): e4m3, or hybrid (e4m3 forward, e5m2 backward).",
            _one("model", "fp8"),
            choices=(None, "e4m3", "hybrid"),
            requires=lambda v: ("transformer_engine",) if v else (),
            cloudai={"NeMoRun": "trainer.plugins.fp8"},
        ),
        Knob(
            "fp8_recipe",
            "choice",
            "delayed",
            "FP8 scaling recipe (read only with fp8).",
            _one("model", "fp8_recipe"),
            choices=("tensorwise", "delayed", "mxfp8", "blockwise"),
            cloudai={"NeMoRun": "trainer.plugins.fp8_recipe"},
        ),
        Knob(
            "fp8_param",
            "bool",
            False,
            "Keep the parameters in FP8 (needs fp8).",
            _one("model", "fp8_param"),
            cloudai={"NeMoRun": "trainer.plugins.fp8_params"},
        ),
        Knob(
            "overlap_moe_expert_parallel_comm",
            "bool",
            False,
            "Overlap the MoE all-to-all with computation of another micro-batch.",
            _one("model", "overlap_moe_expert_parallel_comm"),
            moe_only=True,
            cloudai={"MegatronBridge": "moe_a2a_overlap"},
        ),
        Knob(
            "fused_residual_rmsnorm",
            "bool",
            False,
            "Fuse the residual add into the next RMSNorm (TE norm).",
            _one("model", "fused_residual_rmsnorm"),
            requires=_te_if(True),
        ),
        Knob(
            "fused_single_qkv_rope",
            "bool",
            False,
            "One fused kernel for the QKV split and RoPE (needs RoPE).",
            _one("model", "fused_single_qkv_rope"),
            requires=_te_if(True),
        ),
        Knob(
            "use_grouped_gemm_for_shared_expert",
            "bool",
            False,
            "Run the shared expert in the routed experts' grouped GEMM (SwiGLU, no bias, TE).",
            _one("model", "use_grouped_gemm_for_shared_expert"),
            requires=_te_if(True),
            moe_only=True,
        ),
        Knob(
            "optimizer_cuda_graph",
            "bool",
            False,
            "Capture the optimizer step in a CUDA graph (capturable TE FusedAdam).",
            _one("optimizer", "optimizer_cuda_graph"),
            requires=_te_if(True),
        ),
    ]


#: name -> Knob, every knob dse knows.
KNOBS: Mapping[str, Knob] = _knobs()


# --- environment knobs ---------------------------------------------------------------------

#: Knob names ``env.VAR`` set the environment variable VAR on every rank of a trial.
ENV_PREFIX = "env."

#: Environment variables a space may set or explore, with what they do. Sources: CUDA
#: (CUDA_DEVICE_MAX_CONNECTIONS), PyTorch (PYTORCH_CUDA_ALLOC_CONF), DeepEP's hybrid-ep
#: branch as the Megatron-Bridge Nemotron Omni recipe sets them (reference knob catalog).
ENV_VARS: Mapping[str, str] = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "Hardware work queues per device (Megatron-LM's TP/SP "
    "overlap wants 1; MoE/HybridEP recipes use 32).",
    "PYTORCH_CUDA_ALLOC_CONF": "PyTorch caching-allocator settings "
    "(e.g. expandable_segments:True).",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "HybridEP: expert-parallel ranks per NVLink "
    "domain.",
    "NVLINK_DOMAIN_SIZE": "HybridEP: GPUs per NVLink domain.",
    "USE_MNNVL": "HybridEP: multi-node NVLink (0/1).",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": "HybridEP: tokens per chunk of the combine kernel.",
}

#: Families of environment variables a space may set or explore (NCCL, Transformer Engine,
#: PyTorch's NCCL process group).
ENV_VAR_PREFIXES: tuple[str, ...] = ("NCCL_", "NVTE_", "TORCH_NCCL_")


def check_env_var(var: str) -> str | None:
    """Why ``var`` is not an environment variable a space may set, or None when it may (the
    one environment policy, :func:`dse.core.envpolicy.env_var_problem`: loader and interpreter
    paths, code NCCL or CUDA loads, what dse, torchrun or Slurm set are refused; the rest of
    a recipe's environment is kept). :data:`ENV_VARS` and :data:`ENV_VAR_PREFIXES` document
    the variables dse knows, they do not limit the others."""
    return env_var_problem(var)


@functools.lru_cache(maxsize=4 * MAX_KNOBS)
def _env_knob(name: str) -> Knob:
    """The knob ``env.VAR``, made and checked against the environment policy once per name
    (the space check asks for every knob of each of up to MAX_SPACE_COMBINATIONS sampled
    configurations: the policy does not depend on the sample). A refused name raises each
    time it is asked for (an exception is not cached)."""
    var = name[len(ENV_PREFIX) :]
    why = check_env_var(var)
    if why:
        raise UnknownKnobError(f"unknown knob {name!r}: {why}")
    return Knob(
        name,
        "env",
        None,
        ENV_VARS.get(var, f"Environment variable {var} of every rank."),
        lambda v: [FieldAssignment("env", var, env_value(v))],
    )


def env_value(value: Any) -> str:
    """An environment variable's text for a knob value (true/false as 1/0)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def trial_env(params: Mapping[str, Any], fixed: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The environment of a trial's ranks: the space's fixed ``env`` values, then the
    ``env.*`` knobs of ``params``."""
    out = {k: env_value(v) for k, v in (fixed or {}).items()}
    for name, value in params.items():
        if name.startswith(ENV_PREFIX):
            for a in _env_knob(name).fields(value):
                out[a.field] = a.value
    return out


def get_knob(name: str) -> Knob:
    """The catalog entry of ``name``; raises :class:`UnknownKnobError` naming the known ones.

    ``env.VAR`` names an environment knob (:data:`ENV_VARS`, :data:`ENV_VAR_PREFIXES`).
    """
    if name.startswith(ENV_PREFIX):
        return _env_knob(name)
    try:
        return KNOBS[name]
    except KeyError:
        import difflib

        near = difflib.get_close_matches(name, KNOBS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise UnknownKnobError(f"unknown knob {name!r}{hint}; known knobs: {sorted(KNOBS)}")


def knob_value(params: Mapping[str, Any], name: str) -> Any:
    """The value of knob ``name`` in ``params``; its catalog default when absent or None
    (the one default policy of :class:`dse.space.layout.Layout` and the cost model)."""
    value = params.get(name)
    return KNOBS[name].default if value is None else value


def assignments(params: Mapping[str, Any]) -> list[FieldAssignment]:
    """All Megatron-Core field assignments a configuration makes, in knob order."""
    out: list[FieldAssignment] = []
    for name, value in effective_params(params).items():
        for a in get_knob(name).fields(value):
            same = [i for i, b in enumerate(out) if (b.section, b.field) == (a.section, a.field)]
            if same and name in _REFINES:
                out[same[0]] = a
            else:
                out.append(a)
    return out


#: Knobs that refine a field another knob sets (applied after it, replacing its value).
_REFINES = ("recompute_modules",)


def effective_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` in the order their fields are assigned: refining knobs last, knobs
    Megatron does not read under the others' values left out (:func:`ignored_knobs`), and
    ``recompute_modules`` left out where it is None (Megatron's default)."""
    drop = ignored_knobs(params)
    out = {k: v for k, v in params.items() if k not in _REFINES and k not in drop}
    mods = params.get("recompute_modules")
    if mods is not None and "recompute_modules" not in drop:
        out["recompute_modules"] = mods
    return out


def _set_to(name: str, *values: Any) -> Callable[[Mapping[str, Any]], bool]:
    """``ignored(params)``: ``name`` is set in ``params`` to a value outside ``values``."""
    return lambda p: name in p and p[name] not in values


def _not_on(name: str) -> Callable[[Mapping[str, Any]], bool]:
    """``ignored(params)``: ``name`` is set in ``params`` and off (false / None / "none")."""
    return lambda p: name in p and p[name] in (False, None, "none")


def _hybridep_ignored(p: Mapping[str, Any]) -> bool:
    return _set_to("moe_token_dispatcher_type", "flex")(p) or _set_to(
        "moe_flex_dispatcher_backend", "hybridep"
    )(p)


#: knob -> ``ignored(params)``: whether Megatron-Core never reads the knob's field under the
#: other values of ``params`` (a configuration's knob and fixed values). Each is decided
#: only by a value the configuration itself sets: where the deciding knob is absent the
#: recipe's own value decides, which dse does not know, and the knob is kept. The one table
#: of these facts: the launch command, every export, the stored best, the dashboard and the
#: report leave such a knob out (:meth:`dse.space.searchspace.SearchSpace.inactive_knobs`),
#: and the canonical form puts it at its baseline (:data:`dse.space.derive.INERT`).
#: Sources: Megatron-Core 0.16 ``TransformerConfig`` (``recompute_modules`` read under
#: ``recompute_granularity == "selective"``; the flex dispatcher's fields by
#: ``MoEFlexTokenDispatcher`` only; ``cross_entropy_fusion_impl`` by the fused loss only;
#: ``fp8_recipe`` inside ``if self.fp8``; ``cuda_graph_scope`` by the CUDA-graph code
#: only), ``DistributedDataParallelConfig.data_parallel_sharding_strategy`` (read by
#: Megatron FSDP only).
IGNORED: Mapping[str, Callable[[Mapping[str, Any]], bool]] = {
    "recompute_modules": _set_to("recompute", "selective"),
    "moe_flex_dispatcher_backend": _set_to("moe_token_dispatcher_type", "flex"),
    "moe_flex_dispatcher_num_sms": _set_to("moe_token_dispatcher_type", "flex"),
    "moe_hybridep_pad_uneven_dispatch_inputs": _hybridep_ignored,
    "cross_entropy_fusion_impl": _not_on("cross_entropy_loss_fusion"),
    "fp8_recipe": _not_on("fp8"),
    "cuda_graph_scope": _not_on("cuda_graph_impl"),
    "data_parallel_sharding_strategy": _not_on("use_megatron_fsdp"),
}


def ignored_knobs(params: Mapping[str, Any]) -> set[str]:
    """The knobs of ``params`` whose value Megatron-Core does not read under the others'
    values (:data:`IGNORED`)."""
    return {name for name, fn in IGNORED.items() if name in params and fn(params)}
