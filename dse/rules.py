"""Validity rules: reject a configuration before launch, naming the rule and its values.

Each rule mirrors a check that Megatron-Core (or the batch arithmetic, or the trial
environment) would make at build time; the source is given in the rule's docstring.

A rule is written once, here, against a :class:`RuleContext` and the configuration's
:class:`~dse.layout.Layout`. It runs before launch (the proposer, ``dse validate``,
``dse estimate``) on the space, and again in the trial process on a :class:`Problem`
built from the trial spec (``dse.workloads.megatron._plan.make_plan``), which reports the
first violation as an ``invalid`` failure with the same ``str(violation)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dse.bounds import MAX_SPACE_COMBINATIONS, MAX_SPACE_CONFIGS
from dse.exceptions import ConstraintEvalError, SpaceError
from dse.knobs import KNOBS, get_knob
from dse.layout import Layout
from dse.space import ModelSpec, Resources, SearchSpace, Semantics

__all__ = [
    "Violation",
    "Layout",
    "Problem",
    "RuleContext",
    "RULES",
    "check",
    "check_space",
    "layout",
    "first_violation",
]


@dataclass(frozen=True)
class Violation:
    """A rule a configuration breaks: the rule's name, a message and the values involved."""

    rule: str
    message: str
    values: dict[str, Any]

    def __str__(self) -> str:
        vals = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"{self.rule}: {self.message} ({vals})"


class RuleContext(Protocol):
    """What a rule may read besides the configuration: a :class:`~dse.space.SearchSpace`
    before launch, a :class:`Problem` in the trial process."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def semantics(self) -> Semantics: ...
    @property
    def resources(self) -> Resources: ...
    def full_params(self, params: Mapping[str, Any]) -> dict[str, Any]: ...
    def constraint_values(self, params: Mapping[str, Any]) -> list[tuple[str, bool]]: ...


@dataclass(frozen=True)
class Problem:
    """A rule context without a space file: the trial process checks a trial spec's
    configuration with it (its params are already complete; a space's own constraints
    were checked before launch)."""

    model: ModelSpec
    semantics: Semantics
    resources: Resources

    def full_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return dict(params)

    def constraint_values(self, params: Mapping[str, Any]) -> list[tuple[str, bool]]:
        return []


def _get(params: Mapping[str, Any], name: str) -> Any:
    return params[name] if name in params else KNOBS[name].default


def layout(space: RuleContext, params: Mapping[str, Any]) -> Layout:
    """The :class:`~dse.layout.Layout` of ``params`` (fixed knobs of the space included)."""
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
    """num_layers % PP == 0 (TransformerConfig pipeline split), and % (PP*VPP) with VPP."""
    n = s.model.num_layers
    if n % L.pp:
        return _v("layers_pp", "num_layers must be divisible by PP", num_layers=n, pp=L.pp)
    if L.vpp is not None:
        if L.pp < 2:
            return _v("vpp_needs_pp", "virtual pipeline needs PP > 1", pp=L.pp, vpp=L.vpp)
        if (n // L.pp) % L.vpp:
            return _v(
                "layers_vpp",
                "layers per PP stage must be divisible by VPP",
                num_layers=n,
                pp=L.pp,
                vpp=L.vpp,
            )
        if L.num_microbatches and L.num_microbatches % L.pp:
            return _v(
                "vpp_microbatches",
                "interleaved 1F1B needs num_microbatches divisible by PP",
                num_microbatches=L.num_microbatches,
                pp=L.pp,
            )
    return None


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


@_rule
def r_moe_knobs(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """MoE-only knobs on a dense model; dispatcher combinations (TransformerConfig)."""
    fp = s.full_params(p)
    moe = s.model.num_moe_experts is not None
    for k in (
        "moe_grouped_gemm",
        "moe_permute_fusion",
        "moe_router_fusion",
        "moe_shared_expert_overlap",
    ):
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


@_rule
def r_features(s: RuleContext, p: dict, L: Layout, f: set[str] | None) -> Violation | None:
    """A knob value that needs software absent where trials run (TE, apex, DeepEP ...)."""
    if f is None:
        return None
    fp = s.full_params(p)
    for name, value in fp.items():
        if name == "moe_flex_dispatcher_backend" and _get(fp, "moe_token_dispatcher_type") != (
            "flex"
        ):
            continue  # only read by the flex dispatcher
        if name == "cross_entropy_fusion_impl" and not _get(fp, "cross_entropy_loss_fusion"):
            continue  # only read when the loss fusion is on
        for feat in get_knob(name).requires(value):
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
        return _v(
            "space_constraint_error",
            str(e),
            **{k: v for k, v in s.full_params(p).items() if k in e.expr},
        )
    for expr, ok in values:
        if not ok:
            return _v(
                "space_constraint",
                f"constraint {expr!r} is false",
                **{k: v for k, v in s.full_params(p).items() if k in expr},
            )
    return None


def check(
    space: RuleContext, params: Mapping[str, Any], features: Iterable[str] | None = None
) -> list[Violation]:
    """Every rule the configuration breaks (empty: valid).

    ``features`` is the set of optional software present where trials run; None means
    unknown (feature rules are then left to the trial process).
    """
    p = dict(params)
    L = layout(space, p)
    fs = None if features is None else set(features)
    out = []
    for fn in RULES.values():
        v = fn(space, p, L, fs)
        if v is not None:
            out.append(v)
    return out


def first_violation(
    space: RuleContext, params: Mapping[str, Any], features: Iterable[str] | None = None
) -> Violation | None:
    vs = check(space, params, features)
    return vs[0] if vs else None


#: Configurations :func:`check_space` enumerates at most.
CHECK_SPACE_CAP = MAX_SPACE_CONFIGS


def check_space(space: SearchSpace, source: str, *, count: bool = True) -> tuple[int, int]:
    """Refuse a space whose baseline breaks a rule, or with a constraint that cannot be
    evaluated on one of the configurations looked at.

    Looks at the first ``MAX_SPACE_COMBINATIONS`` raw knob combinations and at most
    ``MAX_SPACE_CONFIGS`` distinct configurations among them, so its time is bounded
    whatever the space. Returns (configurations looked at, configurations that pass the
    rules); with ``count=False`` none are looked at (``(0, 0)``: ``dse start`` needs only the
    refusal)."""
    feats = space.resources.features if isinstance(space.resources.features, list) else None
    problems = check(space, space.baseline(), feats)
    if problems:
        raise SpaceError(
            f"{source}: the baseline configuration is invalid: "
            + "; ".join(str(v) for v in problems)
        )
    n_total, n_valid = 0, 0
    if not count:
        return n_total, n_valid
    for cfg in space.iter_configs(max_combinations=MAX_SPACE_COMBINATIONS):
        n_total += 1
        problems = check(space, cfg, feats)
        if not problems:
            n_valid += 1
        for v in problems:
            if v.rule == "space_constraint_error":
                raise SpaceError(f"{source}: constraints: {v}")
        if n_total >= MAX_SPACE_CONFIGS:
            break
    return n_total, n_valid
