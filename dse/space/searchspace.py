"""Space files, version 1: YAML -> pydantic (``extra="forbid"``: a typo is an error).

A space file names the recipe's model, the training semantics that must not change
(data, sequence length, global batch size, steps, precision), the resources of a trial,
the knobs to explore with their domains and conditions, extra constraints, the objective,
the budget, the agent, the runner, the workload and the storage URL.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from dse.core import bounds as B
from dse.core.envpolicy import check_env
from dse.core.exceptions import ConstraintEvalError, SpaceError
from dse.core.expr import ConstraintError, check_expr, eval_expr, joint_values
from dse.core.names import study_name_problem
from dse.core.records import AgentName, Direction, Metric, RunnerName, WorkloadName
from dse.core.safeyaml import safe_load
from dse.space.catalog import expand_model
from dse.space.derive import DERIVATIONS, INERT, canonical, derive, ignored
from dse.space.knobs import ENV_PREFIX, FEATURES, get_knob
from dse.space.layout import Layout
from dse.space.recipe_spec import LAUNCHERS, EnvSpec, LauncherSpec
from dse.stats.measure import PRUNABLE_METRICS, MeasurementSpec

__all__ = [
    "ModelSpec",
    "DataSpec",
    "MoeRouting",
    "LoraSpec",
    "LORA_TARGETS",
    "Semantics",
    "HYBRID_SYMBOLS",
    "moe_layer_pattern",
    "count_layer_kinds",
    "mla_linear_shapes",
    "MODEL_FAMILY_FIELDS",
    "family_value",
    "Resources",
    "ChoiceDomain",
    "IntDomain",
    "BoolDomain",
    "KnobSpec",
    "Objective",
    "Budget",
    "LossParity",
    "AgentSpec",
    "RunnerSpec",
    "LocalOptions",
    "RayOptions",
    "SlurmOptions",
    "RUNNER_OPTIONS",
    "WorkloadSpec",
    "SearchSpace",
    "load_space",
    "parse_space",
    "parse_space_text",
    "params_key",
    "constraint_where",
]


class _Strict(BaseModel):
    # no inf/nan: a timeout, a memory size or a learning rate is a finite number
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: ModelSpec fields added after studies were first stored (left out of the digest while
#: they hold their default, so earlier studies keep their hash).
_LATER_MODEL_FIELDS = (
    "hidden_dropout",
    "attention_dropout",
    "hybrid_layer_pattern",
    "mamba_num_heads",
    "mamba_head_dim",
    "mamba_state_dim",
    "mamba_num_groups",
    "mamba_chunk_size",
    "frozen_params",
    "moe_layer_freq",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "qk_layernorm",
)

#: Layer symbols of ``hybrid_layer_pattern`` (megatron/core/ssm/mamba_hybrid_layer_allocation.py
#: ``Symbols``): Mamba mixer, self-attention, dense MLP, MoE.
HYBRID_SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def moe_layer_pattern(
    num_layers: int, moe_layer_freq: int | list[int], num_moe_experts: int | None
) -> list[int]:
    """Megatron-Core's per-layer MoE pattern (1 MoE, 0 dense MLP) of a GPT model
    (megatron/core/models/gpt/gpt_layer_specs.py ``get_gpt_decoder_layer_specs``): an int N
    makes layer i MoE when ``i % N == 0``; a list is the pattern itself. Without routed
    experts every layer is dense. The one place dse reads ``moe_layer_freq``."""
    if not num_moe_experts:
        return [0] * num_layers
    if isinstance(moe_layer_freq, int):
        return [1 if i % moe_layer_freq == 0 else 0 for i in range(num_layers)]
    return [int(x) for x in moe_layer_freq]


def mla_linear_shapes(
    hidden_size: int,
    num_attention_heads: int,
    q_lora_rank: int | None,
    kv_lora_rank: int,
    qk_head_dim: int,
    qk_pos_emb_head_dim: int,
    v_head_dim: int,
) -> dict[str, tuple[int, int, bool]]:
    """The linear layers of one Multi-Latent Attention block as Megatron-Core builds them
    (megatron/core/transformer/multi_latent_attention.py ``MLASelfAttention``): name ->
    (input width, output width, split over tensor parallelism). The down projections of the
    Transformer-Engine spec are duplicated on every TP rank (``parallel_mode='duplicated'``);
    the up projections and the output projection are split by heads. Without ``q_lora_rank``
    the query has one projection, ``linear_q_proj``. The one place dse reads MLA's shapes."""
    q_head = qk_head_dim + qk_pos_emb_head_dim
    out: dict[str, tuple[int, int, bool]] = {}
    if q_lora_rank is None:
        out["linear_q_proj"] = (hidden_size, num_attention_heads * q_head, True)
    else:
        out["linear_q_down_proj"] = (hidden_size, q_lora_rank, False)
        out["linear_q_up_proj"] = (q_lora_rank, num_attention_heads * q_head, True)
    out["linear_kv_down_proj"] = (hidden_size, kv_lora_rank + qk_pos_emb_head_dim, False)
    out["linear_kv_up_proj"] = (
        kv_lora_rank,
        num_attention_heads * (qk_head_dim + v_head_dim),
        True,
    )
    out["linear_proj"] = (num_attention_heads * v_head_dim, hidden_size, True)
    return out


def count_layer_kinds(kinds: list[str]) -> dict[str, int]:
    """Layers by kind (``mamba``, ``attention``, ``mlp``, ``moe``) of a list of
    :meth:`ModelSpec.layer_kind_list` entries (a GPT layer counts for two kinds)."""
    out = dict.fromkeys(HYBRID_SYMBOLS.values(), 0)
    for entry in kinds:
        for k in entry.split("+"):
            out[k] += 1
    return out


