"""Resolve a configuration (knob values) into the numbers the cost model needs.

A missing knob takes the catalog default (:data:`dse.space.knobs.KNOBS`). Nothing here imports
torch; all sizes are plain integers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dse.space.knobs import get_knob, knob_value, modules_list
from dse.space.layout import Layout
from dse.space.searchspace import LoraSpec, ModelSpec, Resources, Semantics

__all__ = ["CostLayout", "resolve", "knob", "DTYPE_BYTES", "padded_vocab"]

#: Bytes per element of the dtype names used by the optimizer knobs.
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: Megatron pads the vocabulary to a multiple of this times TP (make_vocab_size_divisible_by).
VOCAB_DIVISIBLE_BY = 128

#: attention_backend values that run on Transformer Engine (and so bring its fused Adam).
TE_BACKENDS = ("te", "flash", "fused")


def knob(params: Mapping[str, Any], name: str) -> Any:
    """The value of knob ``name`` in ``params``, or its catalog default when absent/None.

    Raises :class:`dse.core.exceptions.UnknownKnobError` for a name the catalog does not know.
    """
    get_knob(name)
    return knob_value(params, name)


def padded_vocab(vocab_size: int, tp: int) -> int:
    """Megatron's padded vocabulary: a multiple of ``128 * TP``."""
    mult = VOCAB_DIVISIBLE_BY * tp
    return int(math.ceil(vocab_size / mult) * mult)


