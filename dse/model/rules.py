"""Validity rules: reject a configuration before launch, naming the rule and its values.

Each rule mirrors a check that Megatron-Core (or the batch arithmetic, or the trial
environment) would make at build time; the source is given in the rule's docstring.

A rule is written once, here, against a :class:`RuleContext` and the configuration's
:class:`~dse.space.layout.Layout`. It runs before launch (the proposer, ``dse validate``,
``dse estimate``) on the space, and again in the trial process on a :class:`Problem`
built from the trial spec (``dse.workloads.megatron._plan.make_plan``), which reports the
first violation as an ``invalid`` failure with the same ``str(violation)``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from dse.core.bounds import MAX_SPACE_COMBINATIONS
from dse.core.exceptions import ConstraintEvalError, SpaceError
from dse.space.knobs import KNOBS, get_knob, modules_list, requires_nothing
from dse.space.layout import Layout, PipelineSplit, PipelineSplitError, pipeline_chunks
from dse.space.searchspace import (
    ModelSpec,
    Resources,
    SearchSpace,
    Semantics,
    constraint_where,
    params_key,
)

__all__ = [
    "Violation",
    "Layout",
    "Problem",
    "RuleContext",
    "RULES",
    "check",
    "is_valid",
    "check_space",
    "SpaceCheck",
    "UnusableValue",
    "layout",
    "first_violation",
]


@dataclass(frozen=True)
class Violation:
    """A rule a configuration breaks: the rule's name, a message and the values involved."""

    rule: str
    message: str
    values: dict[str, Any]
    #: Where in the space file the rule is, when the space file wrote it (``constraints[2]``).
    where: str | None = None

    def __str__(self) -> str:
        vals = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"{self.rule}: {self.message} ({vals})"


class RuleContext(Protocol):
    """What a rule may read besides the configuration: a
    :class:`~dse.space.searchspace.SearchSpace`
    before launch, a :class:`Problem` in the trial process."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def semantics(self) -> Semantics: ...
    @property
    def resources(self) -> Resources: ...
    def full_params(self, params: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def constraint_values(self, params: Mapping[str, Any]) -> list[tuple[str, bool]]: ...
    def constraints_hold(self, params: Mapping[str, Any]) -> bool: ...


@dataclass(frozen=True)
class Problem:
    """A rule context without a space file: the trial process checks a trial spec's
    configuration with it (its params are already complete; a space's own constraints
    were checked before launch)."""

    model: ModelSpec
    semantics: Semantics
    resources: Resources
    #: the trial process that checks it (only dse's built-in trainer builds a Problem)
    workload: str = "megatron"

    def full_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return dict(params)

    def constraint_values(self, params: Mapping[str, Any]) -> list[tuple[str, bool]]:
        return []

    def constraints_hold(self, params: Mapping[str, Any]) -> bool:
        return True


class _Checked:
    """The rule context of one :func:`check` call: the space, with the configuration's full
    parameters (fixed knobs and derivations applied) worked out once, not once per rule
    (each rule asks for them; the derivations resolve the parallel layout)."""

    def __init__(self, space: RuleContext, params: dict[str, Any]) -> None:
        self._space = space
        self._params = params
        self._full = space.full_params(params)
        self._full_view = MappingProxyType(self._full)

    @property
    def model(self) -> ModelSpec:
        return self._space.model

    @property
    def semantics(self) -> Semantics:
        return self._space.semantics

    @property
    def resources(self) -> Resources:
        return self._space.resources

    def full_params(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        if params is self._params:  # read-only: every rule reads the same one, uncopied
            return self._full_view
        return self._space.full_params(params)

    def constraint_values(self, params: Mapping[str, Any]) -> list[tuple[str, bool]]:
        return self._space.constraint_values(params)

    def constraints_hold(self, params: Mapping[str, Any]) -> bool:
        return self._space.constraints_hold(params)

    @property
    def workload(self) -> Any:
        """The space's workload (a :class:`Problem`'s name: the built-in trainer's)."""
        return getattr(self._space, "workload", None)

    @property
    def env_fixed(self) -> Mapping[str, Any]:
        """The space's fixed environment (``env.fixed``; empty for a trial spec's
        :class:`Problem`, whose trial process has its environment already)."""
        env = getattr(self._space, "env", None)
        return dict(getattr(env, "fixed", None) or {})


def _env(s: RuleContext, fp: Mapping[str, Any], var: str) -> Any:
    """Environment variable ``var`` of a configuration: its ``env.VAR`` knob, else the
    space's fixed value (None when neither sets it)."""
    if f"env.{var}" in fp:
        return fp[f"env.{var}"]
    return (getattr(s, "env_fixed", None) or {}).get(var)


def _get(params: Mapping[str, Any], name: str) -> Any:
    return params[name] if name in params else KNOBS[name].default


def layout(space: RuleContext, params: Mapping[str, Any]) -> Layout:
    """The :class:`~dse.space.layout.Layout` of ``params`` (fixed knobs of the space included)."""
    return Layout.resolve(space.model, space.semantics, space.resources, space.full_params(params))


Rule = Callable[[RuleContext, dict[str, Any], Layout, "set[str] | None"], "Violation | None"]
RULES: dict[str, Rule] = {}


def _rule(fn: Rule) -> Rule:
    RULES[fn.__name__.removeprefix("r_")] = fn
    return fn


def _v(name: str, msg: str, **values: Any) -> Violation:
    return Violation(name, msg, values)