class ModelSpec(_Strict):
    """The architecture, in Megatron-Core ``TransformerConfig`` field names."""

    num_layers: int = Field(ge=1, le=B.MAX_MODEL_INT, description="Transformer layers.")
    hidden_size: int = Field(ge=1, le=B.MAX_MODEL_INT, description="Hidden size h.")
    num_attention_heads: int = Field(ge=1, le=B.MAX_MODEL_INT, description="Attention heads.")
    num_query_groups: int | None = Field(
        None,
        ge=1,
        le=B.MAX_MODEL_INT,
        description="KV groups for GQA; None means MHA (= num_attention_heads).",
    )
    ffn_hidden_size: int = Field(ge=1, le=B.MAX_MODEL_INT, description="MLP hidden size.")
    vocab_size: int = Field(
        ge=1, le=B.MAX_MODEL_INT, description="Vocabulary size (padded by Megatron)."
    )
    seq_length: int | None = Field(
        None,
        ge=1,
        le=B.MAX_MODEL_INT,
        description="Sequence length; must equal semantics.seq_length when given.",
    )
    kv_channels: int | None = Field(
        None, ge=1, le=B.MAX_MODEL_INT, description="Head dim; default h/heads."
    )
    multi_latent_attention: bool = Field(
        False,
        description="Multi-Latent Attention (Megatron-Core MLATransformerConfig."
        "multi_latent_attention, --multi-latent-attention; DeepSeek-V2/V3): low-rank query "
        "and key/value projections (q_lora_rank, kv_lora_rank), query/key heads of "
        "qk_head_dim + qk_pos_emb_head_dim, value heads of v_head_dim. kv_channels and "
        "num_query_groups do not apply.",
    )
    q_lora_rank: int | None = Field(
        512,
        ge=1,
        le=B.MAX_MODEL_INT,
        description="MLA: rank of the query's low-rank projection (MLATransformerConfig."
        "q_lora_rank); None: one full query projection (DeepSeek-V2-Lite).",
    )
    kv_lora_rank: int = Field(
        512,
        ge=1,
        le=B.MAX_MODEL_INT,
        description="MLA: rank of the key/value low-rank projection (kv_lora_rank).",
    )
    qk_head_dim: int = Field(
        128, ge=1, le=B.MAX_MODEL_INT, description="MLA: query/key head dim without RoPE."
    )
    qk_pos_emb_head_dim: int = Field(
        64, ge=1, le=B.MAX_MODEL_INT, description="MLA: the RoPE part of a query/key head."
    )
    v_head_dim: int = Field(128, ge=1, le=B.MAX_MODEL_INT, description="MLA: value head dim.")
    qk_layernorm: bool = Field(
        False,
        description="Norms on the queries and keys (TransformerConfig.qk_layernorm, "
        "--qk-layernorm); with MLA, the norms of the compressed query and key/value "
        "(q_layernorm of q_lora_rank, kv_layernorm of kv_lora_rank), as DeepSeek-V3 has.",
    )
    activation: Literal["gelu", "swiglu", "silu", "relu", "squared_relu"] = Field(
        "swiglu", description="MLP activation (swiglu = silu + gated_linear_unit)."
    )
    normalization: Literal["LayerNorm", "RMSNorm"] = Field(
        "RMSNorm", description="Normalization layer."
    )
    position_embedding_type: Literal["rope", "learned_absolute", "none"] = Field(
        "rope", description="Position embedding."
    )
    add_bias_linear: bool = Field(False, description="Bias in linear layers.")
    untie_embeddings_and_output_weights: bool = Field(
        True, description="Separate output layer weights (Llama style)."
    )
    hidden_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout after attention, MLP and embedding."
    )
    attention_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the attention probabilities."
    )
    num_moe_experts: int | None = Field(
        None, ge=1, le=B.MAX_MODEL_INT, description="Routed experts (MoE)."
    )
    moe_router_topk: int = Field(
        2, ge=1, le=B.MAX_MODEL_INT, description="Experts per token (MoE)."
    )
    moe_ffn_hidden_size: int | None = Field(
        None, ge=1, le=B.MAX_MODEL_INT, description="Expert FFN size (MoE)."
    )
    moe_shared_expert_intermediate_size: int | None = Field(
        None, ge=1, le=B.MAX_MODEL_INT, description="Shared expert FFN size (MoE)."
    )
    moe_layer_freq: int | list[int] = Field(
        1,
        description="Which layers of a GPT MoE model are MoE (Megatron-Core "
        "TransformerConfig.moe_layer_freq, --moe-layer-freq): an int N makes layer i MoE when "
        "i % N == 0 (1: every layer); a list gives one 0 (dense MLP of ffn_hidden_size) or 1 "
        "(MoE) per layer, e.g. DeepSeek-V3's first 3 dense layers [0,0,0,1,...] "
        "(megatron/core/models/gpt/gpt_layer_specs.py get_gpt_decoder_layer_specs).",
    )
    hybrid_layer_pattern: str | None = Field(
        None,
        description="Hybrid (Mamba) model: one symbol per layer, M = Mamba mixer, * = "
        "attention, - = dense MLP, E = MoE (Megatron-Bridge HybridModelProvider / "
        "Megatron-Core MambaModel). None: a GPT model (attention + MLP/MoE in every layer).",
    )
    mamba_num_heads: int | None = Field(
        None, ge=1, description="Mamba heads; None: 2*hidden_size / mamba_head_dim."
    )
    mamba_head_dim: int = Field(64, ge=1, description="Mamba head dim.")
    mamba_state_dim: int = Field(128, ge=1, description="Mamba SSM state size.")
    mamba_num_groups: int = Field(8, ge=1, description="Mamba groups (B/C projections).")
    mamba_chunk_size: int = Field(
        128,
        ge=1,
        le=B.MAX_MODEL_INT,
        description="Chunk length of the Mamba SSD scan (MambaMixer chunk_size).",
    )
    frozen_params: int = Field(
        0,
        ge=0,
        description="Parameters outside the language model that train frozen (vision or "
        "sound encoders of a multimodal recipe): weights only, replicated on every rank.",
    )

    @property
    def gated_linear_unit(self) -> bool:
        return self.activation == "swiglu"

    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_layer_pattern is not None

    def moe_layer_pattern(self) -> list[int]:
        """One 0 (dense MLP) or 1 (MoE) per layer of a GPT model, as Megatron-Core builds it
        from ``moe_layer_freq`` (:func:`moe_layer_pattern`); all 0 for a dense model."""
        return moe_layer_pattern(self.num_layers, self.moe_layer_freq, self.num_moe_experts)

    def layer_kind_list(self) -> list[str]:
        """Every layer's kinds in order: a hybrid model's one kind per symbol; a GPT
        layer's ``attention`` plus ``mlp`` or ``moe`` written ``"attention+moe"``."""
        if self.hybrid_layer_pattern is not None:
            return [HYBRID_SYMBOLS[ch] for ch in self.hybrid_layer_pattern]
        return ["attention+moe" if x else "attention+mlp" for x in self.moe_layer_pattern()]

    def layer_counts(self) -> dict[str, int]:
        """Layers by kind: ``mamba``, ``attention``, ``mlp``, ``moe``. A GPT model's layer
        has attention and an MLP or MoE each (``moe_layer_freq`` says which)."""
        return count_layer_kinds(self.layer_kind_list())

    @property
    def mixed_moe(self) -> bool:
        """A GPT MoE model with dense MLP layers too (``moe_layer_freq`` not every layer)."""
        pat = self.moe_layer_pattern()
        return self.hybrid_layer_pattern is None and 0 < sum(pat) < len(pat)

    def features_needed(self) -> tuple[str, ...]:
        """The optional software the architecture itself needs on a GPU: Mamba layers run
        mamba-ssm's Triton SSD kernels (megatron/core/ssm/mamba_mixer.py; no substitute)."""
        return ("mamba_ssm",) if self.layer_counts()["mamba"] else ()

    @property
    def mamba_heads(self) -> int:
        """Mamba heads (MambaMixer: d_inner = 2*hidden_size unless mamba_num_heads is set)."""
        return self.mamba_num_heads or (2 * self.hidden_size) // self.mamba_head_dim

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def mla_linears(self) -> dict[str, tuple[int, int, bool]]:
        """This model's MLA linear layers (:func:`mla_linear_shapes`); {} without MLA."""
        if not self.multi_latent_attention:
            return {}
        return mla_linear_shapes(
            self.hidden_size,
            self.num_attention_heads,
            self.q_lora_rank,
            self.kv_lora_rank,
            self.qk_head_dim,
            self.qk_pos_emb_head_dim,
            self.v_head_dim,
        )

    @model_validator(mode="after")
    def _mla_fields(self) -> ModelSpec:
        if not self.multi_latent_attention:
            return self
        if self.num_query_groups is not None and self.num_query_groups != self.num_attention_heads:
            raise ValueError(
                "multi_latent_attention has no grouped-query attention (Megatron-LM asserts "
                "not group_query_attention) (num_query_groups="
                f"{self.num_query_groups}, num_attention_heads={self.num_attention_heads})"
            )
        if self.hybrid_layer_pattern is not None:
            raise ValueError(
                "multi_latent_attention applies to a GPT model; a hybrid_layer_pattern's "
                "attention layers are standard attention in dse's model"
            )
        return self

    @model_validator(mode="after")
    def _hybrid_fields(self) -> ModelSpec:
        pat = self.hybrid_layer_pattern
        if pat is None:
            return self
        bad = sorted({ch for ch in pat if ch not in HYBRID_SYMBOLS})
        if bad:
            raise ValueError(
                f"hybrid_layer_pattern has unknown symbols {bad}; known: "
                + ", ".join(f"{k} ({v})" for k, v in HYBRID_SYMBOLS.items())
            )
        if len(pat) != self.num_layers:
            raise ValueError(
                "num_layers must equal the length of hybrid_layer_pattern "
                f"(num_layers={self.num_layers}, len(hybrid_layer_pattern)={len(pat)})"
            )
        if "E" in pat and self.num_moe_experts is None:
            raise ValueError(
                "hybrid_layer_pattern has MoE layers (E) but num_moe_experts is unset"
            )
        if "M" in pat and self.mamba_heads % self.mamba_num_groups:
            raise ValueError(
                "Mamba heads must be divisible by mamba_num_groups (MambaMixer) "
                f"(mamba_heads={self.mamba_heads}, mamba_num_groups={self.mamba_num_groups})"
            )
        return self

    @model_validator(mode="after")
    def _moe_layer_freq(self) -> ModelSpec:
        f = self.moe_layer_freq
        if f == 1:
            return self
        if self.num_moe_experts is None:
            raise ValueError(
                f"moe_layer_freq is set ({f}) but num_moe_experts is unset: a dense model has "
                "no MoE layers to place"
            )
        if self.hybrid_layer_pattern is not None:
            raise ValueError(
                "moe_layer_freq does not apply to a hybrid model: its hybrid_layer_pattern "
                "places the MoE layers (E)"
            )
        if isinstance(f, int):
            if f < 1:
                raise ValueError(f"moe_layer_freq must be >= 1 (moe_layer_freq={f})")
            return self
        if len(f) != self.num_layers:
            raise ValueError(
                "moe_layer_freq as a list needs one entry per layer (Megatron-Core "
                f"get_gpt_decoder_layer_specs) (len(moe_layer_freq)={len(f)}, "
                f"num_layers={self.num_layers})"
            )
        bad = sorted({x for x in f if x not in (0, 1)})
        if bad:
            raise ValueError(f"moe_layer_freq entries must be 0 (dense) or 1 (MoE), got {bad}")
        return self

    @model_validator(mode="after")
    def _moe_fields(self) -> ModelSpec:
        if self.num_moe_experts is not None and self.moe_router_topk > self.num_moe_experts:
            raise ValueError(
                "moe_router_topk must not exceed num_moe_experts "
                f"(moe_router_topk={self.moe_router_topk}, "
                f"num_moe_experts={self.num_moe_experts})"
            )
        if self.num_query_groups is not None and (
            self.num_attention_heads % self.num_query_groups
        ):
            raise ValueError(
                "num_attention_heads must be a multiple of num_query_groups "
                f"(num_attention_heads={self.num_attention_heads}, "
                f"num_query_groups={self.num_query_groups})"
            )
        return self


#: Model fields whose absence makes another kind of model, with the value that means absent:
#: no routed experts is a dense model (not MoE), no layer pattern a GPT (not a hybrid Mamba
#: model), no frozen parameters a language model alone (not a multimodal recipe's, with
#: frozen encoders). A space file of the plainer kind leaves them out, so whoever describes a
#: model by its fields (the cross-study best lookup) means that kind when they leave them out.
MODEL_FAMILY_FIELDS: dict[str, Any] = {
    "num_moe_experts": None,
    "hybrid_layer_pattern": None,
    "frozen_params": 0,
}


