"""Resolve a configuration (knob values) into the numbers the cost model needs.

A missing knob takes the catalog default (:data:`dse.knobs.KNOBS`). Nothing here imports
torch; all sizes are plain integers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dse.knobs import KNOBS, get_knob
from dse.space import ModelSpec, Resources, Semantics

__all__ = ["Layout", "resolve", "knob", "DTYPE_BYTES", "padded_vocab"]

#: Bytes per element of the dtype names used by the optimizer knobs.
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: Megatron pads the vocabulary to a multiple of this times TP (make_vocab_size_divisible_by).
VOCAB_DIVISIBLE_BY = 128

#: attention_backend values that run on Transformer Engine (and so bring its fused Adam).
TE_BACKENDS = ("te", "flash", "fused")


def knob(params: Mapping[str, Any], name: str) -> Any:
    """The value of knob ``name`` in ``params``, or its catalog default when absent/None.

    Raises :class:`dse.exceptions.UnknownKnobError` for a name the catalog does not know.
    """
    get_knob(name)
    value = params.get(name)
    return KNOBS[name].default if value is None else value


def padded_vocab(vocab_size: int, tp: int) -> int:
    """Megatron's padded vocabulary: a multiple of ``128 * TP``."""
    mult = VOCAB_DIVISIBLE_BY * tp
    return int(math.ceil(vocab_size / mult) * mult)


@dataclass(frozen=True)
class Layout:
    """Everything derived from (model, semantics, resources, params) that the models use."""

    world: int
    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    etp: int
    dp: int
    edp: int
    sp: bool
    mbs: int
    num_microbatches: int
    recompute: str
    attention: str
    distributed_optimizer: bool
    precision_aware: bool
    param_bytes: int
    act_bytes: int
    grad_bytes: int
    master_bytes: int
    exp_avg_bytes: int
    exp_avg_sq_bytes: int
    bias_activation_fusion: bool
    cross_entropy_fusion: bool
    cross_entropy_impl: str
    gradient_accumulation_fusion: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: bool
    moe_dispatcher: str
    fused_adam: bool
    gpus_per_node: int

    @property
    def te(self) -> bool:
        """True when the model runs on Transformer Engine modules."""
        return self.attention in TE_BACKENDS


def _int(params: Mapping[str, Any], name: str, fallback: int) -> int:
    v = knob(params, name)
    return fallback if v is None else int(v)


def resolve(
    model: ModelSpec, semantics: Semantics, resources: Resources, params: Mapping[str, Any]
) -> Layout:
    """Resolve knob values (catalog defaults for the missing ones) into a :class:`Layout`.

    Unknown knob names raise :class:`dse.exceptions.UnknownKnobError`. Layouts that do not
    divide the world evenly are still estimated (sizes are floored at 1); validity is the
    rules' job, not the cost model's.
    """
    for name in params:
        get_knob(name)
    world = resources.world_size
    tp = _int(params, "tensor_model_parallel_size", 1)
    pp = _int(params, "pipeline_model_parallel_size", 1)
    vpp = _int(params, "virtual_pipeline_model_parallel_size", 1) if pp > 1 else 1
    cp = _int(params, "context_parallel_size", 1)
    moe = model.num_moe_experts is not None
    ep = _int(params, "expert_model_parallel_size", 1) if moe else 1
    etp = _int(params, "expert_tensor_parallel_size", tp) if moe else tp
    dp = max(1, world // max(1, tp * pp * cp))
    edp = max(1, world // max(1, etp * ep * pp))
    mbs = _int(params, "micro_batch_size", 1)
    m = max(1, semantics.global_batch_size // max(1, mbs * dp))
    sp = bool(knob(params, "sequence_parallel")) and tp > 1
    attention = str(knob(params, "attention_backend"))
    precision = semantics.precision
    param_bytes = 4 if precision == "fp32" else 2
    precision_aware = bool(knob(params, "use_precision_aware_optimizer"))
    main_grads = str(knob(params, "main_grads_dtype"))
    grad_fp32 = bool(knob(params, "grad_reduce_in_fp32"))
    if precision == "fp32":
        grad_bytes = 4
    elif grad_fp32:
        grad_bytes = 4
    else:
        # Megatron-LM's rule for 16-bit training: gradients accumulate and reduce in the
        # main-grad dtype (fp32 unless the precision-aware optimizer keeps bf16 main grads).
        grad_bytes = DTYPE_BYTES[main_grads]
    if precision_aware:
        master = DTYPE_BYTES[str(knob(params, "main_params_dtype"))]
        exp_avg = DTYPE_BYTES[str(knob(params, "exp_avg_dtype"))]
        exp_avg_sq = DTYPE_BYTES[str(knob(params, "exp_avg_sq_dtype"))]
    else:
        master, exp_avg, exp_avg_sq = 4, 4, 4
    if precision == "fp32":
        master = 0  # FP32Optimizer: the parameters are the master weights
    features = resources.features
    declared = set(features) if isinstance(features, list) else set()
    fused_adam = attention in TE_BACKENDS or bool(declared & {"apex", "transformer_engine"})
    return Layout(
        world=world,
        tp=tp,
        pp=pp,
        vpp=max(1, vpp),
        cp=cp,
        ep=ep,
        etp=etp,
        dp=dp,
        edp=edp,
        sp=sp,
        mbs=mbs,
        num_microbatches=m,
        recompute=str(knob(params, "recompute")),
        attention=attention,
        distributed_optimizer=bool(knob(params, "use_distributed_optimizer")),
        precision_aware=precision_aware,
        param_bytes=param_bytes,
        act_bytes=param_bytes,
        grad_bytes=grad_bytes,
        master_bytes=master,
        exp_avg_bytes=exp_avg,
        exp_avg_sq_bytes=exp_avg_sq,
        bias_activation_fusion=bool(knob(params, "bias_activation_fusion")),
        cross_entropy_fusion=bool(knob(params, "cross_entropy_loss_fusion")),
        cross_entropy_impl=str(knob(params, "cross_entropy_fusion_impl")),
        gradient_accumulation_fusion=bool(knob(params, "gradient_accumulation_fusion")),
        overlap_grad_reduce=bool(knob(params, "overlap_grad_reduce")),
        overlap_param_gather=bool(knob(params, "overlap_param_gather")),
        tp_comm_overlap=bool(knob(params, "tp_comm_overlap")),
        moe_dispatcher=str(knob(params, "moe_token_dispatcher_type")),
        fused_adam=fused_adam,
        gpus_per_node=resources.gpus_per_node or world,
    )
