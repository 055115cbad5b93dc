"""Per-GPU peak memory of a Megatron-Core training step, from first principles.

The estimate walks the tensors a step keeps alive and takes the largest of three moments
of the step, on the first and on the last pipeline stage (the two extremes):

``backward``
    all activations saved by the micro-batches in flight, plus the working set of the
    backward pass of one layer (for unfused attention the three fp32 ``s x s`` gradient
    buffers of the softmax backward; for recompute, the recomputed layer);
``forward_end``
    (last stage) the saved activations plus the logits and the cross-entropy buffers;
``optimizer_step``
    no activations, plus the optimizer's temporaries.

Static memory (weights, main gradients, optimizer state) is counted exactly from the
parameter count and the dtypes. Activations are counted per token and per layer from the
tensors autograd saves in Megatron-Core's local and Transformer-Engine layers: the norm
inputs and outputs, the query/key/value tensors that the attention keeps (with the GQA
expansion of the unfused path), the ``s x s`` softmax output (fp32 by default) and
probabilities of unfused attention, the MLP's fc1 output and activation outputs (an unfused
SwiGLU keeps three extra ``ffn``-wide tensors), and for MoE the routed copies of each token.
The figures were checked against ``torch.cuda.max_memory_allocated`` of a Megatron-Core
0.16 local-spec GPT on an H200 (within 1% for none/selective/full recompute, unfused and
SDPA attention).

Sizes are per rank: TP shards heads and FFN columns (and, with sequence parallelism, the
norm/residual region), CP shards the sequence, PP keeps ``ceil(L/PP)`` layers and the
1F1B in-flight micro-batches, the distributed optimizer shards the optimizer state over
DP x CP (experts over the expert-data-parallel group).

Free coefficients (:class:`Coefficients`) scale what physics cannot pin exactly: an
activation scale, a static offset, the caching allocator's fragmentation and the memory
outside PyTorch's allocator (CUDA context, NCCL and library workspaces).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from dse.model.costmodel._layout import CostLayout, padded_vocab, resolve
from dse.model.costmodel._params import (
    StageParams,
    layers_on_stage,
    mlp_factor,
    stage_layer_ids,
    stage_layer_kinds,
    stage_params,
)
from dse.space.searchspace import ModelSpec, Resources, Semantics

__all__ = [
    "GIB",
    "Coefficients",
    "MemoryEstimate",
    "ActivationBreakdown",
    "estimate_memory",
    "inflight_layer_microbatches",
]

GIB = float(1 << 30)

#: Megatron's local attention computes the softmax in fp32 (attention_softmax_in_fp32=True).
SOFTMAX_BYTES = 4

#: NCCL communicators' buffers when a trial spans several GPUs (GiB per GPU).
NCCL_GIB = 0.5


@dataclass(frozen=True)
class Coefficients:
    """The free coefficients of the memory model, with physics-based defaults.

    Attributes:
        activation_scale: multiplies every activation-dependent byte (1.0: the tensors
            counted are exactly the ones allocated).
        static_offset_gib: allocated memory the model does not know about (0 by default).
        fragmentation: caching-allocator slack (reserved but unusable) as a fraction of the
            activation-dependent peak; block splitting under a churn of differently sized
            tensors typically costs 5-20%.
        context_gib: device memory outside PyTorch's allocator per GPU (CUDA context,
            cuBLAS/cuDNN workspaces), about 0.5-0.8 GiB on Hopper.
        elastic_gib: device memory a run is seen to hold beyond its need while the GPU has
            room, and gives back under pressure (the caching allocator's reserve of freed
            blocks, which it releases and retries before an out-of-memory error). It shows in
            device-level peaks (:meth:`MemoryEstimate.device_peak_gib`, never above the
            capacity) and never decides whether a configuration fits. 0 unless calibrated
            on published device-level peaks.
    """

    activation_scale: float = 1.0
    static_offset_gib: float = 0.0
    fragmentation: float = 0.10
    context_gib: float = 0.6
    elastic_gib: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Coefficients:
        known = {k: float(v) for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class ActivationBreakdown:
    """Bytes one layer saves per micro-batch on one rank, by part (no recompute)."""

    norms: float
    attention: float
    scores: float
    mlp: float
    masks: float

    @property
    def total(self) -> float:
        return self.norms + self.attention + self.scores + self.mlp + self.masks


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted per-GPU peak memory, term by term (GiB).

    ``allocated_gib`` compares with ``torch.cuda.max_memory_allocated`` (what trials report
    as ``peak_mem_gib``); ``total_gib`` adds what the device needs beyond that (allocator
    fragmentation and the CUDA context) and is what must fit in the GPU's memory.

    Attributes:
        weights_gib: model weights on this rank.
        gradients_gib: main-gradient buffer (main-grad dtype).
        optimizer_gib: master weights and Adam moments (sharded by the distributed optimizer).
        activations_gib: activations saved by the in-flight micro-batches at the peak,
            without the ``s x s`` attention terms.
        attention_scores_gib: the ``s x s`` terms of unfused attention alive at the peak
            (softmax output, probabilities, causal masks, the persistent score buffer).
        logits_gib: logits and cross-entropy buffers alive at the peak.
        transient_gib: working set of the moment of the peak (backward of one layer,
            recomputation, or the optimizer's temporaries).
        static_offset_gib: calibrated offset (0 uncalibrated).
        fragmentation_gib: caching-allocator slack.
        context_gib: memory outside PyTorch's allocator (CUDA context, NCCL buffers).
        peak_phase: ``backward``, ``forward_end`` or ``optimizer_step``.
        peak_stage: pipeline stage of the peak (0 = first).
        details: other figures (parameter counts, in-flight micro-batches, per-layer bytes).
    """

    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    attention_scores_gib: float
    logits_gib: float
    transient_gib: float
    static_offset_gib: float
    fragmentation_gib: float
    context_gib: float
    peak_phase: str
    peak_stage: int
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    buffers_gib: float = 0.0  # communication buffers allocated once (flex dispatcher)
    elastic_gib: float = 0.0  # reclaimable reserve seen in device-level peaks (coefficient)

    @property
    def static_gib(self) -> float:
        """Weights + gradients + optimizer state."""
        return self.weights_gib + self.gradients_gib + self.optimizer_gib

    @property
    def activation_dependent_gib(self) -> float:
        """Everything that scales with the activation coefficient."""
        return (
            self.activations_gib + self.attention_scores_gib + self.logits_gib + self.transient_gib
        )

    @property
    def allocated_gib(self) -> float:
        """Peak allocated by PyTorch (compare with ``torch.cuda.max_memory_allocated``)."""
        return (
            self.static_gib
            + self.activation_dependent_gib
            + self.static_offset_gib
            + self.buffers_gib
        )

    @property
    def total_gib(self) -> float:
        """Peak device memory: allocated + fragmentation + context. Must fit in the GPU."""
        return self.allocated_gib + self.fragmentation_gib + self.context_gib

    def device_peak_gib(self, capacity_gib: float | None = None) -> float:
        """The device-level peak a monitor would show: the need (:attr:`total_gib`) plus the
        elastic reserve, at most the capacity (the reserve is what the GPU has room for)."""
        peak = self.total_gib + max(0.0, self.elastic_gib)
        if capacity_gib is not None:
            peak = min(peak, max(capacity_gib, self.total_gib))
        return peak

    def as_dict(self) -> dict[str, Any]:
        """Every term plus ``allocated_gib`` and ``total_gib`` (JSON-ready)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            out[name] = round(v, 4) if isinstance(v, float) else v
        out["allocated_gib"] = round(self.allocated_gib, 4)
        out["total_gib"] = round(self.total_gib, 4)
        return out


# --- pipeline in-flight micro-batches --------------------------------------------------------


def inflight_layer_microbatches(layout: CostLayout, layers: int, stage: int) -> tuple[float, int]:
    """(layer x micro-batch activation sets, micro-batches) alive on ``stage`` under 1F1B.

    Non-interleaved 1F1B: stage ``r`` runs ``PP - r`` forwards before its first backward,
    so the first stage holds ``min(PP, m)`` micro-batches of all its layers. Interleaved
    (VPP = v): rank ``r`` warms up ``2 (PP - r - 1) + (v - 1) PP`` model chunks and holds one
    more, each chunk having ``layers / v`` layers; the first stage's total is about
    ``L/PP * PP * (1 + (PP - 1) / (PP v))`` layer-micro-batches, Megatron's interleaving
    penalty.
    """
    m, pp, v = layout.num_microbatches, layout.pp, layout.vpp
    if pp == 1:
        return float(layers), 1
    if v <= 1:
        mb = min(m, pp - stage)
        return float(layers * mb), mb
    chunks = min(m * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
    return layers / v * chunks, int(math.ceil(chunks / v))


# --- per-layer activation bytes ------------------------------------------------------------


@dataclass(frozen=True)
class _Shapes:
    a: int  # activation bytes
    tokens: float  # tokens of one micro-batch on this rank (b * s / CP)
    tokens_r: float  # tokens of the norm/residual region (/TP with sequence parallelism)
    h: int
    q_r: float  # query width on this rank
    kv_r: float  # key (= value) width on this rank
    heads_r: float
    rep: float  # query heads per KV group
    f_r: float  # FFN width on this rank
    scores: float  # s x s elements of one layer per micro-batch (unfused attention)
    mask: float  # causal-mask bytes of one layer
    vocab_r: float  # padded vocabulary on this rank


def _shapes(model: ModelSpec, semantics: Semantics, layout: CostLayout) -> _Shapes:
    tp, cp = layout.tp, layout.cp
    s = semantics.seq_length
    tokens = layout.mbs * s / cp
    hd = model.head_dim
    heads_r = model.num_attention_heads / tp
    kv_r = hd * max(1.0, model.query_groups / tp)
    return _Shapes(
        a=layout.act_bytes,
        tokens=tokens,
        tokens_r=tokens / tp if layout.sp else tokens,
        h=model.hidden_size,
        q_r=heads_r * hd,
        kv_r=kv_r,
        heads_r=heads_r,
        rep=model.num_attention_heads / model.query_groups,
        f_r=model.ffn_hidden_size / tp,
        scores=layout.mbs * heads_r * (s / cp) * s,
        mask=(s / cp) * s,
        vocab_r=padded_vocab(model.vocab_size, tp) / tp,
    )


def _qkv_kept(model: ModelSpec, sh: _Shapes) -> float:
    """Bytes per token of q/k/v kept by a fused attention kernel (or a checkpoint).

    RoPE makes new q and k tensors; v stays a view of the fused QKV projection output, which
    keeps that whole output alive.
    """
    qkv_out = sh.a * (sh.q_r + 2 * sh.kv_r)
    rope = sh.a * (sh.q_r + sh.kv_r) if model.position_embedding_type == "rope" else 0.0
    return qkv_out + rope


def _act_extra(model: ModelSpec, layout: CostLayout, a: int, width: float) -> float:
    """Bytes per token the activation function keeps beyond its input (fc1's output)."""
    if model.gated_linear_unit:
        # fused SwiGLU keeps its input and the output (fc2's input); unfused keeps
        # silu(x), (x_linear + 0) and the product as separate tensors.
        return a * width * (1 if layout.bias_activation_fusion else 3)
    if model.activation == "squared_relu":
        return 2 * a * width
    return a * width


def layer_activations(
    model: ModelSpec, semantics: Semantics, layout: CostLayout, recompute: str | None = None
) -> ActivationBreakdown:
    """Bytes one layer saves for one micro-batch on one rank under ``recompute``."""
    rc = layout.recompute if recompute is None else recompute
    sh = _shapes(model, semantics, layout)
    a, t, tr = sh.a, sh.tokens, sh.tokens_r
    if rc == "full":
        # uniform method, one layer per checkpoint: only the layer's input is kept.
        return ActivationBreakdown(a * sh.h * tr, 0.0, 0.0, 0.0, 0.0)
    norms = 4 * a * sh.h * tr  # two norms: input and output (the next linear's input)
    # hidden dropout: the two bias-dropout-adds keep a bool mask of the residual stream,
    # which TP shards only with sequence parallelism (like the norms)
    norms += _hidden_dropout_mask(model, tr, sh.h) * 2
    scores = masks = 0.0
    if model.multi_latent_attention:
        attn = _mla_saved(model, layout, sh)
        if layout.attention == "unfused" and rc != "selective":
            scores = (SOFTMAX_BYTES + a + _attn_dropout_mask(model)) * sh.scores
            masks = sh.mask
    elif rc == "selective":
        attn = (_qkv_kept(model, sh) + a * sh.q_r) * t  # checkpoint inputs + its output
    elif layout.attention == "unfused":
        if sh.rep > 1:
            qkv = 3 * a * sh.q_r  # q (post-RoPE), K and V expanded to every query head
            if model.position_embedding_type != "rope":
                qkv += a * (sh.q_r + 2 * sh.kv_r)  # q is a view of the QKV output
        else:
            qkv = _qkv_kept(model, sh)
        attn = (qkv + a * sh.q_r) * t  # + the context (proj's input), a contiguous copy
        # fp32 softmax output + bf16 probabilities (with attention dropout: the dropped
        # probabilities, which bmm keeps instead, and dropout's bool mask)
        scores = (SOFTMAX_BYTES + a + _attn_dropout_mask(model)) * sh.scores
        masks = sh.mask
    else:
        # SDPA / flash / fused kernels keep q, k, v, the output (also proj's input) and the
        # fp32 log-sum-exp per head.
        attn = (_qkv_kept(model, sh) + a * sh.q_r + 4 * sh.heads_r) * t
    mlp = _mlp_activations(model, layout, sh)
    return ActivationBreakdown(norms, attn, scores, mlp, masks)


def _mla_widths(model: ModelSpec, layout: CostLayout) -> tuple[float, float]:
    """(query/key width, value width) of an MLA block on one TP rank."""
    heads_r = model.num_attention_heads / layout.tp
    return heads_r * (model.qk_head_dim + model.qk_pos_emb_head_dim), heads_r * model.v_head_dim


def _mla_saved(model: ModelSpec, layout: CostLayout, sh: _Shapes) -> float:
    """Bytes one MLA block saves for the backward per micro-batch on one rank (no full
    recompute), from megatron/core/transformer/multi_latent_attention.py:

    * down projections (every TP rank holds them whole, on its ``tokens_r``): the compressed
      query, the norm's output (with ``qk_layernorm``: the up projection's input), the
      compressed key/value with its RoPE part (the norm's input is a view of it) and its
      norm's output;
    * up projections: the contiguous query, key and value the attention kernel keeps (widths
      ``heads (qk_head_dim + qk_pos_emb_head_dim)`` and ``heads v_head_dim`` over TP), the
      attention output (also ``linear_proj``'s input) and, for fused kernels, the fp32
      log-sum-exp per head. The up projections' own outputs are not kept: the split, RoPE
      and concatenation make new tensors.

    Selective recompute of ``mla_up_proj`` (``CheckpointWithoutOutput``) frees the query,
    key and value after the attention's forward and recomputes them in the backward; the
    legacy selective recompute of ``core_attn`` keeps them as its checkpoint's inputs."""
    a, t, tr = sh.a, sh.tokens, sh.tokens_r
    ln = 2 if model.qk_layernorm else 1
    down = ((model.q_lora_rank or 0) * ln + model.kv_lora_rank + model.qk_pos_emb_head_dim) * tr
    if model.qk_layernorm:
        down += model.kv_lora_rank * tr
    qk_w, v_w = _mla_widths(model, layout)
    out = a * v_w * t
    lse = 0.0 if layout.attention == "unfused" else 4 * sh.heads_r * t
    qkv = 0.0 if layout.recomputes("mla_up_proj") else a * (2 * qk_w + v_w) * t
    return a * down + qkv + out + lse


def _attention_backward(model: ModelSpec, layout: CostLayout, sh: _Shapes) -> float:
    """Working set of one fused attention's backward: the query/key/value gradients and an
    fp32 query-gradient accumulator (MLA: its own widths; ``mla_up_proj`` recompute adds the
    recomputed query, key and value). 0 for unfused attention (its score buffers count
    instead)."""
    if layout.attention == "unfused":
        return 0.0
    a, t = sh.a, sh.tokens
    if not model.multi_latent_attention:
        return (a * (sh.q_r + 2 * sh.kv_r) + 4 * sh.q_r) * t
    qk_w, v_w = _mla_widths(model, layout)
    work = (a * (2 * qk_w + v_w) + 4 * qk_w) * t
    if layout.recomputes("mla_up_proj"):
        work += a * (2 * qk_w + v_w) * t
    return work


def _hidden_dropout_mask(model: ModelSpec, tokens: float, width: float) -> float:
    """Bytes of one hidden-dropout mask (torch keeps a bool per element; 0 without dropout)."""
    return tokens * width if model.hidden_dropout > 0 else 0.0


def _attn_dropout_mask(model: ModelSpec) -> int:
    """Bytes per ``s x s`` element of the attention-dropout mask of unfused attention."""
    return 1 if model.attention_dropout > 0 else 0


def _mlp_activations(model: ModelSpec, layout: CostLayout, sh: _Shapes) -> float:
    a, t = sh.a, sh.tokens
    fac = mlp_factor(model)
    if not model.num_moe_experts:
        return (a * fac * sh.f_r + _act_extra(model, layout, a, sh.f_r)) * t
    k = model.moe_router_topk
    fe = (model.moe_ffn_hidden_size or model.ffn_hidden_size) / layout.etp
    routed = k * t  # token copies reaching this rank's experts (balanced routing)
    out = 4 * 2 * model.num_moe_experts * t  # router logits and probabilities (fp32)
    out += routed * (2 * a * sh.h)  # permuted expert inputs + expert outputs (unpermute)
    out += routed * (a * fac * fe + _act_extra(model, layout, a, fe))
    if model.moe_shared_expert_intermediate_size:
        fs = model.moe_shared_expert_intermediate_size / layout.tp
        out += t * (a * fac * fs + _act_extra(model, layout, a, fs))
    return out


# --- the estimate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Phase:
    name: str
    stage: int
    activations: float
    scores: float
    logits: float
    transient: float
    dynamic: bool = True  # False: optimizer temporaries (not scaled by activation_scale)

    def total(self, act_scale: float) -> float:
        dyn = self.activations + self.scores + self.logits
        if self.dynamic:
            return act_scale * (dyn + self.transient)
        return act_scale * dyn + self.transient


def estimate_memory(
    model: ModelSpec,
    semantics: Semantics,
    resources: Resources,
    params: Mapping[str, Any],
    coefficients: Coefficients | None = None,
) -> MemoryEstimate:
    """Per-GPU peak memory of one training step of ``params`` (see the module docstring).

    Raises :class:`dse.core.exceptions.UnknownKnobError` for an unknown knob name.
    """
    co = coefficients or Coefficients()
    layout = resolve(model, semantics, resources, params)
    if (
        model.is_hybrid
        or model.num_moe_experts
        or params.get("recompute_modules") is not None
        or not layout.parallel.split.is_even
    ):
        return _estimate_by_layer_kind(model, semantics, layout, co)
    sh = _shapes(model, semantics, layout)
    stages = sorted({0, layout.pp - 1})
    best: tuple[float, _Phase, StageParams] | None = None
    per_stage: dict[str, Any] = {}
    for stage in stages:
        sp = stage_params(model, semantics.seq_length, layout, stage)
        static = _static_bytes(layout, sp)
        phases = _phases(model, semantics, layout, sh, stage, sp)
        for ph in phases:
            v = static + ph.total(co.activation_scale)
            if best is None or v > best[0]:
                best = (v, ph, sp)
        per_stage[str(stage)] = {"params": sp.total, "expert_params": sp.expert}
    assert best is not None
    _, ph, sp = best
    s = co.activation_scale
    w, g, o = _static_parts(layout, sp)
    scale_t = s if ph.dynamic else 1.0
    activations = s * ph.activations / GIB
    scores = s * ph.scores / GIB
    logits = s * ph.logits / GIB
    transient = scale_t * ph.transient / GIB
    dynamic = activations + scores + logits + (transient if ph.dynamic else 0.0)
    context = co.context_gib + (NCCL_GIB if layout.world > 1 else 0.0)
    layer = layer_activations(model, semantics, layout)
    details = {
        "layout": {
            "tp": layout.tp,
            "pp": layout.pp,
            "vpp": layout.vpp,
            "cp": layout.cp,
            "ep": layout.ep,
            "etp": layout.etp,
            "dp": layout.dp,
            "edp": layout.edp,
            "sp": layout.sp,
            "micro_batch_size": layout.mbs,
            "num_microbatches": layout.num_microbatches,
        },
        "layers_on_stage": layers_on_stage(model, layout),
        "stages": per_stage,
        "layer_activation_gib": {
            "norms": layer.norms / GIB,
            "attention": layer.attention / GIB,
            "attention_scores": layer.scores / GIB,
            "mlp": layer.mlp / GIB,
            "masks": layer.masks / GIB,
        },
        "logits_working_gib": _logits_bytes(layout, sh) / GIB,
        "grad_bytes_per_param": layout.grad_bytes,
        "coefficients": co.to_dict(),
    }
    return MemoryEstimate(
        weights_gib=w / GIB,
        gradients_gib=g / GIB,
        optimizer_gib=o / GIB,
        activations_gib=activations,
        attention_scores_gib=scores,
        logits_gib=logits,
        transient_gib=transient,
        static_offset_gib=co.static_offset_gib,
        fragmentation_gib=max(0.0, co.fragmentation) * dynamic,
        context_gib=context,
        peak_phase=ph.name,
        peak_stage=ph.stage,
        details=details,
        elastic_gib=co.elastic_gib,
    )


def _static_parts(layout: CostLayout, sp: StageParams) -> tuple[float, float, float]:
    weight_bytes = layout.param_bytes
    if layout.fp8:
        # fp8_param: the parameters themselves are FP8; otherwise Transformer Engine keeps an
        # FP8 copy of every GEMM weight next to the 16-bit one
        weight_bytes = 1 if layout.fp8_param else weight_bytes + 1
    weights = weight_bytes * sp.total + layout.param_bytes * sp.frozen
    grads = layout.grad_bytes * sp.total
    per_param = layout.master_bytes + layout.exp_avg_bytes + layout.exp_avg_sq_bytes
    if layout.distributed_optimizer:
        opt = per_param * (sp.dense / (layout.dp * layout.cp) + sp.expert / layout.edp)
    else:
        opt = per_param * sp.total
    return weights, grads, opt


def _static_bytes(layout: CostLayout, sp: StageParams) -> float:
    return sum(_static_parts(layout, sp))


def _logits_bytes(layout: CostLayout, sh: _Shapes) -> float:
    """Logits and cross-entropy buffers of one micro-batch (last stage)."""
    logits = sh.a * sh.vocab_r * sh.tokens
    te_fused = layout.cross_entropy_fusion and layout.cross_entropy_impl == "te"
    if sh.a < 4 and not te_fused:
        # Megatron's vocab-parallel cross entropy works on an fp32 copy of the logits, in
        # place, and keeps it as the softmax for the backward.
        logits += 4 * sh.vocab_r * sh.tokens
    if layout.cross_entropy_fusion and not te_fused:
        # The fused "native" kernel (megatron/core/fusions/fused_cross_entropy.py) runs its
        # steps as compiled functions (jit_fuser: torch.compile), which return new tensors
        # where the unfused path works in place: the fp32 logits and their exponentials are
        # alive together. Measured on one H200 (hybrid proxy, MBS 16, vocab 32000): fused
        # 78.01 GiB, unfused 71.17 GiB, one fp32 logits copy 7.8 GiB.
        logits += 4 * sh.vocab_r * sh.tokens
    return logits


def _phases(
    model: ModelSpec,
    semantics: Semantics,
    layout: CostLayout,
    sh: _Shapes,
    stage: int,
    sp: StageParams,
) -> list[_Phase]:
    a = sh.a
    n = layers_on_stage(model, layout)
    lm, mb = inflight_layer_microbatches(layout, n, stage)
    rc = layout.recompute
    kept = layer_activations(model, semantics, layout)
    full_layer = layer_activations(model, semantics, layout, recompute="none")
    last = stage == layout.pp - 1
    unfused = layout.attention == "unfused"

    saved_act = lm * (kept.norms + kept.attention + kept.mlp)
    saved_scores = lm * (kept.scores + kept.masks)
    if last:
        saved_act += mb * 2 * a * sh.h * sh.tokens_r  # final norm input and output
    if stage == 0:
        saved_act += mb * _hidden_dropout_mask(model, sh.tokens_r, sh.h)  # embedding dropout
    if unfused:
        saved_scores += a * sh.scores  # Megatron's persistent buffer for the score matmul

    # working sets of one layer's backward
    sm_work = SOFTMAX_BYTES if a < 4 else a
    score_bwd = (SOFTMAX_BYTES + 3 * sm_work) * sh.scores if unfused else 0.0
    if unfused and _attn_dropout_mask(model):
        score_bwd += (1 + a) * sh.scores  # dropout's mask and its gradient
    fac = mlp_factor(model)
    f_width = (
        (model.moe_ffn_hidden_size or model.ffn_hidden_size) / layout.etp * model.moe_router_topk
        if model.num_moe_experts
        else sh.f_r
    )
    mlp_bwd = a * sh.tokens * (fac + 1) * f_width
    if not layout.gradient_accumulation_fusion:
        mlp_bwd += a * sh.h * (fac + 1) * f_width  # weight gradients before main_grad.add_
    flash_bwd = _attention_backward(model, layout, sh)
    expand = 2 * a * sh.q_r * sh.tokens if (unfused and sh.rep > 1) else 0.0

    phases: list[_Phase] = []
    if rc == "full":
        layer_attn = full_layer.norms / 2 + full_layer.attention
        phases.append(
            _Phase(
                "backward",
                stage,
                saved_act + layer_attn,
                saved_scores + full_layer.masks,
                0.0,
                score_bwd + flash_bwd,
            )
        )
        phases.append(
            _Phase(
                "backward",
                stage,
                saved_act + full_layer.norms + full_layer.attention + full_layer.mlp,
                saved_scores + full_layer.scores + full_layer.masks,
                0.0,
                mlp_bwd,
            )
        )
    elif rc == "selective":
        phases.append(
            _Phase(
                "backward",
                stage,
                saved_act - kept.mlp,
                saved_scores + full_layer.masks,
                0.0,
                score_bwd + expand + flash_bwd,
            )
        )
        phases.append(_Phase("backward", stage, saved_act, saved_scores, 0.0, mlp_bwd))
    else:
        probs = a * sh.scores if unfused else 0.0
        attn_work = (score_bwd - (SOFTMAX_BYTES + a) * sh.scores + probs) if unfused else 0.0
        # the last layer's MLP activations and probabilities are already freed
        phases.append(
            _Phase(
                "backward",
                stage,
                saved_act - kept.mlp,
                saved_scores - probs,
                0.0,
                attn_work + flash_bwd,
            )
        )
        phases.append(_Phase("backward", stage, saved_act, saved_scores, 0.0, mlp_bwd))
    if last:
        phases.append(
            _Phase("forward_end", stage, saved_act, saved_scores, _logits_bytes(layout, sh), 0.0)
        )
    phases.append(
        _Phase(
            "optimizer_step",
            stage,
            0.0,
            a * sh.scores if unfused else 0.0,
            0.0,
            _optimizer_temporaries(layout, sp),
            dynamic=False,
        )
    )
    return phases


def _optimizer_temporaries(layout: CostLayout, sp: StageParams) -> float:
    """Bytes the optimizer step allocates on top of its state.

    torch's multi-tensor Adam (Megatron's fallback without apex/TE) allocates one fp32
    tensor per state element (``sqrt(exp_avg_sq)``); 16-bit main gradients are copied to
    fp32 for the update; the precision-aware optimizer's low-precision states are unscaled
    to fp32 copies (``CostLayout.unscaled_states``).
    """
    if layout.distributed_optimizer:
        dense = sp.dense / (layout.dp * layout.cp)
        expert = sp.expert / layout.edp
    else:
        dense, expert = float(sp.dense), float(sp.expert)
    shard = dense + expert
    temp = 0.0 if layout.fused_adam else 4.0 * shard
    if layout.grad_bytes < 4 and not layout.precision_aware:
        temp += 4.0 * shard
    # precision-aware (TE FusedAdam): fp32 copies of the low-precision states of one
    # parameter group at a time; dense and expert parameters are separate optimizers, so
    # the larger of the two groups sets the peak
    temp += 4.0 * layout.unscaled_states * max(dense, expert)
    return temp


# --- hybrid models and per-module selective recompute ------------------------------------------


def _kind_bytes(
    model: ModelSpec, semantics: Semantics, layout: CostLayout, sh: _Shapes
) -> dict[str, dict[str, float]]:
    """Per layer kind (attention, mamba, mlp, moe): bytes saved for the backward by one
    micro-batch on one rank (``saved``), and the working set of its backward
    (``backward``). Each kind includes its own norm, as the hybrid spec builds it (TE's
    fused norm + linear keeps the norm's input and output; a MoE layer's separate norm)."""
    a, t, tr, h = sh.a, sh.tokens, sh.tokens_r, sh.h
    tp = layout.tp
    fused_norm = 2 * a * h * tr
    out: dict[str, dict[str, float]] = {}

    # attention: the GPT formulas for the attention half of a layer
    rc = "selective" if layout.recomputes("core_attn") else "none"
    attn = layer_activations(model, semantics, layout, recompute=rc)
    unfused = layout.attention == "unfused"
    flash_bwd = _attention_backward(model, layout, sh)
    sm_work = SOFTMAX_BYTES if a < 4 else a
    score_bwd = (SOFTMAX_BYTES + 3 * sm_work) * sh.scores if unfused else 0.0
    out["attention"] = {
        "saved": fused_norm + attn.attention + attn.scores + attn.masks,
        "backward": flash_bwd + score_bwd,
    }

    # Mamba (memory-efficient path, mamba_split_conv1d_scan_combined): the kernel keeps its
    # input zxBCdt and its output; the mixer's RMSNorm keeps its input, out_proj its input.
    d = model.mamba_d_inner / tp
    gn = model.mamba_num_groups * model.mamba_state_dim / tp
    heads = model.mamba_heads / tp
    zx = 2 * d + 2 * gn + heads
    # Without it (conv1d, then mamba_chunk_scan_combined) the conv output x/B/C is kept for
    # the scan: measured on one H200 (hybrid proxy, MBS 16), 82.61 GiB against 78.01 GiB.
    conv_out = 0.0 if layout.mamba_mem_eff else a * t * (d + 2 * gn)
    out["mamba"] = {
        "saved": fused_norm + a * t * (zx + 3 * d) + 4 * t * heads + conv_out,
        # gradients of zxBCdt, the recomputed conv output and the fp32 dt/dA terms
        "backward": a * t * (2 * zx + 2 * d) + 3 * 4 * t * heads,
    }

    # dense MLP
    fac = mlp_factor(model)
    f_r = model.ffn_hidden_size / tp
    mlp_full = (a * fac * f_r + _act_extra(model, layout, a, f_r)) * t
    mlp_bwd = a * t * (fac + 1) * f_r
    out["mlp"] = {
        "saved": (a * h * tr) if layout.recomputes("mlp") else fused_norm + mlp_full,
        "backward": mlp_bwd + (mlp_full if layout.recomputes("mlp") else 0.0),
    }

    # MoE: tokens stay sequence-sharded with SP; ETP gathers them over its group
    if model.num_moe_experts:
        k = model.moe_router_topk
        fe = (model.moe_ffn_hidden_size or model.ffn_hidden_size) / layout.etp
        t_moe = tr * layout.etp
        routed = k * t_moe
        gemm_in = 0.5 if layout.fp8 else 1.0  # FP8 GEMM inputs are saved in one byte
        act = _act_extra(model, layout, a, fe)
        if layout.recomputes("moe_act"):
            act = 0.0
        experts = 4 * 2 * model.num_moe_experts * t_moe  # router logits and probs (fp32)
        # the permuted inputs of the expert GEMMs (their outputs are not kept: the combine
        # weights them by the routing probabilities saved above). Measured on one H200 (hybrid
        # proxy, 5 MoE layers, top-6 of 16, h 2048, MBS 1-16): counting the outputs and an
        # fp32 copy of the router's input too over-predicted every peak by 0.63 GiB per
        # sequence, exactly those two terms.
        experts += routed * (a * h * gemm_in)
        experts += routed * (a * fac * fe * gemm_in + act)
        shared = 0.0
        if model.moe_shared_expert_intermediate_size:
            fs = model.moe_shared_expert_intermediate_size / tp
            shared_act = (
                0.0 if layout.recomputes("shared_experts") else _act_extra(model, layout, a, fs)
            )
            shared = t * (a * fac * fs * gemm_in + shared_act)
            if layout.recomputes("shared_experts"):
                shared = 0.0
        norm_out = 0.0 if layout.recomputes("layernorm") else a * h * tr
        body = experts + shared
        moe_bwd = a * routed * (fac + 1) * fe
        if layout.recomputes("moe"):
            saved = a * h * tr + norm_out  # the checkpoint keeps its input only
            backward = body + moe_bwd
        else:
            saved = a * h * tr + norm_out + body
            backward = moe_bwd
        if layout.recomputes("layernorm"):
            backward += a * h * tr  # the recomputed norm output
        out["moe"] = {"saved": saved, "backward": backward}
    return out


def _dispatcher_buffers(model: ModelSpec, layout: CostLayout, sh: _Shapes) -> float:
    """Bytes of the flex dispatcher's communication buffers (DeepEP / HybridEP), sized for
    the worst case of every token of the expert-parallel group reaching one rank, for the
    dispatch and the combine. An estimate: the libraries size them from their own hints."""
    if not model.num_moe_experts or layout.flex_backend is None:
        return 0.0
    return 2.0 * layout.ep * sh.tokens_r * layout.etp * sh.h * sh.a


def _estimate_by_layer_kind(
    model: ModelSpec, semantics: Semantics, layout: CostLayout, co: Coefficients
) -> MemoryEstimate:
    """The estimate for hybrid models and per-module selective recompute: saved
    activations summed over the layer kinds of each stage, the largest backward working set
    of a kind, the logits on the last stage and the optimizer step."""

    sh = _shapes(model, semantics, layout)
    kinds = _kind_bytes(model, semantics, layout, sh)
    buffers = _dispatcher_buffers(model, layout, sh)
    best: tuple[float, _Phase, StageParams] | None = None
    per_stage: dict[str, Any] = {}
    # an even split: the first and the last stage are the extremes; any other split (uneven
    # stages, a layout, a dense-first MoE model): every stage, the largest sets the peak
    stages = (
        range(layout.pp)
        if model.mixed_moe or not layout.parallel.split.is_even
        else sorted({0, layout.pp - 1})
    )
    for stage in stages:
        sp = stage_params(model, semantics.seq_length, layout, stage)
        counts = stage_layer_kinds(model, layout, stage)
        n = max(1, len(stage_layer_ids(model, layout, stage)))
        lm, mb = inflight_layer_microbatches(layout, n, stage)
        per_layer_mb = lm / n
        saved = per_layer_mb * sum(c * kinds[k]["saved"] for k, c in counts.items() if c)
        last = stage == layout.pp - 1
        if last:
            saved += mb * 2 * sh.a * sh.h * sh.tokens_r  # final norm input and output
        work = max((kinds[k]["backward"] for k, c in counts.items() if c), default=0.0)
        phases = [_Phase("backward", stage, saved, 0.0, 0.0, work)]
        if last:
            phases.append(_Phase("forward_end", stage, saved, 0.0, _logits_bytes(layout, sh), 0.0))
        phases.append(
            _Phase(
                "optimizer_step", stage, 0.0, 0.0, 0.0, _optimizer_temporaries(layout, sp), False
            )
        )
        static = _static_bytes(layout, sp)
        for ph in phases:
            v = static + ph.total(co.activation_scale)
            if best is None or v > best[0]:
                best = (v, ph, sp)
        per_stage[str(stage)] = {
            "params": sp.total,
            "expert_params": sp.expert,
            "frozen_params": sp.frozen,
            "layers": counts,
        }
    assert best is not None
    _, ph, sp = best
    sc = co.activation_scale
    w, g, o = _static_parts(layout, sp)
    scale_t = sc if ph.dynamic else 1.0
    activations = sc * ph.activations / GIB
    logits = sc * ph.logits / GIB
    transient = scale_t * ph.transient / GIB
    dynamic = activations + logits + (transient if ph.dynamic else 0.0)
    return MemoryEstimate(
        weights_gib=w / GIB,
        gradients_gib=g / GIB,
        optimizer_gib=o / GIB,
        activations_gib=activations,
        attention_scores_gib=0.0,
        logits_gib=logits,
        transient_gib=transient,
        static_offset_gib=co.static_offset_gib,
        fragmentation_gib=max(0.0, co.fragmentation) * dynamic,
        context_gib=co.context_gib + (NCCL_GIB if layout.world > 1 else 0.0),
        peak_phase=ph.name,
        peak_stage=ph.stage,
        details={
            "layout": layout.parallel.as_dict(),
            "recompute_modules": list(layout.recompute_modules)
            if layout.recompute == "selective"
            else [],
            "stages": per_stage,
            "layer_kind_gib": {
                k: {"saved": v["saved"] / GIB, "backward": v["backward"] / GIB}
                for k, v in kinds.items()
            },
            "logits_working_gib": _logits_bytes(layout, sh) / GIB,
            "optimizer_step_gib": _optimizer_temporaries(layout, sp) / GIB,
            "grad_bytes_per_param": layout.grad_bytes,
            "master_bytes_per_param": layout.master_bytes,
            "coefficients": co.to_dict(),
        },
        buffers_gib=buffers / GIB,
        elastic_gib=co.elastic_gib,
    )