def family_value(field: str, value: Any) -> Any:
    """``value`` of the family field ``field`` with every spelling of absent (missing, None,
    0, empty) read as :data:`MODEL_FAMILY_FIELDS`' value."""
    if value is None or value == 0 or value == "":
        return MODEL_FAMILY_FIELDS[field]
    return value


class DataSpec(_Strict):
    """Training data: seeded synthetic tokens (the same for every configuration), a file, or
    Megatron's mock GPT dataset (``mock``: megatron-core's ``MockGPTDataset``, the documents
    of increasing token ids that Megatron-LM's ``--mock-data`` trains on, shuffled with its
    ``--seed``; the same batches on the built-in trainer and upstream)."""

    kind: Literal["synthetic", "path", "mock"] = Field("synthetic", description="Data source.")
    seed: int = Field(
        1234,
        ge=0,
        le=B.MAX_SEED,
        description="Seed of the synthetic token stream (mock: of the dataset's shuffle, "
        "which Megatron-LM takes from --seed: equal to semantics.seed).",
    )
    path: str | None = Field(
        None,
        max_length=B.MAX_PATH_CHARS,
        description="A .npy/.bin file of token ids (kind=path), read as int32/int64.",
    )

    @model_validator(mode="after")
    def _path_given(self) -> DataSpec:
        if self.kind == "path" and not self.path:
            raise ValueError("data.path is required when data.kind is 'path'")
        return self


class MoeRouting(_Strict):
    """MoE routing, held fixed by a study (Megatron-Core ``TransformerConfig`` field names):
    the tuning may change how tokens travel, never which experts they reach."""

    moe_router_load_balancing_type: Literal[
        "aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"
    ] = Field("aux_loss", description="Load-balancing strategy of the router.")
    moe_aux_loss_coeff: float = Field(0.0, ge=0, description="Auxiliary loss coefficient.")
    moe_router_score_function: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="Router score function."
    )
    moe_router_topk_scaling_factor: float | None = Field(
        None, gt=0, description="Scale of the top-k routing probabilities."
    )
    moe_router_enable_expert_bias: bool = Field(
        False, description="Aux-loss-free balancing with a per-expert bias (sigmoid only)."
    )
    moe_router_dtype: Literal["fp32", "fp64"] | None = Field(
        None, description="Router computation dtype (None: the model dtype)."
    )
    moe_router_force_load_balancing: bool = Field(
        False, description="Force balanced routing (benchmarking only: changes the model)."
    )
    moe_expert_capacity_factor: float | None = Field(
        None, gt=0, description="Capacity factor per expert; None: no token dropping."
    )
    moe_pad_expert_input_to_capacity: bool = Field(
        False, description="Pad each expert's input to its capacity (needs a capacity factor)."
    )

    @model_validator(mode="after")
    def _combinations(self) -> MoeRouting:
        # TransformerConfig.__post_init__
        if self.moe_router_enable_expert_bias and self.moe_router_score_function != "sigmoid":
            raise ValueError(
                "moe_router_enable_expert_bias needs moe_router_score_function sigmoid "
                f"(moe_router_score_function={self.moe_router_score_function!r})"
            )
        if self.moe_pad_expert_input_to_capacity and self.moe_expert_capacity_factor is None:
            raise ValueError("moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor")
        if (
            self.moe_expert_capacity_factor is not None
            and self.moe_router_load_balancing_type == "sinkhorn"
        ):
            raise ValueError(
                "moe_expert_capacity_factor works only with aux_loss, seq_aux_loss, "
                "global_aux_loss or none load balancing (moe_router_load_balancing_type="
                "'sinkhorn')"
            )
        return self


#: LoRA's target modules (Megatron-Bridge ``megatron.bridge.peft.lora.LoRA`` and NeMo's
#: ``llm.peft.LoRA`` ``target_modules``): the fused QKV projection, the attention output
#: projection, the MLP's (or each expert's) first and second linear.
LoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
LORA_TARGETS: tuple[LoraTarget, ...] = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


class LoraSpec(_Strict):
    """Parameter-efficient fine-tuning by LoRA: low-rank adapters ``B(A(x)) * alpha / dim``
    beside the target linears train; every base weight is frozen (no gradient, no optimizer
    state). Field names and defaults of Megatron-Bridge's ``LoRA`` (dim 32, alpha 32,
    dropout 0, all four targets)."""

    scheme: Literal["lora"] = Field("lora", description="The PEFT scheme (LoRA).")
    dim: int = Field(32, ge=1, le=65536, description="Adapter rank.")
    alpha: int = Field(32, ge=1, le=1 << 20, description="Scale numerator (alpha / dim).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input.")
    target_modules: list[Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]] = Field(
        default_factory=lambda: list(LORA_TARGETS),
        min_length=1,
        max_length=4,
        description="Linears that get adapters.",
    )

    @field_validator("target_modules")
    @classmethod
    def _unique_targets(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"target_modules lists a module twice: {v}")
        return v


class Semantics(_Strict):
    """What the execution knobs must never change."""

    global_batch_size: int = Field(
        ge=1, le=B.MAX_MODEL_INT, description="Global batch size in sequences."
    )
    seq_length: int = Field(ge=1, le=B.MAX_MODEL_INT, description="Sequence length in tokens.")
    steps: int = Field(6, ge=1, le=1_000_000, description="Training steps per trial.")
    warmup_steps: int = Field(
        2,
        ge=0,
        le=1_000_000,
        description="Steps excluded from the timing (allocation, first kernels).",
    )
    precision: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="Parameter dtype.")
    lr: float = Field(1.0e-4, gt=0, description="Adam learning rate (constant).")
    seed: int = Field(1234, ge=0, le=B.MAX_SEED, description="Model initialisation seed.")
    data: DataSpec = Field(default_factory=lambda: DataSpec(), description="Training data.")
    moe_routing: MoeRouting | None = Field(
        None, description="MoE routing held fixed (MoE models; None: Megatron's defaults)."
    )
    peft: LoraSpec | None = Field(
        None,
        description="Which parameters train: None, all of them (full training); LoRA, "
        "adapters on a frozen base.",
    )
    packed_sequences: bool = Field(
        False,
        description="Several sequences packed into each seq_length row (THD layout: "
        "cu_seqlens, attention within each sequence), as Bridge's and NeMo's packed SFT.",
    )

    init: Literal["layout_invariant", "megatron"] = Field(
        "layout_invariant",
        description="Initial weights of the built-in trainer: layout_invariant (each weight "
        "drawn from (seed, its global name): the same model under every TP/PP layout, which "
        "the loss-parity guard needs) or megatron (Megatron-Core's own initialisation as "
        "built, what upstream Megatron-LM does; the weights then depend on the layout).",
    )

    @model_validator(mode="after")
    def _warmup(self) -> Semantics:
        if self.warmup_steps >= self.steps:
            raise ValueError(
                "warmup_steps must be smaller than steps "
                f"(warmup_steps={self.warmup_steps}, steps={self.steps})"
            )
        if self.data.kind == "mock" and self.data.seed != self.seed:
            raise ValueError(
                "data.kind mock is shuffled with the initialisation seed, as Megatron-LM "
                "shuffles its mock dataset with --seed: data.seed must equal seed "
                f"(data.seed={self.data.seed}, seed={self.seed})"
            )
        return self


class Resources(_Strict):
    """What one trial runs on."""

    world_size: int = Field(1, ge=1, le=1 << 20, description="GPUs (or CPU ranks) per trial.")
    gpus_per_node: int | None = Field(
        None, ge=1, le=1 << 20, description="GPUs per node (default: world)."
    )
    device: Literal["cuda", "cpu"] = Field("cuda", description="Where trials run.")
    gpu: str | None = Field(
        None, max_length=B.MAX_NAME_CHARS, description="GPU name, e.g. 'NVIDIA H200' (cost model)."
    )
    gpu_memory_gib: float | None = Field(
        None, gt=0, description="Memory per GPU in GiB (cost-model pre-screen)."
    )
    features: list[Annotated[str, Field(max_length=B.MAX_NAME_CHARS)]] | Literal["detect"] = Field(
        "detect",
        max_length=B.MAX_LIST_ITEMS,
        description="Optional software present where trials run (transformer_engine, apex, "
        "deepep, hybridep, flash_attn), or 'detect' to probe the trial environment.",
    )

    @field_validator("features")
    @classmethod
    def _known_features(cls, v: Any) -> Any:
        if isinstance(v, list):
            bad = [f for f in v if f not in FEATURES]
            if bad:
                raise ValueError(f"unknown features {bad}; known: {list(FEATURES)}")
        return v


Scalar = (
    Annotated[int, Field(ge=-B.MAX_MODEL_INT, le=B.MAX_MODEL_INT)]
    | bool
    | Annotated[str, Field(max_length=B.MAX_NAME_CHARS)]
    | None
)


class ChoiceDomain(_Strict):
    type: Literal["choice"] = "choice"
    values: list[Scalar] = Field(
        min_length=1, max_length=B.MAX_DOMAIN_VALUES, description="The values to explore."
    )

    def iter_values(self) -> list[Any]:
        return list(self.values)