@_rule
def r_world_divisible(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """world % (TP*PP*CP) == 0 (megatron/core/parallel_state.py initialize_model_parallel)."""
    if L.world % (L.tp * L.pp * L.cp):
        return _v(
            "world_divisible",
            "world size must be divisible by TP*PP*CP",
            world_size=L.world,
            tp=L.tp,
            pp=L.pp,
            cp=L.cp,
        )
    return None


@_rule
def r_heads_tp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """num_attention_heads % TP == 0 (TransformerConfig.__post_init__)."""
    if s.model.num_attention_heads % L.tp:
        return _v(
            "heads_tp",
            "num_attention_heads must be divisible by TP",
            num_attention_heads=s.model.num_attention_heads,
            tp=L.tp,
        )
    return None


@_rule
def r_query_groups_tp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """num_query_groups must be a multiple or divisor of TP (TransformerConfig)."""
    g = s.model.query_groups
    if g % L.tp and L.tp % g:
        return _v(
            "query_groups_tp",
            "num_query_groups must be a multiple or a divisor of TP",
            num_query_groups=g,
            tp=L.tp,
        )
    return None


@_rule
def r_ffn_tp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """ffn_hidden_size % TP == 0 (ColumnParallelLinear divide())."""
    if s.model.ffn_hidden_size % L.tp:
        return _v(
            "ffn_tp",
            "ffn_hidden_size must be divisible by TP",
            ffn_hidden_size=s.model.ffn_hidden_size,
            tp=L.tp,
        )
    return None


@_rule
def r_gbs_divisible(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """GBS % (MBS*DP) == 0 (num_microbatches_calculator.py)."""
    if L.dp == 0:
        return None  # world_divisible reports it
    if L.gbs % (L.mbs * L.dp):
        return _v(
            "gbs_divisible",
            "global_batch_size must be divisible by MBS*DP",
            global_batch_size=L.gbs,
            micro_batch_size=L.mbs,
            dp=L.dp,
        )
    return None


@_rule
def r_layers_pp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """The pipeline split Megatron-Core accepts (megatron/core/transformer/
    transformer_config.py ``__post_init__``, "PP layout" and "Uneven PP"; the layout string by
    pipeline_parallel_layer_layout.py): the even split needs num_layers % PP == 0 (and % VPP
    per rank); uneven first / last stages, the embedding / loss counted as layers and an
    explicit ``pipeline_model_parallel_layout`` each their own divisibility, never together
    (:func:`dse.space.layout.pipeline_chunks`). VPP needs PP > 1 and, interleaved,
    num_microbatches % PP == 0."""
    n = s.model.num_layers
    split = L.split
    if split.is_even and n % L.pp:
        return _v("layers_pp", "num_layers must be divisible by PP", num_layers=n, pp=L.pp)
    if L.vpp is not None and L.pp < 2:
        return _v("vpp_needs_pp", "virtual pipeline needs PP > 1", pp=L.pp, vpp=L.vpp)
    if split.is_even and L.vpp is not None and (n // L.pp) % L.vpp:
        return _v(
            "layers_vpp",
            "layers per PP stage must be divisible by VPP",
            num_layers=n,
            pp=L.pp,
            vpp=L.vpp,
        )
    if not split.is_even:
        if s.model.is_hybrid and (split.uneven or split.pipeline_model_parallel_layout):
            return _v(
                "pipeline_split",
                "a hybrid (MambaStack) model splits its layer pattern evenly; uneven stages "
                "and pipeline layouts are for GPT models here",
                **_split_values(split),
            )
        try:
            vpp = s.full_params(p).get("virtual_pipeline_model_parallel_size")
            pipeline_chunks(n, L.pp, vpp, split)
        except PipelineSplitError as e:
            return _v("pipeline_split", str(e), num_layers=n, pp=L.pp, **_split_values(split))
    if L.vpp is not None and L.num_microbatches and L.num_microbatches % L.pp:
        return _v(
            "vpp_microbatches",
            "interleaved 1F1B needs num_microbatches divisible by PP",
            num_microbatches=L.num_microbatches,
            pp=L.pp,
        )
    return None


def _split_values(split: PipelineSplit) -> dict[str, Any]:
    """The pipeline split fields that are set, for a violation's values."""
    return {k: v for k, v in vars(split).items() if v not in (None, False)}


@_rule
def r_seq_cp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """seq_length % (2*CP) == 0 when CP > 1 (Megatron-LM arguments.py; Bridge validate)."""
    if L.cp > 1 and s.semantics.seq_length % (2 * L.cp):
        return _v(
            "seq_cp",
            "seq_length must be divisible by 2*CP",
            seq_length=s.semantics.seq_length,
            cp=L.cp,
        )
    return None


@_rule
def r_experts_ep(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """EP needs MoE and num_moe_experts % EP == 0; expert grid world % (ETP*EP*PP) == 0."""
    e = s.model.num_moe_experts
    if e is None:
        if L.ep > 1:
            return _v("ep_needs_moe", "expert parallelism needs num_moe_experts", ep=L.ep)
        return None
    if e % L.ep:
        return _v(
            "experts_ep", "num_moe_experts must be divisible by EP", num_moe_experts=e, ep=L.ep
        )
    if L.world % (L.etp * L.ep * L.pp):
        return _v(
            "expert_grid",
            "world size must be divisible by ETP*EP*PP",
            world_size=L.world,
            etp=L.etp,
            ep=L.ep,
            pp=L.pp,
        )
    return None


@_rule
def r_sequence_parallel(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """SP needs TP > 1 (ModelParallelConfig) and a TE or apex norm (local torch norms fail)."""
    fp = s.full_params(p)
    if not _get(fp, "sequence_parallel"):
        return None
    if L.tp < 2:
        return _v("sp_needs_tp", "sequence_parallel needs TP > 1", tp=L.tp)
    return None


@_rule
def r_bias_activation_fusion(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """bias_activation_fusion needs gelu/silu(swiglu) (TransformerConfig); gelu without GLU
    needs add_bias_linear."""
    fp = s.full_params(p)
    if not _get(fp, "bias_activation_fusion"):
        return None
    act = s.model.activation
    if act not in ("gelu", "silu", "swiglu"):
        return _v(
            "bias_activation_fusion",
            "bias_activation_fusion needs a gelu or silu/swiglu activation",
            activation=act,
        )
    if act == "gelu" and not s.model.add_bias_linear:
        return _v(
            "bias_activation_fusion",
            "bias_activation_fusion with gelu needs add_bias_linear",
            activation=act,
            add_bias_linear=False,
        )
    return None


@_rule
def r_overlap_param_gather(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """overlap_param_gather needs the distributed optimizer and overlap_grad_reduce."""
    fp = s.full_params(p)
    if _get(fp, "overlap_param_gather") and not (
        _get(fp, "use_distributed_optimizer") and _get(fp, "overlap_grad_reduce")
    ):
        return _v(
            "overlap_param_gather",
            "overlap_param_gather needs use_distributed_optimizer and overlap_grad_reduce",
            use_distributed_optimizer=_get(fp, "use_distributed_optimizer"),
            overlap_grad_reduce=_get(fp, "overlap_grad_reduce"),
        )
    return None


@_rule
def r_precision_aware(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """Without the precision-aware optimizer all optimizer dtypes must be fp32
    (optimizer_config.py); with it, the distributed optimizer is required."""
    fp = s.full_params(p)
    dtypes = {
        k: _get(fp, k)
        for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
    }
    if dtypes["main_grads_dtype"] == "bf16" and _get(fp, "grad_reduce_in_fp32"):
        return _v(
            "main_grads_bf16_vs_fp32_reduce",
            "main_grads_dtype bf16 conflicts with "
            "grad_reduce_in_fp32 (Megatron-LM accumulate_allreduce_grads_in_fp32)",
            main_grads_dtype="bf16",
            grad_reduce_in_fp32=True,
        )
    if _get(fp, "use_precision_aware_optimizer"):
        if not _get(fp, "use_distributed_optimizer"):
            return _v(
                "precision_aware_optimizer",
                "use_precision_aware_optimizer needs use_distributed_optimizer",
                use_distributed_optimizer=False,
            )
        return None
    bad = {k: v for k, v in dtypes.items() if v != "fp32"}
    if bad:
        return _v(
            "optimizer_dtypes",
            "non-fp32 optimizer dtypes need use_precision_aware_optimizer",
            **bad,
        )
    return None


#: Switches that act only on a MoE model (the catalog's ``Knob.moe_only``), in catalog order.
_MOE_SWITCHES = tuple(k.name for k in KNOBS.values() if k.moe_only and k.kind == "bool")


@_rule
def r_moe_knobs(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """MoE-only knobs on a dense model; dispatcher combinations (TransformerConfig)."""
    fp = s.full_params(p)
    moe = s.model.num_moe_experts is not None
    for k in _MOE_SWITCHES:
        if _get(fp, k) and not moe:
            return _v("moe_only", f"{k} needs a MoE model", **{k: True})
    disp = _get(fp, "moe_token_dispatcher_type")
    if _get(fp, "moe_shared_expert_overlap") and disp not in ("alltoall", "flex"):
        return _v(
            "shared_expert_overlap",
            "moe_shared_expert_overlap needs the alltoall or flex dispatcher",
            moe_token_dispatcher_type=disp,
        )
    return None


@_rule
def r_moe_tp_needs_sp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """MoE layers with TP > 1 need sequence parallelism in training (megatron-core raises at
    the first MoE forward without it)."""
    if s.model.num_moe_experts is None or L.tp < 2:
        return None
    if not _get(s.full_params(p), "sequence_parallel"):
        return _v(
            "moe_tp_needs_sp",
            "MoE with TP > 1 needs sequence_parallel",
            tp=L.tp,
            sequence_parallel=False,
        )
    return None


@_rule
def r_alltoall_needs_nccl(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """The alltoall MoE token dispatcher needs NCCL: with EP > 1 it exchanges tokens with
    uneven ``all_to_all_single`` splits that it keeps as device tensors for the GPU path
    (moe/token_dispatcher.py ``MoEAlltoAllTokenDispatcher``); on CPU ranks (gloo) the exchange
    fails with a TypeError."""
    if s.resources.device != "cpu" or s.model.num_moe_experts is None or L.ep < 2:
        return None
    if _get(s.full_params(p), "moe_token_dispatcher_type") != "alltoall":
        return None
    return _v(
        "alltoall_needs_nccl",
        "the alltoall MoE token dispatcher needs NCCL (a GPU backend); CPU trials use gloo",
        moe_token_dispatcher_type="alltoall",
        expert_model_parallel_size=L.ep,
        device="cpu",
    )


@_rule
def r_local_spec_limits(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """Without Transformer Engine the local spec is used: no SP (torch norms), no CP (local
    DotProductAttention asserts context_parallel_size == 1)."""
    fp = s.full_params(p)
    te = _get(fp, "attention_backend") in ("te", "flash", "fused")
    if te:
        return None
    if L.cp > 1:
        return _v(
            "cp_needs_te",
            "context parallelism needs Transformer Engine attention "
            "(the local spec's attention does not support CP)",
            context_parallel_size=L.cp,
            attention_backend=_get(fp, "attention_backend"),
        )
    if _get(fp, "sequence_parallel"):
        return _v(
            "sp_needs_te_norm",
            "sequence_parallel needs a TE or apex norm; the local "
            "spec's torch norms do not support it",
            sequence_parallel=True,
            attention_backend=_get(fp, "attention_backend"),
            normalization=s.model.normalization,
        )
    return None


@_rule
def r_fp16_needs_cuda(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """fp16 training needs a GPU (the trial process refuses it on CPU ranks)."""
    if s.semantics.precision == "fp16" and s.resources.device == "cpu":
        return _v(
            "fp16_needs_cuda",
            "fp16 training is not supported on CPU",
            precision="fp16",
            device="cpu",
        )
    return None


@functools.lru_cache(maxsize=4096)
def _requires(name: str) -> Callable[[Any], tuple[str, ...]] | None:
    """Knob ``name``'s ``requires``, or None when no value of it needs optional software
    (looked up once per name, not once per configuration checked)."""
    requires = get_knob(name).requires
    return None if requires is requires_nothing else requires


@functools.lru_cache(maxsize=64)
def _needing_software(names: tuple[str, ...]) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """Of a configuration's settings (``names``, in order), the ones with a value that can
    need optional software, each with its ``requires`` (found once per set of names: every
    configuration of a space has the same names)."""
    return tuple((n, r) for n in names if (r := _requires(n)) is not None)


@_rule
def r_features(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """A knob value that needs software absent where trials run (TE, apex, DeepEP ...)."""
    if f is None:
        return None
    fp = s.full_params(p)
    for name, requires in _needing_software(tuple(fp)):
        value = fp[name]
        if name == "moe_flex_dispatcher_backend" and _get(fp, "moe_token_dispatcher_type") != (
            "flex"
        ):
            continue  # only read by the flex dispatcher
        if name == "cross_entropy_fusion_impl" and not _get(fp, "cross_entropy_loss_fusion"):
            continue  # only read when the loss fusion is on
        for feat in requires(value):
            if feat not in f:
                return _v(
                    "missing_feature",
                    f"{name}={value!r} needs {feat}, which the trial environment lacks",
                    **{name: value, "available": sorted(f)},
                )
    return None


@_rule
def r_constraints(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """Extra constraints of the space file (one that cannot be evaluated on this
    configuration, e.g. a division by zero, rejects it with rule ``space_constraint_error``)."""
    try:
        values = s.constraint_values(p)
    except ConstraintEvalError as e:
        values_of = {k: v for k, v in s.full_params(p).items() if k in e.expr}
        return Violation("space_constraint_error", str(e), values_of, e.where)
    for i, (expr, ok) in enumerate(values):
        if not ok:
            where = constraint_where(i)
            values_of = {k: v for k, v in s.full_params(p).items() if k in expr}
            return Violation("space_constraint", f"{where} {expr!r} is false", values_of, where)
    return None


# --- hybrid (Mamba) models and the tuned hybrid/MoE recipes' knobs ---------------------------


def _mamba(s: RuleContext) -> bool:
    return s.model.layer_counts()["mamba"] > 0


@_rule
def r_mamba_tp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """Mamba heads and groups divisible by TP (megatron/core/ssm/mamba_mixer.py asserts)."""
    if not _mamba(s):
        return None
    m = s.model
    if m.mamba_heads % L.tp or m.mamba_num_groups % L.tp:
        return _v(
            "mamba_tp",
            "Mamba heads and mamba_num_groups must be divisible by TP",
            mamba_heads=m.mamba_heads,
            mamba_num_groups=m.mamba_num_groups,
            tp=L.tp,
        )
    return None


@_rule
def r_mamba_cp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """Mamba with CP: heads per TP rank divisible by CP; groups per TP rank divisible by CP,
    or CP divisible by them (megatron/core/ssm/mamba_context_parallel.py)."""
    if not _mamba(s) or L.cp == 1 or L.tp == 0:
        return None
    m = s.model
    heads, groups = m.mamba_heads // L.tp, m.mamba_num_groups // L.tp
    if heads % L.cp or (groups % L.cp if groups >= L.cp else L.cp % max(groups, 1)):
        return _v(
            "mamba_cp",
            "Mamba heads/TP must be divisible by CP, and groups/TP divisible by CP "
            "(or CP by groups/TP)",
            mamba_heads_per_tp=heads,
            mamba_groups_per_tp=groups,
            cp=L.cp,
        )
    return None


@_rule
def r_mamba_kernels(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """Mamba layers run mamba-ssm's Triton SSD kernels (megatron/core/ssm/mamba_mixer.py);
    on a GPU there is no substitute. A CPU trial of the built-in trainer runs them on a
    labelled torch reference (Triton needs a GPU), so the rule is for GPU trials."""
    if f is None or not set(s.model.features_needed()) - f or s.resources.device == "cpu":
        return None
    return _v(
        "missing_feature",
        "Mamba layers need the mamba-ssm kernels (its Triton SSD scan, "
        "mamba_ssm.ops.triton), which the trial environment lacks",
        mamba_layers=s.model.layer_counts()["mamba"],
        available=sorted(f),
    )


@_rule
def r_hybrid_recompute(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """A hybrid model's layers are a MambaStack, which has no full-recompute path
    (megatron/core/ssm/mamba_block.py): recompute_granularity=full would recompute nothing."""
    if not s.model.is_hybrid or s.full_params(p).get("recompute") != "full":
        return None
    return _v(
        "hybrid_full_recompute",
        "full recompute is not implemented for hybrid (MambaStack) models; use selective "
        "recompute with recompute_modules",
        recompute="full",
    )


@_rule
def r_hybrid_vpp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """MambaStack asserts virtual_pipeline_model_parallel_size is None
    (megatron/core/ssm/mamba_block.py _select_layers_for_pipeline_parallel)."""
    if not s.model.is_hybrid or L.vpp is None:
        return None
    return _v(
        "hybrid_vpp",
        "virtual (interleaved) pipeline stages are not supported for hybrid (MambaStack) models",
        vpp=L.vpp,
    )


@_rule
def r_recompute_modules(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """recompute_modules (selective): moe_act needs moe_grouped_gemm; moe, moe_act and
    shared_experts need MoE layers, shared_experts a shared expert and no
    moe_shared_expert_overlap; FP8 with the delayed recipe cannot recompute moe_act or
    layernorm; mla_up_proj needs Multi-Latent Attention (TransformerConfig.__post_init__).

    ``mlp`` is allowed on every model, as Megatron-Core 0.16.1 allows it: its
    TransformerConfig.__post_init__ checks only that each module is a known name
    (megatron/core/transformer/transformer_config.py, the "selective" branch), and each
    TransformerLayer recomputes its MLP only when it is a dense layer
    (megatron/core/transformer/transformer_layer.py: ``if "mlp" in
    self.config.recompute_modules: if not self.is_moe_layer: self.recompute_mlp = True``).
    On a model with dense and MoE layers (``moe_layer_freq``, e.g. DeepSeek-V3's 3 dense
    first layers) it recomputes the dense ones; on an all-MoE model (Qwen3-30B-A3B) it is
    accepted and changes nothing."""
    fp = s.full_params(p)
    if _get(fp, "recompute") != "selective" or fp.get("recompute_modules") is None:
        return None
    mods = modules_list(fp["recompute_modules"])
    counts = s.model.layer_counts()
    if "mla_up_proj" in mods and not s.model.multi_latent_attention:
        return _v(
            "recompute_modules",
            "mla_up_proj recompute needs multi-latent attention",
            recompute_modules=fp["recompute_modules"],
            multi_latent_attention=False,
        )
    if "moe_act" in mods and not _get(fp, "moe_grouped_gemm"):
        return _v(
            "recompute_modules",
            "moe_act recompute needs moe_grouped_gemm",
            recompute_modules=fp["recompute_modules"],
            moe_grouped_gemm=False,
        )
    for mod in ("moe", "moe_act", "shared_experts"):
        if mod in mods and not counts["moe"]:
            return _v(
                "recompute_modules",
                f"{mod} recompute needs MoE layers",
                recompute_modules=fp["recompute_modules"],
            )
    if "shared_experts" in mods:
        if not s.model.moe_shared_expert_intermediate_size:
            return _v(
                "recompute_modules",
                "shared_experts recompute needs a shared expert",
                recompute_modules=fp["recompute_modules"],
            )
        if _get(fp, "moe_shared_expert_overlap"):
            return _v(
                "recompute_modules",
                "shared_experts recompute cannot be combined with moe_shared_expert_overlap",
                recompute_modules=fp["recompute_modules"],
                moe_shared_expert_overlap=True,
            )
    if _get(fp, "fp8") and _get(fp, "fp8_recipe") == "delayed":
        if "moe_act" in mods or "layernorm" in mods:
            return _v(
                "recompute_modules",
                "FP8 delayed scaling cannot recompute moe_act or layernorm",
                recompute_modules=fp["recompute_modules"],
                fp8_recipe="delayed",
            )
    return None


def _builtin_trainer(s: RuleContext) -> bool:
    """Whether the trials of ``s`` run dse's built-in trainer: a space whose workload is
    ``megatron``, or the trial spec that trainer checks (:class:`Problem`)."""
    workload = getattr(s, "workload", None)
    return getattr(workload, "name", workload) == "megatron"


@_rule
def r_packed_sequences(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """Packed sequences (``semantics.packed_sequences``): one packed row per micro-batch
    (Megatron-Bridge ``ConfigContainer.validate`` and NeMo's fine-tuning data module refuse
    MBS > 1: "Micro batch size should be 1 when training with packed sequence"). A recipe's
    packed SFT runs the THD layout (``PackedSeqParams``, ``cu_seqlens``), which needs a
    Transformer Engine attention: Megatron-Core's local DotProductAttention asserts
    ``packed_seq_params is None`` (megatron/core/transformer/dot_product_attention.py), so
    ``unfused`` and dse's ``sdpa`` cannot attend within each packed sequence there. dse's
    built-in trainer (workload ``megatron``; a trial spec's own check, :class:`Problem`)
    packs the other way Megatron-Core takes: a block-diagonal causal ``attention_mask`` and
    per-sequence position ids on the local spec, so local attention is its path."""
    if not getattr(s.semantics, "packed_sequences", False):
        return None
    if L.mbs != 1:
        return _v(
            "packed_sequences",
            "packed sequences train one packed row per micro-batch (micro_batch_size 1)",
            micro_batch_size=L.mbs,
        )
    backend = _get(s.full_params(p), "attention_backend")
    if backend in ("unfused", "sdpa") and not _builtin_trainer(s):
        return _v(
            "packed_sequences",
            "packed sequences need Transformer Engine attention (the local "
            "DotProductAttention takes no packed_seq_params)",
            attention_backend=backend,
        )
    return None


@_rule
def r_flex_dispatcher(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """The flex dispatcher with DeepEP needs TP*EP > 1 (token_dispatcher.py) and, like
    HybridEP, no padding of the expert input to capacity (TransformerConfig)."""
    fp = s.full_params(p)
    if s.model.num_moe_experts is None or _get(fp, "moe_token_dispatcher_type") != "flex":
        return None
    backend = _get(fp, "moe_flex_dispatcher_backend")
    if backend == "deepep" and L.tp * L.ep <= 1:
        return _v("flex_deepep", "the DeepEP flex backend needs TP*EP > 1", tp=L.tp, ep=L.ep)
    routing = s.semantics.moe_routing
    if backend == "deepep" and routing is not None and routing.moe_pad_expert_input_to_capacity:
        return _v(
            "flex_deepep",
            "the DeepEP flex backend cannot pad the expert input to capacity",
            moe_pad_expert_input_to_capacity=True,
        )
    return None


@_rule
def r_fused_squared_relu(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """use_fused_weighted_squared_relu acts only in MoE experts with squared-ReLU, no GLU
    (elsewhere it has no effect) and asserts there is no bias (transformer/moe/experts.py)."""
    if not _get(s.full_params(p), "use_fused_weighted_squared_relu"):
        return None
    m = s.model
    if not m.num_moe_experts or m.activation != "squared_relu" or m.add_bias_linear:
        return _v(
            "fused_squared_relu",
            "use_fused_weighted_squared_relu needs MoE experts with squared_relu and no bias",
            activation=m.activation,
            num_moe_experts=m.num_moe_experts,
            add_bias_linear=m.add_bias_linear,
        )
    return None


@_rule
def r_fused_qkv_rope(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """fused_single_qkv_rope asserts unless RoPE is present (transformer/attention.py)."""
    if _get(s.full_params(p), "fused_single_qkv_rope") and (
        s.model.position_embedding_type != "rope"
    ):
        return _v(
            "fused_qkv_rope",
            "fused_single_qkv_rope needs RoPE",
            position_embedding_type=s.model.position_embedding_type,
        )
    return None


@_rule
def r_fused_residual_rmsnorm(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """fused_residual_rmsnorm needs RMSNorm and Transformer Engine norms (TransformerConfig;
    TENorm)."""
    fp = s.full_params(p)
    if not _get(fp, "fused_residual_rmsnorm"):
        return None
    te = _get(fp, "attention_backend") in ("te", "flash", "fused")
    if s.model.normalization != "RMSNorm" or not te:
        return _v(
            "fused_residual_rmsnorm",
            "fused_residual_rmsnorm needs RMSNorm and Transformer Engine layers",
            normalization=s.model.normalization,
            attention_backend=_get(fp, "attention_backend"),
        )
    return None


@_rule
def r_shared_expert_grouped_gemm(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """use_grouped_gemm_for_shared_expert needs a shared expert, SwiGLU and no bias
    (transformer/moe/shared_experts.py)."""
    if not _get(s.full_params(p), "use_grouped_gemm_for_shared_expert"):
        return None
    m = s.model
    if not m.moe_shared_expert_intermediate_size or m.activation != "swiglu" or m.add_bias_linear:
        return _v(
            "shared_expert_grouped_gemm",
            "use_grouped_gemm_for_shared_expert needs a shared expert with SwiGLU and no bias",
            activation=m.activation,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
        )
    return None


@_rule
def r_optimizer_cuda_graph(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """optimizer_cuda_graph makes TE FusedAdam capturable, which raises unless master
    weights and both moments are fp32 and store_param_remainders is off (fused_adam.py)."""
    fp = s.full_params(p)
    if not _get(fp, "optimizer_cuda_graph"):
        return None
    dtypes = {k: _get(fp, k) for k in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")}
    remainders = _get(fp, "store_param_remainders") and _get(fp, "use_precision_aware_optimizer")
    if any(v != "fp32" for v in dtypes.values()) or remainders:
        return _v(
            "optimizer_cuda_graph",
            "a capturable optimizer needs fp32 master weights and moments and "
            "store_param_remainders off",
            **dtypes,
            store_param_remainders=bool(remainders),
        )
    return None


@_rule
def r_overlap_param_gather_step(
    s: RuleContext, p: dict, L: Layout, f: set[str] | None
) -> Violation | None:
    """overlap_param_gather_with_optimizer_step needs the distributed optimizer and
    overlap_param_gather, and interleaved pipelining (Megatron-LM arguments.py)."""
    fp = s.full_params(p)
    if not _get(fp, "overlap_param_gather_with_optimizer_step"):
        return None
    if not (_get(fp, "use_distributed_optimizer") and _get(fp, "overlap_param_gather")):
        return _v(
            "overlap_param_gather_step",
            "overlap_param_gather_with_optimizer_step needs use_distributed_optimizer and "
            "overlap_param_gather",
            use_distributed_optimizer=_get(fp, "use_distributed_optimizer"),
            overlap_param_gather=_get(fp, "overlap_param_gather"),
        )
    if L.vpp is None:
        return _v(
            "overlap_param_gather_step",
            "overlap_param_gather_with_optimizer_step needs interleaved pipelining (VPP)",
            pp=L.pp,
            vpp=L.vpp,
        )
    return None


@_rule
def r_megatron_fsdp(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """Megatron FSDP (use_megatron_fsdp) always trains with the distributed optimizer
    (Megatron-Bridge's _validate_and_apply_megatron_fsdp_configs switches it on, so a
    configuration without it would be measured as one with it), and both Megatron-LM's
    validate_args and Megatron-Bridge assert CUDA_DEVICE_MAX_CONNECTIONS is not 1 with it."""
    fp = s.full_params(p)
    if not _get(fp, "use_megatron_fsdp"):
        return None
    if not _get(fp, "use_distributed_optimizer"):
        return _v(
            "megatron_fsdp",
            "use_megatron_fsdp needs use_distributed_optimizer (Megatron FSDP always uses it)",
            use_distributed_optimizer=False,
        )
    conns = _env(s, fp, "CUDA_DEVICE_MAX_CONNECTIONS")
    if conns is not None and str(conns) == "1":
        return _v(
            "megatron_fsdp",
            "use_megatron_fsdp needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1",
            CUDA_DEVICE_MAX_CONNECTIONS=conns,
        )
    return None


@_rule
def r_fp8(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """fp8_param needs fp8 (TransformerConfig); FP8 needs bf16 or fp16 training."""
    fp = s.full_params(p)
    if _get(fp, "fp8_param") and not _get(fp, "fp8"):
        return _v("fp8", "fp8_param needs fp8", fp8_param=True, fp8=None)
    if _get(fp, "fp8") and s.semantics.precision == "fp32":
        return _v("fp8", "FP8 needs bf16 or fp16 training", precision="fp32")
    return None


@_rule
def r_moe_a2a_overlap(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """overlap_moe_expert_parallel_comm needs EP > 1, the alltoall or flex dispatcher, no
    full recompute and no moe recompute, no moe_shared_expert_overlap, bf16/fp16, and VPP
    when PP > 1 (TransformerConfig.__post_init__)."""
    fp = s.full_params(p)
    if not _get(fp, "overlap_moe_expert_parallel_comm"):
        return None
    why = None
    if L.ep < 2:
        why = "needs expert parallelism (EP > 1)"
    elif _get(fp, "moe_token_dispatcher_type") not in ("alltoall", "flex"):
        why = "needs the alltoall or flex dispatcher"
    elif _get(fp, "recompute") == "full":
        why = "cannot be combined with full recompute"
    elif _get(fp, "recompute") == "selective" and "moe" in modules_list(
        fp.get("recompute_modules")
    ):
        why = "cannot be combined with moe recompute"
    elif _get(fp, "moe_shared_expert_overlap"):
        why = "cannot be combined with moe_shared_expert_overlap"
    elif s.semantics.precision == "fp32":
        why = "needs bf16 or fp16 training"
    elif L.pp > 1 and L.vpp is None:
        why = "needs VPP when PP > 1"
    if why:
        return _v(
            "moe_a2a_overlap",
            f"overlap_moe_expert_parallel_comm {why}",
            ep=L.ep,
            moe_token_dispatcher_type=_get(fp, "moe_token_dispatcher_type"),
            recompute=_get(fp, "recompute"),
        )
    return None


@_rule
def r_cuda_graphs(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """CUDA graphs: no full recompute with per-layer graphs; the moe/moe_router scopes need
    MoE (moe: also drop-and-pad routing), not both; mlp needs dense MLP layers; mamba needs
    Mamba layers (TransformerConfig.__post_init__)."""
    fp = s.full_params(p)
    if _get(fp, "cuda_graph_impl") == "none":
        return None
    if _get(fp, "recompute") == "full":
        return _v(
            "cuda_graphs",
            "CUDA graphs of layers cannot be combined with full recompute",
            cuda_graph_impl=_get(fp, "cuda_graph_impl"),
        )
    scope = modules_list(fp.get("cuda_graph_scope"))
    counts = s.model.layer_counts()
    routing = s.semantics.moe_routing
    why = None
    if ("moe" in scope or "moe_router" in scope) and not counts["moe"]:
        why = "moe scopes need MoE layers"
    elif "moe" in scope and "moe_router" in scope:
        why = "moe and moe_router cannot both be captured"
    elif "moe" in scope and not (routing and routing.moe_pad_expert_input_to_capacity):
        why = "the moe scope needs drop-and-pad routing (moe_pad_expert_input_to_capacity)"
    elif "moe_preprocess" in scope and "moe_router" not in scope:
        why = "moe_preprocess needs moe_router"
    elif "mlp" in scope and not counts["mlp"]:
        why = "the mlp scope needs dense MLP layers"
    elif "mamba" in scope and not counts["mamba"]:
        why = "the mamba scope needs Mamba layers"
    if why:
        return _v("cuda_graphs", why, cuda_graph_scope=fp.get("cuda_graph_scope"))
    return None


def check(
    space: RuleContext, params: Mapping[str, Any], features: Iterable[str] | None = None
) -> list[Violation]:
    """Every rule the configuration breaks (empty: valid).

    ``features`` is the set of optional software present where trials run; None means
    unknown (feature rules are then left to the trial process).
    """
    return list(_violations(space, params, features))


def first_violation(
    space: RuleContext, params: Mapping[str, Any], features: Iterable[str] | None = None
) -> Violation | None:
    """The first rule the configuration breaks (``check(...)[0]``; no rule after it runs)."""
    return next(_violations(space, params, features), None)


def is_valid(
    space: RuleContext, params: Mapping[str, Any], features: Iterable[str] | None = None
) -> bool:
    """Whether the configuration breaks no rule (``not check(...)``) for less work: it stops
    at the first rule broken, and the space's own constraints, the costliest rule (up to
    MAX_CONSTRAINTS of MAX_CONSTRAINT_NODES nodes each), run last and stop at the first one
    that does not hold. The agents ask this of every candidate they would propose."""
    rest = [fn for name, fn in RULES.items() if name != "constraints"]
    for _ in _violations(space, params, features, rest):
        return False
    return space.constraints_hold(params)


def _violations(
    space: RuleContext,
    params: Mapping[str, Any],
    features: Iterable[str] | None,
    rules: Iterable[Rule] | None = None,
) -> Iterator[Violation]:
    """The rules ``params`` breaks, in order, each worked out when it is asked for."""
    p = dict(params)
    ctx = _Checked(space, p)
    L = layout(ctx, p)
    fs = None if features is None else set(features)
    for fn in RULES.values() if rules is None else rules:
        v = fn(ctx, p, L, fs)
        if v is not None:
            yield v


#: Knob combinations :func:`check_space` looks at: every one of a space up to this size, else
#: a random sample of this many.
CHECK_SPACE_CAP = MAX_SPACE_COMBINATIONS
#: Sampled combinations that must hold a knob value before the check says of a value it never
#: saw in a valid configuration that none can use it (a space it checked whole: one).
UNUSABLE_MIN_SEEN = 30
#: Distinct valid configurations of a sample whose equivalent combinations are counted (the
#: estimate of the number of distinct valid configurations of a space larger than the cap).
_CLASS_SAMPLE = 1_000


@dataclass(frozen=True)
class UnusableValue:
    """A knob value that no configuration looked at can use.

    Attributes:
        knob, value: the knob and its value.
        seen: combinations looked at that had it.
        collapsed: of those, combinations where a condition (``when:``), a derivation or an
            inert layout replaced it (the configuration does not keep the value).
        rules: the rules broken by the other ones, most frequent first (``(rule, count)``).
    """

    knob: str
    value: Any
    seen: int
    collapsed: int
    rules: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        why = []
        if self.rules:
            why.append("breaks " + ", ".join(f"{r} ({n})" for r, n in self.rules[:3]))
        if self.collapsed:
            why.append(f"replaced by a condition, derivation or inert layout ({self.collapsed})")
        return (
            f"knobs.{self.knob}: value {self.value!r} is in no valid configuration "
            f"({'; '.join(why)}, of {self.seen} looked at)"
        )


@dataclass(frozen=True)
class SpaceCheck:
    """What :func:`check_space` found.

    Attributes:
        combinations: the space's raw knob combinations (``space.size()``).
        looked_at: distinct configurations checked against the rules.
        valid: of those, the ones that pass the rules.
        complete: every combination was looked at (else a random sample of
            :data:`CHECK_SPACE_CAP` was).
        estimated_valid: the space's distinct valid configurations: ``valid`` when complete,
            else estimated from the sample (equivalent combinations counted once).
        unusable: knob values that no valid configuration looked at keeps (for a sample, only
            values seen at least :data:`UNUSABLE_MIN_SEEN` times).
    """

    combinations: int
    looked_at: int
    valid: int
    complete: bool
    estimated_valid: int
    unusable: tuple[UnusableValue, ...] = ()


def _combinations(space: SearchSpace, seed: int) -> Any:
    """The value indices (in the order of ``space.knobs``) of every raw knob combination of a
    space within the cap, else of a seeded random sample of :data:`CHECK_SPACE_CAP` of them
    (uniform, with replacement): an integer array of one row per combination.

    The sample is NumPy's (``Generator.integers``, exact uniform draws): a space at the
    bounds draws 256 values per combination, 2.56 million in all, which Python's ``random``
    drew one call at a time (2 of its 5 CPU seconds)."""
    import itertools

    import numpy as np

    sizes = [len(space.knobs[n].values()) for n in space.knobs]
    if space.size() <= CHECK_SPACE_CAP:
        rows = list(itertools.product(*(range(n) for n in sizes)))
        return np.array(rows, dtype=np.int64).reshape(len(rows), len(sizes))
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.array(sizes, dtype=np.int64), size=(CHECK_SPACE_CAP, len(sizes)))


def _class_size(
    space: SearchSpace,
    cfg: dict[str, Any],
    key: Hashable,
    key_of: Callable[[dict[str, Any]], Hashable],
    canon: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> int:
    """How many raw combinations have the canonical configuration ``cfg`` (of key
    ``key_of(cfg)``): the product of the value counts of the knobs it ignores (a conditional
    knob that is inactive, a derived or inert one), each found by changing it alone."""
    size = 1
    for name in space.changeable_knobs():
        vals = space.knobs[name].values()
        have = cfg[name]
        other = next((v for v in vals if not (type(v) is type(have) and v == have)), None)
        if other is None:
            continue
        if key_of(canon({**cfg, name: other})) == key:
            size *= len(vals)
    return size


def _key_function(space: SearchSpace) -> Callable[[dict[str, Any]], Hashable]:
    """A key of a canonical configuration of ``space`` (its knobs' values, each with its
    type: 1, 1.0 and True are different configurations), equal for the same configuration
    as :func:`~dse.space.searchspace.params_key` and a few times cheaper (no JSON of every
    knob); a configuration with an unhashable value (a list) falls back to that key."""

    names = list(space.knobs)
    pick = operator.itemgetter(*names) if len(names) > 1 else (lambda c: (c[names[0]],))

    def key_of(cfg: dict[str, Any]) -> Hashable:
        vals = pick(cfg)
        key = (vals, tuple(map(type, vals)))
        try:
            hash(key)
        except TypeError:
            return params_key(cfg)
        return key

    return key_of


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _verdict(v: Violation) -> str:
    """How the space check names a broken rule: by name, and by its place when the space
    file wrote it (``space_constraint constraints[2]``)."""
    return f"{v.rule} {v.where}" if v.where else v.rule


def _same(a: Any, b: Any) -> bool:
    """The same value (of the same type: 1, 1.0 and True are different values)."""
    return type(a) is type(b) and a == b


def _unusable(
    space: SearchSpace,
    base: dict[str, Any],
    indices: Any,
    verdicts: list[str],
    kept: dict[int, tuple[bool, ...]],
    floor: int,
) -> tuple[UnusableValue, ...]:
    """The knob values that no valid configuration looked at keeps, seen at least ``floor``
    times, in the order the combinations first drew them (``indices``: each combination's
    value indices, :func:`_combinations`; ``verdicts``: its first rule broken, "" when valid;
    ``kept``: for the knobs the canonical form may replace, whether each combination kept
    the drawn value).

    Counted per knob over the columns of ``indices`` once the sample is checked (a count per
    column, not bookkeeping per knob per combination); a value is told apart by its type and
    value, so a choice list that repeats one counts it as one value."""
    from collections import Counter

    import numpy as np

    valid_rows = np.array([not v for v in verdicts], dtype=bool)
    found: list[tuple[int, int, UnusableValue]] = []
    for k, name in enumerate(space.knobs):
        vals = space.knobs[name].values()
        col = indices[:, k]
        if not _distinct(vals):  # equal values of one type are one value (its first index)
            first: dict[tuple[str, Any], int] = {}
            classes = [first.setdefault(_value_key(v), i) for i, v in enumerate(vals)]
            col = np.array(classes, dtype=np.int64)[col]
        counts = np.bincount(col, minlength=len(vals))
        kept_col = None if k not in kept else np.array(kept[k], dtype=bool)
        in_valid = np.zeros(len(vals), dtype=bool)
        in_valid[col[valid_rows if kept_col is None else valid_rows & kept_col]] = True
        for c in np.nonzero((counts >= floor) & ~in_valid)[0].tolist():
            if _value_key(vals[c]) == _value_key(base[name]):
                continue
            members = np.nonzero(col == c)[0]
            collapsed = 0 if kept_col is None else int((~kept_col[members]).sum())
            taken = members if kept_col is None else members[kept_col[members]]
            broken = Counter(verdicts[j] for j in taken.tolist())
            found.append(
                (
                    int(members[0]),
                    k,
                    UnusableValue(
                        name, vals[c], int(counts[c]), collapsed, tuple(broken.most_common())
                    ),
                )
            )
    found.sort(key=lambda t: (t[0], t[1]))
    return tuple(u for _, _, u in found)


def _distinct(vals: list[Any]) -> bool:
    """Whether no two of a domain's values are the same value (all of one type, none equal:
    a check in C, not a key per value)."""
    try:
        return len(set(map(type, vals))) == 1 and len(set(vals)) == len(vals)
    except TypeError:  # an unhashable value (a list)
        return False


def _value_key(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value if _hashable(value) else repr(value))


def check_space(space: SearchSpace, source: str, *, count: bool = True) -> SpaceCheck:
    """Refuse a space whose baseline breaks a rule, or with a constraint that cannot be
    evaluated on one of the configurations looked at; count its valid configurations.

    Looks at every knob combination of a space of up to :data:`CHECK_SPACE_CAP`, else at a
    seeded uniform random sample of that many (so its time is bounded whatever the space, and
    the fraction it finds valid is the space's, not that of the first combinations in
    enumeration order). With ``count=False`` only the baseline is checked (``dse start``
    needs only the refusal)."""
    from fractions import Fraction

    feats = space.resources.features if isinstance(space.resources.features, list) else None
    problems = check(space, space.baseline(), feats)
    if problems:
        raise SpaceError(
            f"{source}: the baseline configuration is invalid: "
            + "; ".join(str(v) for v in problems)
        )
    total = space.size()
    complete = total <= CHECK_SPACE_CAP
    if not count:
        return SpaceCheck(total, 0, 0, complete, 0)
    canon = space.canonicalizer()
    key_of = _key_function(space)
    verdicts: dict[Hashable, str] = {}  # configuration key -> "" (valid) or first rule broken
    n_raw = n_raw_valid = inv_n = 0
    inv_sum = 0.0
    inv_class: dict[Hashable, float] = {}  # configuration key -> 1 / equivalent combinations
    names = list(space.knobs)
    # the knobs whose value the canonical form may replace (a condition, a derivation, an
    # inert layout): each sample records, for these only, whether it kept the drawn value
    settable = set(space.changeable_knobs())
    changeable = [k for k, n in enumerate(names) if n in settable]
    row_verdicts: list[str] = []
    row_kept: list[tuple[bool, ...]] = []

    # the baseline passed above: a valid configuration, whether or not a sample draws it
    base = canon(space.baseline())
    verdicts[key_of(base)] = ""
    values = [space.knobs[n].values() for n in names]
    pick = list.__getitem__
    indices = _combinations(space, 0)
    for row in indices:
        raw = dict(zip(names, map(pick, values, row.tolist()), strict=True))
        n_raw += 1
        cfg = canon(raw)
        key = key_of(cfg)
        verdict = verdicts.get(key)
        if verdict is None:
            problems = check(space, cfg, feats)
            for v in problems:
                if v.rule == "space_constraint_error":
                    raise SpaceError(f"{source}: {v.where or 'constraints'}: {v}")
            verdict = _verdict(problems[0]) if problems else ""
            verdicts[key] = verdict
            if not verdict and not complete and len(inv_class) < _CLASS_SAMPLE:
                inv_class[key] = 1.0 / _class_size(space, cfg, key, key_of, canon)
        if not verdict:
            n_raw_valid += 1
            if key in inv_class:  # every sampled combination counts (a class drawn twice too)
                inv_sum += inv_class[key]
                inv_n += 1
        row_verdicts.append(verdict)
        if changeable:
            row_kept.append(tuple(_same(cfg[names[k]], raw[names[k]]) for k in changeable))
    looked = len(verdicts)
    n_valid = sum(1 for v in verdicts.values() if not v)
    if complete:
        estimate = n_valid
    else:
        mean_inv = inv_sum / inv_n if inv_n else 0.0
        # exact: a space at the bounds has up to 4096**256 combinations, past any float
        share = Fraction(n_raw_valid, n_raw) * Fraction(mean_inv)
        estimate = max(n_valid, round(total * share))
    floor = 1 if complete else UNUSABLE_MIN_SEEN
    kept_cols = dict(zip(changeable, zip(*row_kept, strict=True), strict=True)) if row_kept else {}
    unusable = _unusable(space, base, indices, row_verdicts, kept_cols, floor)
    return SpaceCheck(total, looked, n_valid, complete, estimate, unusable)