@dataclass(frozen=True)
class CostLayout:
    """The core :class:`~dse.space.layout.Layout` plus the dtypes and flags the models use.

    The parallel sizes are the core layout's; an invalid layout (the world does not
    divide) is still estimated, with DP, expert DP and the micro-batch count floored at 1:
    validity is the rules' job, not the cost model's.
    """

    parallel: Layout
    sp: bool
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
    recompute_modules: tuple[str, ...] = ("core_attn",)
    fp8: bool = False
    fp8_param: bool = False
    flex_backend: str | None = None
    #: optimizer states Transformer Engine's FusedAdam copies to fp32 for the update
    #: (precision-aware optimizer; see memory._optimizer_temporaries)
    unscaled_states: int = 0
    #: Mamba layers on the memory-efficient path (one fused kernel, conv1d recomputed)
    mamba_mem_eff: bool = True
    #: layers built without Transformer Engine (Megatron-Core's local spec: dse's built-in
    #: trainer on a node without TE); a TE attention backend or a declared TE means TE layers
    local_spec: bool = False
    #: PEFT held fixed for the study (``semantics.peft``): a frozen base, adapters train
    peft: LoraSpec | None = None

    def recomputes(self, module: str) -> bool:
        """True when selective recompute covers ``module`` (``core_attn``, ``moe`` ...)."""
        return self.recompute == "selective" and module in self.recompute_modules

    @property
    def world(self) -> int:
        return self.parallel.world

    @property
    def tp(self) -> int:
        return self.parallel.tp

    @property
    def pp(self) -> int:
        return self.parallel.pp

    @property
    def vpp(self) -> int:
        """Model chunks per pipeline rank (1 without interleaving)."""
        return self.parallel.model_chunks

    @property
    def cp(self) -> int:
        return self.parallel.cp

    @property
    def ep(self) -> int:
        return self.parallel.ep

    @property
    def etp(self) -> int:
        return self.parallel.etp

    @property
    def dp(self) -> int:
        return max(1, self.parallel.dp)

    @property
    def edp(self) -> int:
        return max(1, self.parallel.edp)

    @property
    def mbs(self) -> int:
        return self.parallel.mbs

    @property
    def num_microbatches(self) -> int:
        return max(1, self.parallel.gbs // max(1, self.mbs * self.dp))

    @property
    def te(self) -> bool:
        """True when the model runs on Transformer Engine modules."""
        return self.attention in TE_BACKENDS


def resolve(
    model: ModelSpec, semantics: Semantics, resources: Resources, params: Mapping[str, Any]
) -> CostLayout:
    """Resolve knob values (catalog defaults for the missing ones) into a :class:`CostLayout`.

    Unknown knob names raise :class:`dse.core.exceptions.UnknownKnobError`.
    """
    for name in params:
        get_knob(name)
    par = Layout.resolve(model, semantics, resources, params)
    tp = par.tp
    sp = bool(knob(params, "sequence_parallel")) and tp > 1
    attention = str(knob(params, "attention_backend"))
    precision = semantics.precision
    param_bytes = 4 if precision == "fp32" else 2
    precision_aware = bool(knob(params, "use_precision_aware_optimizer"))
    grad_fp32 = bool(knob(params, "grad_reduce_in_fp32"))
    # Megatron-Core DDP's gradient buffer: fp32 with grad_reduce_in_fp32, else the parameter
    # dtype (distributed_data_parallel.py: grad_dtype = torch.float if grad_reduce_in_fp32
    # else param.dtype); the optimizer copies its (shard of the) grads to fp32 at the step.
    grad_bytes = 4 if grad_fp32 else param_bytes
    if precision_aware:
        master = DTYPE_BYTES[str(knob(params, "main_params_dtype"))]
        exp_avg = DTYPE_BYTES[str(knob(params, "exp_avg_dtype"))]
        exp_avg_sq = DTYPE_BYTES[str(knob(params, "exp_avg_sq_dtype"))]
        if precision == "bf16" and bool(knob(params, "store_param_remainders")):
            # the distributed optimizer keeps the master weights as int16 remainders of the
            # bf16 parameters (distrib_optimizer.py, use_precision_aware_optimizer)
            master = 2
    else:
        master, exp_avg, exp_avg_sq = 4, 4, 4
    unscaled = _unscaled_states(params, precision_aware, precision)
    if precision == "fp32":
        master = 0  # FP32Optimizer: the parameters are the master weights
    features = resources.features
    declared = set(features) if isinstance(features, list) else set()
    fused_adam = attention in TE_BACKENDS or bool(declared & {"apex", "transformer_engine"})
    return CostLayout(
        parallel=par,
        sp=sp,
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
        gpus_per_node=resources.gpus_per_node or par.world,
        recompute_modules=tuple(modules_list(knob(params, "recompute_modules")) or ["core_attn"]),
        fp8=knob(params, "fp8") is not None,
        fp8_param=bool(knob(params, "fp8_param")) and knob(params, "fp8") is not None,
        flex_backend=(
            str(knob(params, "moe_flex_dispatcher_backend"))
            if knob(params, "moe_token_dispatcher_type") == "flex"
            else None
        ),
        unscaled_states=unscaled,
        mamba_mem_eff=bool(knob(params, "use_mamba_mem_eff_path")),
        local_spec=not (attention in TE_BACKENDS or "transformer_engine" in declared),
        peft=getattr(semantics, "peft", None),
    )


def _unscaled_states(params: Mapping[str, Any], precision_aware: bool, precision: str) -> int:
    """How many optimizer states TE's FusedAdam turns into fp32 copies at each step.

    ``FusedAdam.step`` (transformer_engine/pytorch/optimizers/fused_adam.py) calls
    ``get_unscaled_state`` for every state that is not fp32 and keeps the fp32 copies of a
    whole parameter group until the group's update is written back: the fp16 master weights
    always; the Adam moments unless both are bf16 (since TE 2.14 the kernel reads and writes
    bf16 moments itself, "Fuse scaling and unscaling of bf16 momentums into kernels").
    Int16 parameter remainders are used as they are.
    """
    if not precision_aware:
        return 0
    n = 0
    master = str(knob(params, "main_params_dtype"))
    remainders = precision == "bf16" and bool(knob(params, "store_param_remainders"))
    if master != "fp32" and not remainders:
        n += 1
    moments = [str(knob(params, "exp_avg_dtype")), str(knob(params, "exp_avg_sq_dtype"))]
    if moments != ["bf16", "bf16"]:
        n += sum(1 for d in moments if d != "fp32")
    return n