class IntDomain(_Strict):
    type: Literal["int"] = "int"
    low: int = Field(ge=-B.MAX_MODEL_INT, le=B.MAX_MODEL_INT, description="Smallest value.")
    high: int = Field(ge=-B.MAX_MODEL_INT, le=B.MAX_MODEL_INT, description="Largest value.")
    step: int = Field(1, ge=1, le=B.MAX_MODEL_INT, description="Step between values.")
    log: bool = Field(False, description="Powers of two between low and high.")

    @model_validator(mode="after")
    def _order(self) -> IntDomain:
        if self.low > self.high:
            raise ValueError(f"low must be <= high ({self.low=}, {self.high=})")
        if self.log and (self.low < 1 or self.low & (self.low - 1)):
            raise ValueError(f"log domains start at a power of two >= 1 ({self.low=})")
        n = (self.high - self.low) // self.step + 1
        if not self.log and n > B.MAX_DOMAIN_VALUES:
            raise ValueError(
                f"an int domain has at most {B.MAX_DOMAIN_VALUES} values, this has {n} "
                f"({self.low=}, {self.high=}, {self.step=}); use a larger step or log: true"
            )
        return self

    def iter_values(self) -> list[Any]:
        if self.log:
            out, v = [], self.low
            while v <= self.high:
                out.append(v)
                v *= 2
            return out
        return list(range(self.low, self.high + 1, self.step))


class BoolDomain(_Strict):
    type: Literal["bool"] = "bool"

    def iter_values(self) -> list[Any]:
        return [False, True]


Domain = Annotated[ChoiceDomain | IntDomain | BoolDomain, Field(discriminator="type")]


