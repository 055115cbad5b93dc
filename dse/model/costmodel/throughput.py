"""Roofline-style step-time estimate of a Megatron-Core training step (always an estimate).

Per layer and micro-batch, on one rank:

* GEMMs (QKV, projection, MLP, logits) at an achievable fraction of the GPU's dense bf16
  peak, lower for small token counts (a saturating curve in the GEMM's M dimension);
  backward costs twice the forward. With FP8 (the ``fp8`` knob) the Transformer Engine
  linear layers (QKV, projection, MLP, shared and routed experts) run at the GPU's dense FP8
  peak instead (:attr:`GPUSpec.fp8_tflops`); the logits, the router and core attention stay
  in bf16, and the FP8 casts and scaling are not modelled;
* core attention: unfused attention runs two batched GEMMs over the whole ``s x s`` score
  matrix (no causal skipping) plus memory-bound softmax/mask/cast traffic of about 72 bytes
  per score element (forward + backward); SDPA/flash/fused kernels do the causal half of the
  FLOPs at a lower efficiency and keep nothing ``s x s`` in memory;
* elementwise traffic (norms, residual adds, RoPE, activation, cross entropy) at an
  achievable fraction of the HBM bandwidth;
* MoE layers: the routed experts' grouped GEMMs at the efficiency of their per-expert
  token count (a rank runs 1/TP of its micro-batch's expert work whatever EP x ETP is), the
  router and shared expert, the permutation's memory traffic and, for the dropless
  all-to-all dispatcher, one host synchronisation per MoE forward;
* Mamba layers: the projections as GEMMs, the chunked scan at a calibrated time per token
  (not per head: its kernels do not fill the GPU at TP 2-4) and the mixer's elementwise
  traffic;
* recompute: full adds one forward of every layer, selective adds the forward of what it
  covers (core attention, the MoE layer with its dispatch, the MLP);
* communication: TP all-reduces (or SP all-gather/reduce-scatter, the same volume) of the
  hidden state, the CP ring exchange of K/V, the EP dispatch and combine of routed tokens
  (NVLink inside a node; across nodes every copy over InfiniBand for the all-to-all, one
  copy per remote node for the hierarchical flex dispatchers), the DP
  gradient reduce (and the distributed optimizer's parameter all-gather), at NVLink speed
  inside a node and InfiniBand speed across nodes;
* the pipeline bubble ``(PP - 1) / (m * VPP)`` of the compute time;
* the optimizer step (memory-bound) and a per-kernel launch cost.

The result is labelled ``"source": "estimate"``; TFLOP/s use Megatron's model-FLOPs
convention (:func:`dse.model.flops.model_flops_per_step`), so they compare with measured ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dse.model.costmodel._layout import CostLayout, padded_vocab, resolve
from dse.model.costmodel._params import layers_on_stage, mlp_factor, stage_params
from dse.model.flops import model_flops_per_step
from dse.space.searchspace import ModelSpec, Resources, Semantics

__all__ = ["GPUSpec", "GPUS", "gpu_spec", "estimate_throughput", "DEFAULT_GPU"]


@dataclass(frozen=True)
class GPUSpec:
    """What the estimate needs to know about a GPU.

    Attributes:
        name: display name.
        bf16_tflops: dense bf16 tensor-core peak (TFLOP/s).
        hbm_tbps: HBM bandwidth (TB/s).
        nvlink_gbps: NVLink bandwidth per direction per GPU (GB/s); 0 means PCIe only.
        memory_gib: device memory as PyTorch reports it (GiB).
        matmul_efficiency: fraction of the peak that large GEMMs reach (H200: ~790 of 989).
        fp8_tflops: dense FP8 tensor-core peak (TFLOP/s); 0 where the GPU has no FP8 tensor
            cores (FP8 GEMMs are then estimated at the bf16 rate).
    """

    name: str
    bf16_tflops: float
    hbm_tbps: float
    nvlink_gbps: float
    memory_gib: float
    matmul_efficiency: float = 0.8
    fp8_tflops: float = 0.0


#: Known GPUs, matched by substring of the (upper-cased) device name, most specific first.
#: FP8 peaks (``fp8_tflops``): the vendors' published dense (not 2:4-sparse) FP8 tensor-core
#: peaks, twice the dense bf16 peak on Hopper and Blackwell: NVIDIA's H100 / H200 datasheets
#: (H100 SXM / H200 1979, H100 PCIe 1513 TFLOP/s; the datasheets print 3958 / 3026 "with
#: sparsity", twice the dense figure) and its DGX B200 / GB200 NVL72 specifications (B200
#: 4500, GB200 5000 TFLOP/s dense per GPU). Ampere (A100, A800) has no FP8 tensor cores;
#: L40S and MI300X have, but no FP8 peak is recorded here (their FP8 is estimated at bf16).
#: Blackwell Ultra (GB300, B300): NVIDIA's GB300 NVL72 and HGX B300 specifications print, per
#: rack / board and "with sparsity", FP8 720 PF / 72 GB300 and 72 PF / 8 B300, BF16 360 PF /
#: 72 and 36 PF / 8; the dense per-GPU peaks are half (GB300 5000 FP8, 2500 BF16; B300 4500
#: FP8, 2250 BF16 TFLOP/s); 288 GB of HBM3e at 8 TB/s per GPU, NVLink 5 (1.8 TB/s both
#: directions). Memory as PyTorch reports it: 279 GiB (Megatron-Bridge's B300 performance
#: recipes cite 279 GB for the card, against 179 / 184 for B200 / GB200 in this table).
GPUS: tuple[tuple[str, GPUSpec], ...] = (
    ("GB300", GPUSpec("NVIDIA GB300", 2500.0, 8.0, 900.0, 279.0, fp8_tflops=5000.0)),
    ("B300", GPUSpec("NVIDIA B300", 2250.0, 8.0, 900.0, 279.0, fp8_tflops=4500.0)),
    ("GB200", GPUSpec("NVIDIA GB200", 2500.0, 8.0, 900.0, 184.0, fp8_tflops=5000.0)),
    ("B200", GPUSpec("NVIDIA B200", 2250.0, 8.0, 900.0, 179.0, fp8_tflops=4500.0)),
    ("H200", GPUSpec("NVIDIA H200", 989.0, 4.8, 450.0, 139.8, fp8_tflops=1979.0)),
    ("H100 PCIE", GPUSpec("NVIDIA H100 PCIe", 756.0, 2.0, 0.0, 79.2, fp8_tflops=1513.0)),
    ("H800", GPUSpec("NVIDIA H800", 989.0, 3.35, 200.0, 79.2, fp8_tflops=1979.0)),
    ("H100", GPUSpec("NVIDIA H100 SXM", 989.0, 3.35, 450.0, 79.2, fp8_tflops=1979.0)),
    ("GH200", GPUSpec("NVIDIA GH200", 989.0, 4.0, 450.0, 94.5, fp8_tflops=1979.0)),
    ("A100-SXM4-40GB", GPUSpec("NVIDIA A100 40GB", 312.0, 1.555, 300.0, 39.4)),
    ("A100", GPUSpec("NVIDIA A100 80GB", 312.0, 2.0, 300.0, 79.2)),
    ("A800", GPUSpec("NVIDIA A800", 312.0, 2.0, 200.0, 79.2)),
    ("L40S", GPUSpec("NVIDIA L40S", 362.0, 0.864, 0.0, 44.5)),
    ("MI300X", GPUSpec("AMD MI300X", 1307.0, 5.3, 448.0, 191.5, 0.6)),
)

#: Used when the GPU is unknown or not given: a mid-range datacenter GPU.
DEFAULT_GPU = GPUSpec("unknown GPU (default)", 400.0, 2.0, 300.0, 80.0, 0.7)

#: InfiniBand bandwidth per GPU across nodes (GB/s per direction; 400 Gb/s NDR).
IB_GBPS = 50.0
#: PCIe bandwidth when there is no NVLink (GB/s per direction).
PCIE_GBPS = 25.0
#: Fraction of the link bandwidth NCCL collectives reach.
COMM_EFFICIENCY = 0.8
#: Fraction of the HBM bandwidth PyTorch's elementwise/softmax kernels reach.
MEMORY_EFFICIENCY = 0.55
#: Flash-style attention kernels' fraction of the dense peak (forward + backward).
FLASH_EFFICIENCY = 0.5
#: GEMM M (tokens) at which a GEMM reaches half of its large-size efficiency.
GEMM_HALF_TOKENS = 256.0
#: CPU cost of launching one kernel (seconds) and kernels per layer (forward + backward).
LAUNCH_S = 4e-6
KERNELS_PER_LAYER = 80
#: Unfused attention's memory traffic per score element (bytes, forward; backward).
UNFUSED_SCORE_FWD_BYTES = 32.0
UNFUSED_SCORE_BWD_BYTES = 40.0
#: Mamba-2's chunked scan (the Triton SSD kernels of mamba_split_conv1d_scan_combined:
#: chunk cumsum, chunk state, state passing across chunks, chunk scan), seconds per token
#: of the micro-batch and per Mamba layer, forward (the backward costs twice). The kernels'
#: grids run over (batch, chunks, heads on this rank) with a sequential pass over the
#: chunks, so at TP 2-4 they do not fill a Hopper GPU and their time follows the tokens,
#: not the heads a rank holds. Calibrated, with DISPATCH_SYNC_S, on the two published
#: Nemotron 3 Nano Omni step times (prior 111 and tuned 197.1 TFLOP/s/GPU on 8 H100,
#: Megatron-Bridge PR #5524); docs/BENCHMARKS.md section 14 has the fit and the checks.
MAMBA_SCAN_S_PER_TOKEN = 3.14e-7
#: Memory traffic of the Mamba mixer outside its GEMMs, per token and per unit of
#: ``d_inner`` (bytes, forward): causal conv1d of x/B/C, the gate, the gated RMSNorm and
#: the layout copies (``rearrange(...).contiguous()``) around the scan.
MAMBA_ELEMENTWISE_BYTES = 24.0
#: Idle time of one host synchronisation of the token dispatcher (s): the dropless
#: all-to-all dispatcher copies the tokens-per-expert counts to the host in every MoE
#: layer's forward (and its recomputation) to size the permuted tensors, draining the GPU's
#: queue; the flex dispatchers (DeepEP, HybridEP) size them on the device.
DISPATCH_SYNC_S = 1.0e-4
#: Host-bound time of one Mamba or MoE layer per micro-batch (forward + backward) of a
#: hybrid model built on Megatron-Core's local spec (no Transformer Engine: Mamba's conv1d
#: as a torch stand-in beside mamba-ssm's Triton SSD kernels, the experts one after another
#: without grouped GEMM): launches and host synchronisations that do not shrink with the
#: tokens. Fitted on the measured hybrid study of one H200 (examples/studies/
#: h200_hybrid_proxy_study_1gpu.jsonl: 46.8 TFLOP/s/GPU at MBS 1, 168.7 at MBS 16, where the
#: estimate without it was flat at 203-226) by ``python bench/hybrid_speed_fit.py``: a least-
#: squares fit of measured step = scale x estimated step + micro-batches x layers x this.
#: Layers built with Transformer Engine (the Omni recipe's) do not pay it.
LOCAL_HYBRID_LAYER_S = 0.0168


def gpu_spec(name: str | None) -> GPUSpec:
    """The spec of a GPU by (a substring of) its name; :data:`DEFAULT_GPU` when unknown."""
    if not name:
        return DEFAULT_GPU
    key = name.upper().replace("_", " ")
    for pattern, spec in GPUS:
        if pattern.replace("_", " ") in key:
            return spec
    return DEFAULT_GPU


def _allreduce_s(nbytes: float, n: int, gbps: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / (gbps * 1e9 * COMM_EFFICIENCY)


def _link(group: int, span: int, gpus_per_node: int, gpu: GPUSpec) -> float:
    """Bandwidth (GB/s) of a group of ``group`` ranks spread over ``span`` consecutive ranks."""
    if span > gpus_per_node:
        return IB_GBPS
    return gpu.nvlink_gbps if gpu.nvlink_gbps > 0 else PCIE_GBPS


def _dispatch_s(model: ModelSpec, lay: CostLayout, gpu: GPUSpec, token_bytes: float) -> float:
    """Seconds of one token dispatch (or combine) of one MoE layer over the EP group.

    Each token goes to ``topk`` experts, spread evenly over the EP ranks. Copies for ranks
    of the same node travel over NVLink. Copies for other nodes: the all-to-all dispatcher
    sends every copy over InfiniBand; the flex dispatchers (DeepEP's normal kernels,
    HybridEP) send a token once to each remote node that hosts one of its experts and fan it
    out over that node's NVLink, so the two links work in parallel.
    """
    k = model.moe_router_topk
    ep, gpn = lay.ep, lay.gpus_per_node
    per_node = min(ep, max(1, gpn // max(1, lay.etp)))  # EP ranks of one node (ETP inner)
    nodes = max(1, -(-ep // per_node))
    local_copies = k * (per_node - 1) / ep
    remote_copies = k * (ep - per_node) / ep
    nv = gpu.nvlink_gbps if gpu.nvlink_gbps > 0 else PCIE_GBPS
    rate_nv = nv * 1e9 * COMM_EFFICIENCY
    rate_ib = IB_GBPS * 1e9 * COMM_EFFICIENCY
    if nodes == 1:
        return local_copies * token_bytes / rate_nv
    if lay.flex_backend is None:
        return local_copies * token_bytes / rate_nv + remote_copies * token_bytes / rate_ib
    # expected remote nodes holding at least one of the token's experts (uniform routing)
    hit = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
    ib = hit * token_bytes / rate_ib
    nvl = (local_copies + remote_copies) * token_bytes / rate_nv
    return max(ib, nvl)


def estimate_throughput(
    model: ModelSpec,
    semantics: Semantics,
    resources: Resources,
    params: Mapping[str, Any],
) -> dict[str, Any]:
    """Estimated ``step_time_s`` and ``tflops_per_gpu`` of ``params`` (``source: estimate``).

    Raises :class:`dse.core.exceptions.UnknownKnobError` for an unknown knob name.
    """
    lay = resolve(model, semantics, resources, params)
    gpu = gpu_spec(resources.gpu)
    parts = _step_parts(model, semantics, lay, gpu)
    step = sum(parts.values())
    flops = model_flops_per_step(model, semantics, tensor_model_parallel_size=lay.tp)
    return {
        "tflops_per_gpu": round(flops / (step * lay.world * 1e12), 3),
        "step_time_s": round(step, 6),
        "tokens_per_s_per_gpu": round(
            semantics.global_batch_size * semantics.seq_length / step / lay.world, 3
        ),
        "source": "estimate",
        "gpu": gpu.name,
        "breakdown_s": {k: round(v, 6) for k, v in parts.items()},
    }


def _step_parts(
    model: ModelSpec, semantics: Semantics, lay: CostLayout, gpu: GPUSpec
) -> dict[str, float]:
    a = lay.act_bytes
    s = semantics.seq_length
    tp, cp = lay.tp, lay.cp
    tokens = lay.mbs * s / cp  # tokens of one micro-batch on one rank
    h = model.hidden_size
    hd: float = model.head_dim
    q = model.num_attention_heads * hd / tp
    kv = hd * max(1.0, model.query_groups / tp)
    heads = model.num_attention_heads / tp
    attn_macs = h * (q + 2 * kv) + q * h  # Q, K, V and output projections per token
    if model.multi_latent_attention:
        # MLA: its down / up / output projections (the down ones whole on every TP rank);
        # QK^T runs over query/key heads of qk + rope dims, PV over value heads
        qh = model.qk_head_dim + model.qk_pos_emb_head_dim
        mla = model.mla_linears().values()
        attn_macs = sum(i * o / (tp if split else 1) for i, o, split in mla)
        hd = (qh + model.v_head_dim) / 2
        q = kv = heads * qh
    fac = mlp_factor(model)
    experts = model.num_moe_experts or 0
    moe = experts > 0
    # layer kinds as fractions of the layers (a GPT layer has attention and an MLP/MoE)
    kinds = model.layer_counts()
    n_all = model.num_layers
    f_attn, f_mamba = kinds["attention"] / n_all, kinds["mamba"] / n_all
    f_dense, f_moe = kinds["mlp"] / n_all, kinds["moe"] / n_all
    f = model.ffn_hidden_size / tp
    mlp_macs = f_dense * h * f * (fac + 1)
    mlp_width = f_dense * f
    peak = gpu.bf16_tflops * 1e12 * (0.5 if a == 4 else 1.0)  # fp32 runs at TF32-ish rates
    gemm_rate = peak * gpu.matmul_efficiency * tokens / (tokens + GEMM_HALF_TOKENS)
    # FP8: the Transformer Engine linears (and grouped expert GEMMs) at the FP8 peak; the
    # logits, router and attention GEMMs keep gemm_rate
    fp8_gain = gpu.fp8_tflops / gpu.bf16_tflops if lay.fp8 and gpu.fp8_tflops > 0 else 1.0
    lin_rate = gemm_rate * fp8_gain
    bw = gpu.hbm_tbps * 1e12 * MEMORY_EFFICIENCY
    moe_macs = 0.0  # shared expert, per token of the micro-batch, at the linears' rate
    router_macs = 0.0  # router, per token of the micro-batch, at the bf16 GEMM rate
    expert_fwd = 0.0  # routed experts' GEMMs of one MoE layer (s, forward)
    moe_extra_fwd = 0.0  # permute/unpermute traffic of one MoE layer (s, forward)
    if moe:
        k = model.moe_router_topk
        fe_full = model.moe_ffn_hidden_size or model.ffn_hidden_size
        shared = (model.moe_shared_expert_intermediate_size or 0) / tp
        # balanced routing: every rank of the layer's TP x CP x DP ranks runs 1/TP of its
        # micro-batch's expert work, whatever EP x ETP is (ETP shards fe, EP the tokens)
        routed = k * tokens / tp  # token copies this rank's experts process
        local = max(1.0, experts / lay.ep)
        per_expert = routed * lay.etp / local  # grouped GEMM's M of each local expert
        expert_rate = peak * gpu.matmul_efficiency * per_expert / (per_expert + GEMM_HALF_TOKENS)
        expert_rate *= fp8_gain
        expert_fwd = 2 * routed * h * fe_full * (fac + 1) / expert_rate
        # router (on this rank's sequence share) and shared expert (TP-sharded)
        moe_macs = h * shared * (fac + 1)
        router_macs = h * experts / (tp if lay.sp else 1)
        mlp_macs += f_moe * moe_macs
        mlp_width += f_moe * (k * fe_full / tp + shared)
        # the permutation reads and writes every routed copy before and after the experts
        moe_extra_fwd = 2 * 2 * a * h * routed / bw
    d_in = model.mamba_d_inner / tp
    gn = model.mamba_num_groups * model.mamba_state_dim / tp
    mamba_macs = h * (2 * d_in + 2 * gn + model.mamba_heads / tp) + d_in * h
    proj_macs = f_attn * attn_macs + f_mamba * mamba_macs
    # the chunked scan and the mixer's elementwise traffic
    mamba_fwd = f_mamba * tokens * (MAMBA_SCAN_S_PER_TOKEN + MAMBA_ELEMENTWISE_BYTES * d_in / bw)
    n_layers = layers_on_stage(model, lay)
    m = lay.num_microbatches
    unfused = lay.attention == "unfused"

    # --- one layer, one micro-batch, forward ------------------------------------------------
    router_fwd = 2 * tokens * router_macs / gemm_rate
    gemm_fwd = 2 * tokens * (proj_macs + mlp_macs) / lin_rate + f_moe * (router_fwd + expert_fwd)
    scores = f_attn * lay.mbs * heads * (s / cp) * s
    if unfused:
        attn_fwd = 4 * scores * hd / gemm_rate + UNFUSED_SCORE_FWD_BYTES * scores / bw
        attn_bwd = 8 * scores * hd / gemm_rate + UNFUSED_SCORE_BWD_BYTES * scores / bw
    else:
        flash = peak * FLASH_EFFICIENCY
        attn_fwd = 2 * scores * hd / flash  # causal half of QK^T and PV
        attn_bwd = 2.5 * attn_fwd
    act_traffic = (
        (1 if lay.bias_activation_fusion or not model.gated_linear_unit else 7 / 3)
        * 3
        * a
        * mlp_width
    )
    elem_fwd = (
        tokens
        * (
            4 * a * h / (tp if lay.sp else 1)  # two norms
            + 6 * a * h / (tp if lay.sp else 1)  # two residual adds
            + (8 * a * (q + kv) if model.position_embedding_type == "rope" else 0.0)
            + act_traffic
        )
        / bw
    )
    moe_fwd = f_moe * (2 * tokens * moe_macs / lin_rate + router_fwd + expert_fwd + moe_extra_fwd)
    layer_fwd = gemm_fwd + attn_fwd + elem_fwd + mamba_fwd + f_moe * moe_extra_fwd
    # backward GEMMs: data gradient and weight gradient; a frozen base (PEFT) computes no
    # weight gradient of its own (its adapters' GEMMs are left out: rank << width)
    layer_bwd = (1 if lay.peft is not None else 2) * gemm_fwd
    layer_bwd += attn_bwd + 2 * elem_fwd + 2 * mamba_fwd
    layer_bwd += 2 * f_moe * moe_extra_fwd
    if lay.recompute == "full":
        layer_bwd += layer_fwd
    elif lay.recompute == "selective":
        if lay.recomputes("core_attn"):
            layer_bwd += attn_fwd
        if lay.recomputes("moe"):
            layer_bwd += moe_fwd
        if lay.recomputes("mlp"):
            layer_bwd += 2 * tokens * f_dense * h * f * (fac + 1) / lin_rate
        if lay.recomputes("mla_up_proj"):
            # the query and key/value up projections again (split by heads over TP)
            up = [v for k, v in model.mla_linears().items() if k.endswith("up_proj")]
            layer_bwd += 2 * tokens * f_attn * sum(i * o / tp for i, o, _ in up) / lin_rate
    compute = n_layers * m * (layer_fwd + layer_bwd)
    if moe and lay.ep > 1 and lay.flex_backend is None:
        # the all-to-all dispatcher waits for the host in every MoE forward
        syncs = 2 if (lay.recompute == "full" or lay.recomputes("moe")) else 1
        compute += n_layers * m * f_moe * syncs * DISPATCH_SYNC_S

    # logits + cross entropy (last stage), embedding (first stage): per micro-batch
    vocab = padded_vocab(model.vocab_size, tp) / tp
    ce_bytes = 10.0 if (lay.cross_entropy_fusion and lay.cross_entropy_impl == "te") else 62.0
    if lay.cross_entropy_fusion and lay.cross_entropy_impl != "te":
        ce_bytes = 54.0  # the fused native kernel saves a few passes
    head = m * (6 * tokens * h * vocab / gemm_rate + ce_bytes * tokens * vocab / bw)
    compute += head

    # --- communication ---------------------------------------------------------------------
    gpn = lay.gpus_per_node
    comm = 0.0
    if tp > 1:
        bw_tp = _link(tp, tp, gpn, gpu)
        n_ar = 4 + (2 if lay.recompute == "full" else 0)
        tp_s = n_layers * m * n_ar * _allreduce_s(a * h * tokens, tp, bw_tp)
        tp_s += m * 2 * _allreduce_s(a * h * tokens, tp, bw_tp)  # embedding / logits
        comm += tp_s * (0.3 if lay.tp_comm_overlap else 1.0)
    if cp > 1:
        bw_cp = _link(cp, tp * cp, gpn, gpu)
        ring = (cp - 1) * 2 * a * kv * tokens / (bw_cp * 1e9 * COMM_EFFICIENCY)
        comm += 0.5 * n_layers * m * 3 * ring  # partly hidden behind the attention blocks
    if moe and lay.ep > 1:
        # with sequence parallelism a rank dispatches its own share of the tokens
        moe_tokens = tokens / tp if lay.sp else tokens
        # dispatch and combine, forward and backward (and once more when the MoE layer's
        # forward is recomputed)
        passes = 4 + (2 if (lay.recompute == "full" or lay.recomputes("moe")) else 0)
        comm += f_moe * n_layers * m * passes * _dispatch_s(model, lay, gpu, a * h * moe_tokens)
    sp0 = stage_params(model, s, lay, 0)
    dp_group = lay.dp * cp
    if dp_group > 1:
        bw_dp = _link(dp_group, lay.world, gpn, gpu)
        grad_bytes = lay.grad_bytes * sp0.dense
        if lay.distributed_optimizer:
            vol = (dp_group - 1) / dp_group * (grad_bytes + lay.param_bytes * sp0.dense)
            dp_s = vol / (bw_dp * 1e9 * COMM_EFFICIENCY)
        else:
            dp_s = _allreduce_s(grad_bytes, dp_group, bw_dp)
        exposed = 0.25 if lay.overlap_grad_reduce else 1.0
        comm += dp_s * exposed
    if lay.pp > 1:
        bw_pp = _link(2, lay.world, gpn, gpu)
        p2p = 2 * a * h * tokens / (tp if lay.sp else 1) / (bw_pp * 1e9 * COMM_EFFICIENCY)
        comm += 2 * m * lay.vpp * p2p

    # --- pipeline bubble, optimizer, launches --------------------------------------------------
    bubble = compute * (lay.pp - 1) / (m * lay.vpp) if lay.pp > 1 else 0.0
    shard = (
        sp0.dense / dp_group + sp0.expert / lay.edp
        if lay.distributed_optimizer
        else float(sp0.total)
    )
    state = lay.master_bytes + lay.exp_avg_bytes + lay.exp_avg_sq_bytes
    opt_bytes = shard * (2 * state + lay.grad_bytes + (0 if lay.fused_adam else 8))
    opt_bytes += lay.param_bytes * sp0.total  # updated 16-bit weights
    optimizer = opt_bytes / bw
    launches = (
        n_layers * m * KERNELS_PER_LAYER * LAUNCH_S * (1.5 if lay.recompute == "full" else 1.0)
    )
    if model.is_hybrid and lay.local_spec:
        launches += n_layers * (f_mamba + f_moe) * m * LOCAL_HYBRID_LAYER_S
    return {
        "compute": compute,
        "communication": comm,
        "pipeline_bubble": bubble,
        "optimizer": optimizer,
        "launch": launches,
    }