class KnobSpec(_Strict):
    """A knob to explore: its domain, an optional baseline value and a condition."""

    domain: Domain = Field(description="The values to explore.")
    baseline: Scalar = Field(
        None, description="The recipe's own value (default: the catalog default)."
    )
    when: (
        dict[
            Annotated[str, Field(max_length=B.MAX_NAME_CHARS)],
            Scalar | Annotated[list[Scalar], Field(max_length=B.MAX_DOMAIN_VALUES)],
        ]
        | None
    ) = Field(
        None,
        max_length=B.MAX_KNOBS,
        description="Applies only when each named knob has the value (or one of the values); "
        "otherwise the knob is left at its baseline.",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `{values: [...]}` / `{type: bool}` / `{type: int, low:, high:}` at the top level
        if isinstance(data, Mapping) and "domain" not in data:
            data = dict(data)
            dom = {
                k: data.pop(k)
                for k in ("type", "values", "low", "high", "step", "log")
                if k in data
            }
            if "type" not in dom:
                dom["type"] = "choice"
            data["domain"] = dom
        return data

    def values(self) -> list[Any]:
        return self.domain.iter_values()


class Objective(_Strict):
    metric: Metric = Field("tflops_per_gpu", description="Metric of the trial summary.")
    direction: Direction = Field("maximize", description="Direction.")


class Budget(_Strict):
    n_trials: int = Field(
        12, ge=1, le=10_000_000, description="Trials to run (baseline included)."
    )
    wall_clock_s: float | None = Field(
        None, gt=0, le=B.MAX_DURATION_S, description="Stop launching after this."
    )
    trial_timeout_s: float = Field(
        900, gt=0, le=B.MAX_DURATION_S, description="Kill a trial after this long."
    )
    hang_timeout_s: float = Field(
        300,
        gt=0,
        le=B.MAX_DURATION_S,
        description="Kill a trial that writes no step for this long.",
    )
    repeats: bool = Field(False, description="Run a configuration again when proposed again.")
    remeasure: int = Field(
        2,
        ge=0,
        le=1000,
        description="Re-measurements before the study names a best: once the trials are "
        "spent, configurations whose interval overlaps the best's run again (one more trial "
        "each, recorded with remeasure_of), up to this many trials on top of n_trials. 0: "
        "never.",
    )


class LossParity(_Strict):
    """The loss-parity guard: every complete trial's per-step loss is compared with the
    baseline's (the first complete trial of the space's baseline configuration) on the
    steps both ran; a configuration that drifts beyond the tolerance is flagged
    ``numerics: changed`` and kept out of the best (``dse.stats.numerics``)."""

    enabled: bool = Field(True, description="Compare every trial's loss with the baseline's.")
    rel_tolerance: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Floor of the relative tolerance (|loss - baseline loss| / baseline "
        "loss at any step compared). Default by precision: 0.005 in bf16/fp16 (execution "
        "knobs move a bf16 loss of ~10.7 by up to ~0.02), 0.001 in fp32.",
    )
    noise_factor: float = Field(
        3.0,
        ge=1,
        le=1000,
        description="The tolerance is max(rel_tolerance, noise_factor x the largest drift "
        "measured between two runs of one configuration: baseline repeats, re-measures).",
    )
    baseline_repeats: int = Field(
        0,
        ge=0,
        le=100,
        description="Extra runs of the baseline (on top of budget.n_trials) that measure "
        "the run-to-run loss noise.",
    )
    allow_changed_in_best: bool = Field(
        False, description="Let a configuration flagged numerics-changed be named best."
    )

    @model_validator(mode="after")
    def _repeats_need_the_guard(self) -> LossParity:
        if self.baseline_repeats and not self.enabled:
            raise ValueError(
                "loss_parity.baseline_repeats needs loss_parity.enabled: true "
                f"(baseline_repeats={self.baseline_repeats}, enabled=False)"
            )
        return self


class AgentSpec(_Strict):
    name: AgentName = Field("tpe", description="Search agent.")
    seed: int | None = Field(None, ge=0, le=B.MAX_SEED, description="Sampler seed.")
    n_startup_trials: int = Field(
        4,
        ge=0,
        le=10_000_000,
        description="Start-up trials before the sampler's model takes over.",
    )
    prior: bool = Field(
        True,
        description="tpe/gp/nsga2: fill the start-up trials from a knob-semantics prior "
        "(fused kernels, no recompute, larger micro-batches, smaller model-parallel sizes "
        "first, within the memory seen) instead of random samples.",
    )
    estimate: bool = Field(
        True,
        description="tpe/gp/nsga2 with prior: false: fill the start-up trials from the cost "
        "model's speed estimate of the objective, corrected by the trials measured, instead "
        "of random samples (where the cost model estimates the objective).",
    )
    warm_start: list[dict[Annotated[str, Field(max_length=B.MAX_NAME_CHARS)], Scalar]] = Field(
        default_factory=list,
        max_length=B.MAX_LIST_ITEMS,
        description="Configurations to try right after the baseline.",
    )
    warm_start_study: str | None = Field(
        None,
        max_length=B.MAX_NAME_CHARS,
        description="Seed the agent with trials of an earlier study of the same model.",
    )


# --- runner options: one typed model per runner ---------------------------------------
# ``runner.options`` is validated by the model of ``runner.name`` (RUNNER_OPTIONS). To give a
# runner a new option, add a bounded field to its model; to add a runner, add a model with
# its ``runner`` tag and register it in RUNNER_OPTIONS and in RunnerOptions.
def _tag(name: str) -> Any:
    return Field(name, exclude=True, description="The runner (set from runner.name).")


class LocalOptions(_Strict):
    """Options of the local process pool (its slots: runner.gpus / max_parallel)."""

    runner: Literal["local"] = _tag("local")
    warm_workers: bool | None = Field(
        None,
        description="Run one-rank built-in Megatron trials in a long-lived worker process "
        "per slot (imports, device and process group set up once; recycled after a failure, "
        "a memory-baseline breach or warm_max_trials trials). Default: on for CUDA, off on "
        "CPU. Trials of more than one rank, and other workloads, always run one process "
        "group per trial.",
    )
    warm_spare: bool | None = Field(
        None,
        description="Keep a second warm worker per slot, started while the first runs trials, "
        "so that a recycle costs no start-up. Default: on for CUDA, off on CPU.",
    )
    warm_max_trials: int = Field(
        50, ge=1, le=100_000, description="Trials a warm worker runs before it is recycled."
    )
    warm_memory_slack_mib: float = Field(
        512.0,
        ge=0,
        le=1 << 20,
        description="A warm worker is recycled when, after a trial, its memory (CUDA: the "
        "caching allocator's reserved bytes; CPU: resident set) exceeds its baseline by more "
        "than this.",
    )

    @model_serializer(mode="wrap")
    def _set_only(self, handler: Any) -> Any:
        # options at their default are left out, so that a space's digest does not change
        # when an option is added
        data = handler(self)
        if isinstance(data, dict):
            for name, f in type(self).model_fields.items():
                if name in data and data[name] == f.default and f.default is not None:
                    data.pop(name)
                elif name in data and data[name] is None:
                    data.pop(name)
        return data


def _names(description: str) -> Any:
    return Field(
        default_factory=list,
        max_length=B.MAX_LIST_ITEMS,
        description=description,
    )


# --- what a runner option may hold ----------------------------------------------------
# The Slurm runner writes its options into a bash batch script (#SBATCH lines, srun's command
# line); every value has a strict character set that sbatch accepts and no shell reads as
# code (docs/SECURITY.md). The Ray runner hands its options to Ray and its environment to
# the trial's processes. Environment variables follow the one policy, dse.core.envpolicy.
def _no_controls(v: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError(f"must not contain control characters (newline, tab, NUL): {v!r}")
    return v


_Arg = Annotated[str, Field(max_length=B.MAX_PATH_CHARS), AfterValidator(_no_controls)]


def _env_map(v: dict[str, str]) -> dict[str, str]:
    check_env(dict(v), "env")
    return v


_EnvMap = Annotated[
    dict[Annotated[str, Field(max_length=B.MAX_NAME_CHARS)], _Arg],
    Field(max_length=B.MAX_LIST_ITEMS),
    AfterValidator(_env_map),
]

#: A Slurm partition, account or QOS name (letters, digits, ``_ . + -``); partitions and
#: QOS may be a comma-separated list (sbatch tries each).
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
#: sbatch's --time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED / INFINITE.
SLURM_TIME = re.compile(
    r"\d{1,7}(?::\d{1,2}){0,2}|\d{1,5}-\d{1,2}(?::\d{1,2}){0,2}|UNLIMITED|INFINITE"
)
#: An sbatch or srun option as dse writes it: ``--name`` or ``--name=value``; the value of
#: letters, digits and ``_ . , : @ % + / = [ ] -`` (no quote, space, ``$``, backquote, ``;``,
#: ``&``, ``|``, ``<``, ``>``, ``\``, ``#``, ``*``, ``?``, ``~``, ``!``, newline).
SLURM_OPTION = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(?:=[A-Za-z0-9_.,:@%+/=\[\]-]*)?")
#: Options that run a program, set the job's environment (past dse.core.envpolicy) or move the
#: files dse reads (its log, its working directory): refused, and so is any abbreviation of
#: them (sbatch and srun take an unambiguous prefix of a long option).
SLURM_REFUSED_OPTIONS: dict[str, str] = {
    "wrap": "it replaces the batch script with a command",
    "export": "it sets the job's environment past the environment policy",
    "export-file": "it sets the job's environment past the environment policy",
    "get-user-env": "it sets the job's environment past the environment policy",
    "prolog": "it runs a program",
    "epilog": "it runs a program",
    "task-prolog": "it runs a program",
    "task-epilog": "it runs a program",
    "bcast": "it copies a program to the nodes",
    "chdir": "dse sets the trial's working directory",
    "output": "dse sets the trial's log file",
    "error": "dse sets the trial's log file",
    "input": "it feeds a file to the job",
    "array": "it submits many jobs for one trial, which dse follows as one job",
    "hold": "the job would wait, held, until someone releases it by hand",
    "uid": "it submits the job as another user",
    "gid": "it submits the job as another group",
    "container": "it runs the job in an OCI bundle of its choosing (dse's container is "
    "container_image)",
    "container-id": "it runs the job in an OCI container of its choosing (dse's container is "
    "container_image)",
    "bb": "a burst-buffer specification stages files and can run the buffer plugin's scripts",
    "bbf": "it reads a burst-buffer specification file, which stages files and can run the "
    "buffer plugin's scripts",
}


def slurm_option_problem(arg: str) -> str | None:
    """Why ``arg`` cannot be an sbatch or srun option of a trial's job (None: it can)."""
    m = SLURM_OPTION.fullmatch(arg)
    if m is None:
        return (
            f"{arg!r} is not an option dse writes into a batch script: give '--name' or "
            "'--name=value', the value of letters, digits and _ . , : @ % + / = [ ] - "
            "(no spaces, quotes or shell characters such as ; $ ` | & newline)"
        )
    name = m.group(1)
    for refused, why in SLURM_REFUSED_OPTIONS.items():
        if refused.startswith(name):
            return f"{arg!r}: the option --{refused} is refused ({why})"
    return None


def _slurm_option(v: str) -> str:
    why = slurm_option_problem(v)
    if why:
        raise ValueError(why)
    return v


def _slurm_names(v: str | None, *, many: bool) -> str | None:
    if v is None:
        return v
    parts = v.split(",") if many else [v]
    if not all(SLURM_NAME.fullmatch(p) for p in parts):
        what = "a comma-separated list of Slurm names" if many else "a Slurm name"
        raise ValueError(
            f"{v!r} is not {what} (letters, digits and _ . + -; no spaces, quotes or shell "
            "characters)"
        )
    return v


_SlurmOption = Annotated[str, Field(max_length=B.MAX_PATH_CHARS), AfterValidator(_slurm_option)]


def _mount(v: str) -> str:
    if "," in v:
        raise ValueError(f"a mount must not contain ',' (it would add another mount): {v!r}")
    return v


_Mount = Annotated[_Arg, AfterValidator(_mount)]
#: A Ray cluster address: 'auto', 'local', host:port or ray://host:port.
RAY_ADDRESS = re.compile(r"auto|local|(?:ray://)?[A-Za-z0-9_.\[\]:-]+")


class RayOptions(_Strict):
    """Options of the Ray runner."""

    runner: Literal["ray"] = _tag("ray")
    address: str | None = Field(
        None,
        max_length=B.MAX_PATH_CHARS,
        description="Cluster address for ray.init ('auto', 'ray://head:10001'); "
        "None starts a local Ray.",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None and not RAY_ADDRESS.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a Ray address ('auto', 'local', HOST:PORT or ray://HOST:PORT)"
            )
        return v

    gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="GPUs per node (default: resources.gpus_per_node, else world).",
    )
    cpus_per_trial: float | None = Field(
        None,
        gt=0,
        le=1 << 16,
        description="CPUs reserved per node of a trial (default: a rank's each on CPU, 1 on GPU).",
    )
    num_cpus: int | None = Field(None, ge=1, le=1 << 16, description="A local instance's CPUs.")
    num_gpus: int | None = Field(None, ge=0, le=1 << 16, description="A local instance's GPUs.")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = Field(
        None, description="Placement strategy (default: PACK on one node, STRICT_SPREAD else)."
    )
    env: _EnvMap = Field(default_factory=dict, description="Variables for every trial.")
    queue_timeout_s: float | None = Field(
        None,
        gt=0,
        le=B.MAX_DURATION_S,
        description="Seconds a trial's placement group may wait for room before the trial "
        "is ended as a failure with Ray's scheduling state (default: no limit; a group Ray "
        "finds infeasible fails at once).",
    )


class SlurmOptions(_Strict):
    """Options of the Slurm runner (sbatch flags)."""

    runner: Literal["slurm"] = _tag("slurm")
    partition: str | None = Field(
        None, max_length=B.MAX_NAME_CHARS, description="sbatch --partition."
    )
    account: str | None = Field(None, max_length=B.MAX_NAME_CHARS, description="sbatch --account.")
    qos: str | None = Field(None, max_length=B.MAX_NAME_CHARS, description="sbatch --qos.")
    time_limit: str | None = Field(
        None,
        max_length=32,
        description="sbatch --time (Slurm format, e.g. '00:30:00'); default: the trial "
        "timeout plus 2 minutes.",
    )
    gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="GPUs per node (default: resources.gpus_per_node, else world).",
    )
    nodes: int | None = Field(
        None, ge=1, le=1 << 16, description="Nodes per trial (default: world / gpus_per_node)."
    )
    cpus_per_task: int | None = Field(
        None, ge=1, le=1 << 16, description="sbatch --cpus-per-task."
    )
    exclusive: bool | None = Field(
        None, description="sbatch --exclusive (default: on for GPU trials, off on CPU)."
    )
    container_image: _Arg | None = Field(
        None, max_length=B.MAX_PATH_CHARS, description="pyxis --container-image."
    )
    container_mounts: list[_Mount] = _names(
        "pyxis --container-mounts (src:dst); the workdir is always mounted."
    )
    sbatch_args: list[_SlurmOption] = _names(
        "More #SBATCH lines, e.g. ['--reservation=r1'] ('--name' or '--name=value', no "
        "shell characters; options that run programs or set the environment are refused)."
    )
    srun_args: list[_SlurmOption] = _names("More srun options (as sbatch_args).")
    env: _EnvMap = Field(
        default_factory=dict, description="Variables exported in every batch script."
    )
    poll_interval_s: float = Field(2.0, gt=0, le=3600, description="Seconds between squeue calls.")
    queue_timeout_s: float | None = Field(
        None,
        gt=0,
        le=B.MAX_DURATION_S,
        description="Seconds a trial's job may stay pending before it is cancelled and "
        "recorded with Slurm's pending reason (default: no limit; a job Slurm holds for a "
        "reason that never clears, e.g. PartitionNodeLimit, is cancelled at once).",
    )

    @field_validator("partition", "qos")
    @classmethod
    def _name_list(cls, v: str | None) -> str | None:
        return _slurm_names(v, many=True)

    @field_validator("account")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return _slurm_names(v, many=False)

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_TIME.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                "D-HH:MM:SS, UNLIMITED)"
            )
        return v


RunnerOptions = Annotated[LocalOptions | RayOptions | SlurmOptions, Field(discriminator="runner")]
RUNNER_OPTIONS: dict[str, type[_Strict]] = {
    "local": LocalOptions,
    "ray": RayOptions,
    "slurm": SlurmOptions,
}


class RunnerSpec(_Strict):
    name: RunnerName = Field("local", description="Where trials run.")
    max_parallel: int | None = Field(
        None,
        ge=1,
        le=1 << 16,
        description="Trials at once (default: free GPUs / world, 1 on CPU).",
    )
    gpus: list[Annotated[int, Field(ge=0, le=1 << 16)]] | None = Field(
        None, max_length=B.MAX_LIST_ITEMS, description="GPU ids the local runner may use."
    )
    workdir: _Arg = Field(
        "dse_runs",
        min_length=1,
        max_length=B.MAX_PATH_CHARS,
        description="Folder for trial specs, metrics and logs.",
    )
    python: _Arg | None = Field(
        None, max_length=B.MAX_PATH_CHARS, description="Python interpreter for trial processes."
    )
    options: RunnerOptions = Field(
        default_factory=LocalOptions,
        description="Options of the runner named by runner.name (see its options model).",
    )

    @model_validator(mode="before")
    @classmethod
    def _options_of_runner(cls, data: Any) -> Any:
        # the options are those of runner.name: tag them so the union picks that model
        if isinstance(data, Mapping):
            name = data.get("name", "local")
            opts = data.get("options")
            if opts is None:
                opts = {}
            elif isinstance(opts, BaseModel):
                opts = opts.model_dump()
            if isinstance(opts, Mapping) and isinstance(name, str) and name in RUNNER_OPTIONS:
                data = {**data, "options": {**opts, "runner": name}}
        return data


class WorkloadSpec(_Strict):
    name: WorkloadName = Field(
        "megatron", description="Trial kind (bridge/nemo/megatron_lm: the user's recipe)."
    )
    table: str | None = Field(
        None, max_length=B.MAX_PATH_CHARS, description="Replay table (replay workload)."
    )
    delay_s: float = Field(
        0.0, ge=0, le=86_400, description="Replay: seconds a trial pretends to take."
    )
    launcher: LauncherSpec | None = Field(
        None, description="The recipe a bridge/nemo/megatron_lm workload runs."
    )

    @model_validator(mode="after")
    def _table(self) -> WorkloadSpec:
        if self.name == "replay" and not self.table:
            raise ValueError("workload.table is required for the replay workload")
        if self.name in LAUNCHERS and self.launcher is None:
            raise ValueError(f"workload.launcher is required for the {self.name} workload")
        if self.launcher is not None and self.name not in LAUNCHERS:
            raise ValueError(
                f"workload.launcher applies to {list(LAUNCHERS)}, not to {self.name!r}"
            )
        return self


class PrescreenSpec(_Strict):
    enabled: bool = Field(True, description="Reject predicted-OOM configurations.")
    margin: float = Field(
        0.25, ge=0, description="Relative headroom before a prediction counts as OOM."
    )
    coefficients: dict[str, float] = Field(
        default_factory=dict,
        description="Starting coefficients of the memory model (activation_scale, "
        "static_offset_gib, fragmentation, context_gib, elastic_gib), e.g. fitted to "
        "published figures of the same stack; measured trials refit them.",
    )

    @field_validator("coefficients")
    @classmethod
    def _known_coefficients(cls, v: dict[str, float]) -> dict[str, float]:
        known = (
            "activation_scale",
            "static_offset_gib",
            "fragmentation",
            "context_gib",
            "elastic_gib",
        )
        bad = sorted(set(v) - set(known))
        if bad:
            raise ValueError(f"unknown coefficients {bad}; known: {list(known)}")
        return v


class SearchSpace(_Strict):
    """A whole space file."""

    version: Literal[1] = Field(1, description="Space file format version.")
    study: str = Field(min_length=1, max_length=128, description="Study name.")
    recipe: str | None = Field(
        None, max_length=B.MAX_NAME_CHARS, description="Recipe this space tunes (informational)."
    )
    model: ModelSpec = Field(description="Architecture (fixed).")
    semantics: Semantics = Field(description="Training semantics (fixed).")
    resources: Resources = Field(default_factory=lambda: Resources(), description="Per trial.")
    knobs: dict[str, KnobSpec] = Field(
        min_length=1, max_length=B.MAX_KNOBS, description="Knobs to explore."
    )
    fixed: dict[str, Scalar] = Field(
        default_factory=dict,
        max_length=B.MAX_KNOBS,
        description="Knobs held at a value (not explored).",
    )
    derived: dict[str, Annotated[str, Field(max_length=B.MAX_NAME_CHARS)]] = Field(
        default_factory=dict,
        max_length=B.MAX_KNOBS,
        description="Knobs set from the layout as Megatron-Bridge sets them (knob: derivation, "
        "e.g. 'sequence_parallel: bridge': off where TP is 1); see dse/space/derive.py.",
    )
    constraints: list[Annotated[str, Field(max_length=B.MAX_CONSTRAINT_CHARS)]] = Field(
        default_factory=list,
        max_length=B.MAX_CONSTRAINTS,
        description="Extra constraints: Python-like boolean expressions over knob names, "
        "world_size and dp (e.g. 'micro_batch_size * tensor_model_parallel_size <= 8').",
    )
    objectives: list[Objective] = Field(
        default_factory=lambda: [Objective()],
        min_length=1,
        max_length=2,
        description="One objective, or two for NSGA-II.",
    )
    budget: Budget = Field(default_factory=lambda: Budget(), description="Trial budget.")
    agent: AgentSpec = Field(default_factory=lambda: AgentSpec(), description="Search agent.")
    runner: RunnerSpec = Field(default_factory=lambda: RunnerSpec(), description="Runner.")
    workload: WorkloadSpec = Field(default_factory=lambda: WorkloadSpec(), description="Trial.")
    prescreen: PrescreenSpec = Field(
        default_factory=lambda: PrescreenSpec(), description="Cost-model pre-screen."
    )
    measurement: MeasurementSpec = Field(
        default_factory=lambda: MeasurementSpec(),
        description="How a trial measures its step time (fixed window or adaptive length) "
        "and whether dominated trials stop early; see dse/stats/measure.py.",
    )
    loss_parity: LossParity = Field(
        default_factory=lambda: LossParity(),
        description="The loss-parity guard (every trial's loss against the baseline's).",
    )
    storage: str = Field(
        "sqlite:///dse.db",
        max_length=B.MAX_PATH_CHARS,
        description="SQLAlchemy URL of the study database.",
    )
    env: EnvSpec = Field(
        default_factory=lambda: EnvSpec(),
        description="Environment of every rank; env.knobs are explored as knobs env.VAR.",
    )

    @model_validator(mode="before")
    @classmethod
    def _env_knobs(cls, data: Any) -> Any:
        # env.knobs: {VAR: domain} are knobs named env.VAR (explored like any other knob)
        if isinstance(data, Mapping) and isinstance(data.get("env"), Mapping):
            env = dict(data["env"])
            swept = env.pop("knobs", None)
            if swept:
                if not isinstance(swept, Mapping):
                    raise ValueError("env.knobs must map environment variables to domains")
                knobs = dict(data.get("knobs") or {})
                for var, spec in swept.items():
                    name = f"{ENV_PREFIX}{var}"
                    if name in knobs:
                        raise ValueError(f"env.knobs.{var} is also given as knobs.{name}")
                    if var in (env.get("fixed") or {}):
                        raise ValueError(f"env.knobs.{var} is also in env.fixed; give it once")
                    knobs[name] = spec
                data = {**data, "env": env, "knobs": knobs}
        return data

    @field_validator("study")
    @classmethod
    def _study_name(cls, v: str) -> str:
        why = study_name_problem(v)
        if why is not None:
            raise ValueError(f"{why} (study={v!r})")
        return v

    @field_validator("knobs", "fixed", "derived", mode="before")
    @classmethod
    def _known_knobs(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            for name in v:
                if len(str(name)) > B.MAX_NAME_CHARS:
                    raise ValueError(f"a knob name has at most {B.MAX_NAME_CHARS} characters")
                get_knob(str(name))  # UnknownKnobError names the known ones
        return v

    @model_validator(mode="before")
    @classmethod
    def _model_catalog(cls, data: Any) -> Any:
        # `model: NAME` or `model: {catalog: NAME, <overrides>}` names a catalog entry
        if isinstance(data, Mapping) and "model" in data:
            data = dict(data)
            try:
                data["model"] = expand_model(data["model"])
            except ValueError as e:
                raise ValueError(f"model.catalog: {e}") from None
        return data

    @model_validator(mode="before")
    @classmethod
    def _objective_alias(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "objective" in data:
            data = dict(data)
            if "objectives" in data:
                raise ValueError("give either 'objective' or 'objectives', not both")
            obj = data.pop("objective")
            data["objectives"] = obj if isinstance(obj, list) else [obj]
        return data

    @model_validator(mode="after")
    def _cross(self) -> SearchSpace:
        if (
            self.model.seq_length is not None
            and self.model.seq_length != self.semantics.seq_length
        ):
            raise ValueError(
                "model.seq_length must equal semantics.seq_length "
                f"(model.seq_length={self.model.seq_length}, "
                f"semantics.seq_length={self.semantics.seq_length})"
            )
        if self.semantics.moe_routing is not None and self.model.num_moe_experts is None:
            raise ValueError("semantics.moe_routing is given but the model has no experts")
        for name, spec in {**self.knobs}.items():
            knob = get_knob(name)
            for v in spec.values():
                why = knob.check_value(v)
                if why:
                    raise ValueError(f"knobs.{name}: {why}")
            if spec.baseline is not None and spec.baseline not in spec.values():
                raise ValueError(
                    f"knobs.{name}.baseline {spec.baseline!r} is not in its domain {spec.values()}"
                )
            for other, _want in (spec.when or {}).items():
                if other not in self.knobs and other not in self.fixed:
                    raise ValueError(f"knobs.{name}.when names {other!r}, which is not a knob")
        for name, v in self.fixed.items():
            if name in self.knobs:
                raise ValueError(f"fixed.{name} is also a knob; give it in one place only")
            why = get_knob(name).check_value(v)
            if why:
                raise ValueError(f"fixed.{name}: {why}")
        _check_derived(self)
        for i, expr in enumerate(self.constraints):
            _check_expr(expr, constraint_where(i), set(self.knobs) | set(self.fixed))
        if self.workload.name == "megatron" and self.resources.device == "cpu":
            if self.semantics.precision == "fp16":
                raise ValueError("semantics.precision fp16 is not supported on CPU")
        if self.measurement.clock == "cpu" and (
            self.resources.device != "cpu" or self.workload.name != "megatron"
        ):
            raise ValueError(
                "measurement.clock cpu times the built-in trainer's steps on CPU (workload "
                f"megatron, resources.device cpu); this space has workload {self.workload.name}"
                f" on device {self.resources.device}"
            )
        if self.measurement.prune:
            objs = [f"{o.metric} ({o.direction})" for o in self.objectives]
            if len(self.objectives) != 1 or self.objective.metric not in PRUNABLE_METRICS:
                raise ValueError(
                    "measurement.prune stops trials dominated by the best of one objective "
                    f"of {list(PRUNABLE_METRICS)}; this space's objectives are {objs}"
                )
        for ws in self.agent.warm_start:
            for k, v in ws.items():
                if k not in self.knobs:
                    raise ValueError(f"agent.warm_start names {k!r}, which is not a knob")
                if v not in self.knobs[k].values():
                    raise ValueError(
                        f"agent.warm_start value {k}={v!r} is not in its domain "
                        f"{self.knobs[k].values()}"
                    )
        return self

    # --- derived -----------------------------------------------------------------------
    @property
    def objective(self) -> Objective:
        return self.objectives[0]

    def baseline(self) -> dict[str, Any]:
        """The recipe's own configuration: every knob at its baseline value."""
        out: dict[str, Any] = {}
        for name, spec in self.knobs.items():
            if spec.baseline is not None:
                out[name] = spec.baseline
            else:
                default = get_knob(name).default
                out[name] = default if default in spec.values() else spec.values()[0]
        return self.apply_conditions(out)

    def canonical(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The canonical form of a configuration: every knob (missing ones at their baseline
        value), nothing else, conditions, inert knobs and derivations applied
        (:meth:`apply_conditions`). Two configurations with the same canonical form are the
        same run: one trial, one configuration of the best."""
        if all(name in params for name in self.knobs):
            out = {name: params[name] for name in self.knobs}
        else:
            base = self.baseline()
            out = {name: params[name] if name in params else base[name] for name in self.knobs}
        return self.apply_conditions(out)

    def apply_conditions(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The canonical form of a configuration: inactive conditional knobs take their
        baseline value, and so do knobs that do nothing in its layout; a knob that a
        ``derived`` rule sets there takes the derived value
        (:func:`dse.space.derive.canonical`)."""
        return self.canonicalizer()(params)

    def changeable_knobs(self) -> tuple[str, ...]:
        """The knobs :meth:`apply_conditions` may change, in the order of ``knobs``: the
        conditional ones, the ones a ``derived`` rule sets and the ones that can be inert
        (every other knob keeps its value in every configuration)."""

        return tuple(n for n, s in self.knobs.items() if s.when or n in self.derived or n in INERT)

    def canonicalizer(self) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        """:meth:`apply_conditions` for many configurations of this space: which knobs are
        conditional, derived or can be inert is found once, so each configuration costs
        the knobs that can change, not every knob of the space."""

        conditional = tuple(n for n, s in self.knobs.items() if s.when)
        settable = tuple(n for n in self.knobs if n in self.derived or n in INERT)
        inactive = self._inactive_value

        def apply(params: Mapping[str, Any]) -> dict[str, Any]:
            out = dict(params)
            for name in conditional:
                if not self.is_active(name, out):
                    out[name] = inactive(name)
            return canonical(self, out, inactive, settable)

        return apply

    def _inactive_value(self, name: str) -> Any:
        spec = self.knobs[name]
        if spec.baseline is not None:
            return spec.baseline
        default = get_knob(name).default
        dom = spec.domain
        if isinstance(dom, IntDomain) and not dom.log:  # O(1): called per combination
            inside = isinstance(default, int) and default in range(dom.low, dom.high + 1, dom.step)
            return default if inside else dom.low
        values = dom.values if isinstance(dom, ChoiceDomain) else spec.values()  # no copy
        return default if default in values else values[0]

    def is_active(self, name: str, params: Mapping[str, Any]) -> bool:
        spec = self.knobs[name]
        for other, want in (spec.when or {}).items():
            have = params.get(other, self.fixed.get(other))
            wants = want if isinstance(want, list) else [want]
            if have not in wants:
                return False
        return True

    def inactive_knobs(self, params: Mapping[str, Any]) -> set[str]:
        """The knobs of a configuration (``params``: knob values, fixed ones included or not)
        that do nothing there: a conditional knob whose condition does not hold, and a knob
        Megatron-Core does not read under the others' values
        (:func:`dse.space.derive.ignored`, from :data:`dse.space.knobs.IGNORED`). The one
        answer to "is this value live" that :meth:`active_config` and every launcher ask."""

        full = self.full_params(params)
        out = {n for n, spec in self.knobs.items() if spec.when and not self.is_active(n, full)}
        return (out | ignored(self, full)) & set(full)

    def active_config(self, params: Mapping[str, Any], *, fixed: bool = True) -> dict[str, Any]:
        """The canonical configuration as it runs: every setting of ``params`` (with
        ``fixed``: the space's fixed values and derivations too, :meth:`full_params`) but the
        knobs that do nothing there (:meth:`inactive_knobs`). What the stored best, every
        export (Megatron-LM, Bridge, NeMo, CloudAI), the dashboard and the report show: a
        value that does nothing is never shown nor exported as if it did."""
        drop = self.inactive_knobs(params)
        src = self.full_params(params) if fixed else params
        return {k: v for k, v in src.items() if k not in drop}

    def full_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Knob values plus the fixed ones, with the ``derived`` settings applied: everything
        the trial sets."""
        full = {**self.fixed, **params}
        if not self.derived:
            return full

        return derive(self, full)

    def size(self) -> int:
        return math.prod(len(s.values()) for s in self.knobs.values())

    def iter_configs(self, max_combinations: int | None = None) -> Iterator[dict[str, Any]]:
        """Every distinct canonical configuration of the space (conditions applied).

        ``max_combinations`` bounds the raw knob combinations looked at (conditions can
        collapse many combinations into one configuration)."""
        names = list(self.knobs)
        seen: set[str] = set()
        combos: Iterator[tuple[Any, ...]] = itertools.product(
            *(self.knobs[n].values() for n in names)
        )
        if max_combinations is not None:
            combos = itertools.islice(combos, max_combinations)
        for combo in combos:
            p = self.apply_conditions(dict(zip(names, combo, strict=True)))
            k = params_key(p)
            if k not in seen:
                seen.add(k)
                yield p

    def constraint_values(self, params: Mapping[str, Any]) -> list[tuple[str, bool]]:
        if not self.constraints:
            return []
        env = self._constraint_env(params)
        exprs = tuple(self.constraints)
        kept = joint_values(exprs)
        got = kept.get(env)
        if got is not None:
            return list(zip(exprs, got, strict=True))
        values = tuple(
            bool(_eval_expr(expr, env, constraint_where(i))) for i, expr in enumerate(exprs)
        )
        kept.put(env, values)
        return list(zip(exprs, values, strict=True))

    def constraints_hold(self, params: Mapping[str, Any]) -> bool:
        """Whether every constraint holds (``all`` of :meth:`constraint_values`; one that
        cannot be evaluated does not), evaluated in order up to the first that does not."""
        if not self.constraints:
            return True
        env = self._constraint_env(params)
        try:
            return all(eval_expr(expr, env) for expr in self.constraints)
        except ConstraintError:
            return False

    def _constraint_env(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The names a constraint reads: the full parameters, ``world_size`` and ``dp``."""
        env = dict(self.full_params(params))
        layout = Layout.resolve(self.model, self.semantics, self.resources, env)
        env["world_size"] = layout.world
        env["dp"] = layout.dp
        return env

    def study_fields(self) -> dict[str, Any]:
        """What a study record keeps of its space (besides the file's text). The record's
        model carries the sequence length, which a space gives under ``semantics`` (what
        ``GET /best?seq_length=`` and a warm start compare)."""
        r = self.resources
        return {
            "name": self.study,
            "space_hash": self.identity_digest(),
            "direction": self.objective.direction,
            "metric": self.objective.metric,
            "model": {**self.model.model_dump(), "seq_length": self.semantics.seq_length},
            "hardware": {
                "gpu": r.gpu,
                "gpu_memory_gib": r.gpu_memory_gib,
                "world_size": r.world_size,
                "device": r.device,
            },
        }

    def digest(self) -> str:
        # model fields added later count only when set, so earlier studies keep their hash
        defaults = ModelSpec.model_fields
        unset = {k for k in _LATER_MODEL_FIELDS if getattr(self.model, k) == defaults[k].default}
        exclude: dict[str, Any] = {"model": unset} if unset else {}
        sem_unset = {
            k
            for k, unset in (
                ("moe_routing", self.semantics.moe_routing is None),
                ("peft", self.semantics.peft is None),  # added later: counted only when set
                ("packed_sequences", not self.semantics.packed_sequences),
                ("init", self.semantics.init == Semantics.model_fields["init"].default),
            )
            if unset
        }
        if sem_unset:
            exclude["semantics"] = sem_unset
        if not self.prescreen.coefficients:
            exclude["prescreen"] = {"coefficients"}
        if self.measurement == MeasurementSpec():  # added later: counted only when set
            exclude["measurement"] = True
        elif self.measurement.clock == "wall":  # added later still
            exclude["measurement"] = {"clock"}
        # settings added later count only when set, so earlier studies keep their hash
        if self.loss_parity == LossParity():
            exclude["loss_parity"] = True
        if self.budget.remeasure == Budget.model_fields["remeasure"].default:
            exclude["budget"] = {"remeasure"}
        if self.agent.estimate == AgentSpec.model_fields["estimate"].default:
            exclude["agent"] = {"estimate"}
        if self.workload.launcher is not None:  # provenance, not what a trial runs
            exclude["workload"] = {"launcher": {"cloudai"}}
        text = self.model_dump_json(exclude=exclude or None)
        return hashlib.sha256(text.encode()).hexdigest()

    def identity(self) -> dict[str, Any]:
        """What changes the meaning of a study's trials (model, semantics, resources, knobs,
        fixed values, constraints, objectives, trial kind): a study keeps these for life.
        Everything else (budget, agent, runner, workdir, table path, pre-screen, storage)
        is a run setting that ``dse resume`` / ``dse start`` may change.

        Of ``measurement``, the mode, step bounds, precision and confidence are identity (they
        say what a trial's figure is); ``prune`` and ``prune_margin`` are run settings
        (:class:`dse.stats.measure.MeasurementSpec`). A space that leaves them at their defaults
        has no ``measurement`` entry, so studies stored before the section keep their hash."""
        out = self.model_dump(
            mode="json", include=set(IDENTITY_FIELDS) | {"workload"}, exclude=_RUN_WORKLOAD
        )
        for k in _LATER_MODEL_FIELDS:  # as in digest(): counted only when set
            if out["model"].get(k) == 0.0:
                out["model"].pop(k, None)
        if out["model"].get("moe_layer_freq") == 1:  # added later still: its default
            out["model"].pop("moe_layer_freq")
        sem = out["semantics"]
        if sem.get("peft") is None:  # training semantics added later: counted only when set
            sem.pop("peft", None)
        if not sem.get("packed_sequences"):
            sem.pop("packed_sequences", None)
        if sem.get("init") == Semantics.model_fields["init"].default:  # added later still
            sem.pop("init", None)
        measurement = self.measurement.identity()
        if measurement != MeasurementSpec().identity():
            out["measurement"] = measurement
        return out

    def identity_digest(self) -> str:
        """A hash of :meth:`identity` (the study record's ``space_hash``)."""
        import json

        text = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


#: Top-level fields of a space that make a study's identity (see :meth:`SearchSpace.identity`);
#: of ``workload`` only the trial kind is (its table path and delay are run settings).
IDENTITY_FIELDS: tuple[str, ...] = (
    "model",
    "semantics",
    "resources",
    "knobs",
    "fixed",
    "constraints",
    "objectives",
    "env",
)
_RUN_WORKLOAD: dict[str, Any] = {"workload": {"table", "delay_s"}}


def params_key(params: Mapping[str, Any]) -> str:
    """A canonical string of a configuration (sorted keys), used to find duplicates."""
    import json

    return json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True)


def _check_derived(space: SearchSpace) -> None:
    """``derived:`` names a derivation known for each knob; one that always applies leaves
    nothing to explore."""

    for name, how in space.derived.items():
        table = DERIVATIONS.get(name)
        if table is None:
            raise ValueError(
                f"derived.{name}: no derivation is known for this knob; derivable knobs: "
                f"{sorted(DERIVATIONS)}"
            )
        if how not in table:
            known = "; ".join(f"{k}: {d.description}" for k, d in table.items())
            raise ValueError(f"derived.{name}: unknown derivation {how!r}; known: {known}")
        if table[how].always and name in space.knobs:
            raise ValueError(
                f"derived.{name}: {how!r} sets {name} in every configuration, so it cannot "
                f"also be explored; remove knobs.{name}"
            )
        if table[how].always and name in space.fixed:
            raise ValueError(
                f"derived.{name}: {how!r} sets {name} in every configuration; remove fixed.{name}"
            )


# --- constraint expressions (a bounded subset of Python: dse.core.expr) ------------------------


def _check_expr(expr: str, where: str, names: set[str]) -> None:
    try:
        check_expr(expr, names)
    except ConstraintError as e:
        raise ValueError(f"{where}: {e} in {_shown(expr)}") from None


def constraint_where(i: int) -> str:
    """How messages name the space's ``i``-th constraint (with its text after it)."""
    return f"constraints[{i}]"


def _eval_expr(expr: str, env: Mapping[str, Any], where: str) -> Any:
    """Evaluate a constraint; any failure is a ConstraintEvalError naming the constraint
    (``where``: its place in the space file, and its text)."""
    try:
        return eval_expr(expr, env)
    except ConstraintError as e:
        raise ConstraintEvalError(expr, str(e), where) from None


def _shown(text: str, limit: int = 200) -> str:
    """``repr`` of a piece of input, shortened (repr also escapes control characters)."""
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 3] + "..."


# --- loading ---------------------------------------------------------------------------


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("choice", "int", "bool") and out.endswith("domain"):
            continue
        elif part in RUNNER_OPTIONS and out.endswith("options"):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


_NAMES_A_FIELD = re.compile(r"^[a-z_]+(\.[a-z_]+|\[\d+\])*[.:\[ ]")


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """`` (did you mean 'budget'?)`` for a misspelt field at ``loc`` (a close match among the
    fields of the section it is in), else ``""``."""
    import difflib
    import typing

    cls: Any = SearchSpace
    for part in loc[:-1]:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return ""
        types = (field.annotation, *typing.get_args(field.annotation))
        cls = next((t for t in types if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if cls is None:
            return ""
    known = [f.alias or k for k, f in cls.model_fields.items()]
    near = difflib.get_close_matches(str(loc[-1]), known, n=1) if loc else []
    return f" (did you mean {near[0]!r}?)" if near else ""


def parse_space(data: Any, source: str = "<space>") -> SearchSpace:
    """Validate a mapping as a space; errors name ``source`` and the field path."""
    if not isinstance(data, Mapping):
        raise SpaceError(f"{source}: a space file must be a mapping, got {type(data).__name__}")
    try:
        return SearchSpace.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors()[:20]:
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg += _did_you_mean(err["loc"])
            where = _loc(err["loc"])
            if where == "(top level)" and _NAMES_A_FIELD.match(msg):
                line = f"{source}: {msg}"  # a cross-field check that names its field itself
            else:
                line = f"{source}: {where}: {msg}"
            lines.append(B.printable(line if len(line) <= 2000 else line[:1997] + "..."))
        if e.error_count() > 20:
            lines.append(f"{source}: ... and {e.error_count() - 20} more errors")
        raise SpaceError("\n".join(lines)) from None
    except RecursionError:
        raise SpaceError(f"{source}: the document is nested too deeply") from None


def parse_space_text(text: str, source: str) -> SearchSpace:
    """Parse and validate a space file's YAML text; errors name ``source`` (and the line)."""
    source = B.printable(source)
    if len(text) > B.MAX_SPACE_BYTES:
        raise SpaceError(
            f"{source}: a space file has at most {B.MAX_SPACE_BYTES} bytes, "
            f"this has {len(text)} characters"
        )
    try:
        data = safe_load(text)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, ESC ...)
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise SpaceError(
            f"{source}: not valid YAML at line {line}, column {column}: "
            f"the character #x{e.character:04x} is not allowed"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpaceError(
            B.printable(f"{source}: not valid YAML{where}: {getattr(e, 'problem', None) or e}")
        ) from None
    except RecursionError:  # a deeply nested document
        raise SpaceError(f"{source}: the YAML document is nested too deeply") from None
    return parse_space(data, source)


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a space file."""
    p = Path(path)
    where = B.printable(str(p))
    try:
        raw = B.read_regular_file(p, B.MAX_SPACE_BYTES)
    except OSError as e:
        raise SpaceError(f"{where}: cannot read the space file ({e.strerror})") from e
    except ValueError as e:
        raise SpaceError(
            f"{where}: {e}; a space file is a YAML file of at most {B.MAX_SPACE_BYTES} bytes"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpaceError(
            f"{where}: not UTF-8 text (byte {e.start} of the file: {e.reason}); "
            "save the space file as UTF-8"
        ) from None
    space = parse_space_text(text, str(p))
    return _resolve_paths(space, p.parent)


def _resolve_paths(space: SearchSpace, base: Path) -> SearchSpace:
    """Relative file paths in a space file are relative to the file's own folder."""
    upd: dict[str, Any] = {}
    table = space.workload.table
    if table and not Path(table).is_absolute():
        upd["workload"] = space.workload.model_copy(
            update={"table": str((base / table).resolve())}
        )
    dpath = space.semantics.data.path
    if dpath and not Path(dpath).is_absolute():
        data = space.semantics.data.model_copy(update={"path": str((base / dpath).resolve())})
        upd["semantics"] = space.semantics.model_copy(update={"data": data})
    return space.model_copy(update=upd) if upd else space
