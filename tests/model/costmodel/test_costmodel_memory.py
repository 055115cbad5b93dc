"""Each memory term against bytes computed by hand for a small model.

Model: L=2 layers, h=64, n=4 heads of d=16 (q = n*d = 64), g=2 KV groups (kv = g*d = 32),
SwiGLU ffn f=256, vocab 1000 (padded to 1024 = 8*128), seq s=32, micro-batch b=2, so one
micro-batch has T = b*s = 64 tokens; bf16 activations (a = 2 bytes).
"""

from __future__ import annotations

import pytest

from dse.model.costmodel import GPUSpec, MemoryEstimate, estimate_memory
from dse.model.costmodel._layout import resolve
from dse.model.costmodel.memory import GIB, Coefficients, layer_activations
from dse.space.searchspace import ModelSpec, Resources, Semantics

L, H, N, D, G, F, V_PAD, S, B = 2, 64, 4, 16, 2, 256, 1024, 32, 2
Q, KV = N * D, G * D
T = B * S
A = 2

# parameters, written out
ATTN = H * (Q + 2 * KV) + Q * H  # QKV + output projection = 12288
NORMS = 2 * H  # two RMSNorms per layer
MLP = H * 2 * F + F * H  # SwiGLU fc1 (gate + up) and fc2 = 49152
PARAMS_TP1 = L * (ATTN + NORMS + MLP) + 2 * V_PAD * H + H  # + embedding, output, final norm
# TP=2: projections and MLP split, norms replicated, vocab split (1024 = 4 * 256)
PARAMS_TP2 = L * ((ATTN + MLP) // 2 + NORMS) + 2 * V_PAD * H // 2 + H


def _mem(model, sem, res, **params) -> MemoryEstimate:
    return estimate_memory(model, sem, res, params)


def test_parameter_counts_by_hand(small_model, small_semantics, one_gpu):
    assert PARAMS_TP1 == 254272
    est = _mem(small_model, small_semantics, one_gpu, micro_batch_size=B)
    assert est.weights_gib * GIB == pytest.approx(2 * PARAMS_TP1)
    two = Resources(world_size=2, gpu_memory_gib=80.0, features=[])
    est2 = _mem(
        small_model, small_semantics, two, micro_batch_size=B, tensor_model_parallel_size=2
    )
    assert est2.weights_gib * GIB == pytest.approx(2 * PARAMS_TP2)


def test_gradients_in_main_grad_dtype(small_model, small_semantics, one_gpu):
    fp32 = _mem(small_model, small_semantics, one_gpu, micro_batch_size=B)
    assert fp32.gradients_gib * GIB == pytest.approx(4 * PARAMS_TP1)
    bf16 = _mem(
        small_model, small_semantics, one_gpu, micro_batch_size=B,
        use_precision_aware_optimizer=True, use_distributed_optimizer=True,
        main_grads_dtype="bf16", grad_reduce_in_fp32=False,
    )  # fmt: skip
    assert bf16.gradients_gib * GIB == pytest.approx(2 * PARAMS_TP1)
    forced = _mem(
        small_model, small_semantics, one_gpu, micro_batch_size=B, main_grads_dtype="bf16",
        use_precision_aware_optimizer=True, grad_reduce_in_fp32=True,
    )  # fmt: skip
    assert forced.gradients_gib * GIB == pytest.approx(4 * PARAMS_TP1)


def test_optimizer_state_sharded_by_distributed_optimizer(small_model, small_semantics):
    two = Resources(world_size=2, gpu_memory_gib=80.0, features=[])
    # fp32 master weights + two fp32 Adam moments = 12 bytes per parameter
    plain = _mem(small_model, small_semantics, two, micro_batch_size=B)
    assert plain.optimizer_gib * GIB == pytest.approx(12 * PARAMS_TP1)
    dist = _mem(
        small_model, small_semantics, two, micro_batch_size=B, use_distributed_optimizer=True
    )
    assert dist.optimizer_gib * GIB == pytest.approx(12 * PARAMS_TP1 / 2)  # DP = 2
    # precision-aware: fp16 master (2) + bf16 moments (2 + 2) = 6 bytes, sharded over DP
    pa = _mem(
        small_model, small_semantics, two, micro_batch_size=B, use_distributed_optimizer=True,
        use_precision_aware_optimizer=True, main_params_dtype="fp16", exp_avg_dtype="bf16",
        exp_avg_sq_dtype="bf16",
    )  # fmt: skip
    assert pa.optimizer_gib * GIB == pytest.approx(6 * PARAMS_TP1 / 2)


def test_expert_optimizer_state_over_expert_data_parallel(small_semantics):
    moe = ModelSpec(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
        vocab_size=1000, num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128,
    )  # fmt: skip
    res = Resources(world_size=4, features=[])
    est = estimate_memory(
        moe, small_semantics, res,
        {"micro_batch_size": 1, "expert_model_parallel_size": 2,
         "use_distributed_optimizer": True},
    )  # fmt: skip
    attn = 64 * (64 + 2 * 64) + 64 * 64  # MHA: kv = q = 64
    expert = 64 * 2 * 128 + 128 * 64  # one SwiGLU expert of width 128
    dense = 2 * (attn + 2 * 64 + 64 * 4) + 2 * 1024 * 64 + 64  # + router (h * experts)
    experts_here = 2 * (4 // 2) * expert  # EP=2: two experts per rank, on each layer
    # dense state over DP=4, experts over expert-DP = 4 / (ETP 1 * EP 2) = 2
    want = 12 * (dense / 4 + experts_here / 2)
    assert est.optimizer_gib * GIB == pytest.approx(want)
    assert est.weights_gib * GIB == pytest.approx(2 * (dense + experts_here))


def test_layer_activations_unfused_no_recompute(small_model, small_semantics, one_gpu):
    lay = resolve(small_model, small_semantics, one_gpu, {"micro_batch_size": B})
    act = layer_activations(small_model, small_semantics, lay)
    assert act.norms == 4 * A * H * T  # two norms: input + output each
    # GQA: q, K and V expanded to all 4 heads, plus the context (proj input) copy
    assert act.attention == (3 * A * Q + A * Q) * T
    # fp32 softmax output + bf16 probabilities per score; b * n * s * s scores
    assert act.scores == (4 + A) * B * N * S * S
    assert act.masks == S * S  # one bool causal mask per layer
    # fc1 output (2f) + unfused SwiGLU keeps silu(x), x_lin + 0 and the product (3 f)
    assert act.mlp == (A * 2 * F + 3 * A * F) * T


def test_layer_activations_fusion_sdpa_and_recompute(small_model, small_semantics, one_gpu):
    def act(**p):
        lay = resolve(small_model, small_semantics, one_gpu, {"micro_batch_size": B, **p})
        return layer_activations(small_model, small_semantics, lay)

    assert act(bias_activation_fusion=True).mlp == (A * 2 * F + A * F) * T
    sdpa = act(attention_backend="sdpa")
    # QKV output kept by the v view + new q, k from RoPE + output + fp32 log-sum-exp per head
    assert sdpa.attention == (A * (Q + 2 * KV) + A * (Q + KV) + A * Q + 4 * N) * T
    assert sdpa.scores == 0 and sdpa.masks == 0
    sel = act(recompute="selective")
    assert sel.attention == (A * (Q + 2 * KV) + A * (Q + KV) + A * Q) * T
    assert sel.scores == 0
    full = act(recompute="full")
    assert full.total == A * H * T  # only the layer input


def test_layer_activations_tensor_and_sequence_parallel(small_model, small_semantics):
    two = Resources(world_size=2, features=["transformer_engine"])
    lay = resolve(
        small_model, small_semantics, two,
        {"micro_batch_size": B, "tensor_model_parallel_size": 2, "attention_backend": "te"},
    )  # fmt: skip
    act = layer_activations(small_model, small_semantics, lay)
    q2, kv2 = Q // 2, KV // 2  # heads and groups split over TP = 2
    assert act.norms == 4 * A * H * T  # no SP: the norm region is replicated
    assert act.attention == (A * (q2 + 2 * kv2) + A * (q2 + kv2) + A * q2 + 4 * N // 2) * T
    assert act.mlp == (A * 2 * (F // 2) + 3 * A * (F // 2)) * T
    lay_sp = resolve(
        small_model, small_semantics, two,
        {"micro_batch_size": B, "tensor_model_parallel_size": 2, "attention_backend": "te",
         "sequence_parallel": True},
    )  # fmt: skip
    assert layer_activations(small_model, small_semantics, lay_sp).norms == 4 * A * H * T / 2


def _static(params: int, grad: int = 4, opt: float = 12) -> float:
    return (2 + grad + opt) * params


def test_peak_unfused_no_recompute_by_hand(small_model, small_semantics):
    # apex present: fused Adam, no optimizer temporaries
    res = Resources(world_size=1, gpu_memory_gib=80.0, features=["apex"])
    est = estimate_memory(small_model, small_semantics, res, {"micro_batch_size": B})
    e2 = B * N * S * S  # score elements of one layer
    norms, attn, mlp = 4 * A * H * T, 4 * A * Q * T, (A * 2 * F + 3 * A * F) * T
    saved_act = L * (norms + attn + mlp) + 2 * A * H * T  # + final norm input/output
    saved_scores = L * ((4 + A) * e2 + S * S) + A * e2  # + Megatron's persistent score buffer
    logits = (A + 4) * V_PAD * T  # bf16 logits + the fp32 copy of the cross entropy
    backward_attn = saved_act - mlp + saved_scores - A * e2 + 3 * 4 * e2
    backward_mlp = saved_act + saved_scores + A * T * 3 * F + A * H * 3 * F
    forward_end = saved_act + saved_scores + logits
    peak = max(backward_attn, backward_mlp, forward_end)
    assert peak == forward_end
    assert est.peak_phase == "forward_end"
    assert est.allocated_gib * GIB == pytest.approx(_static(PARAMS_TP1) + peak)
    assert est.logits_gib * GIB == pytest.approx(logits)
    assert est.activations_gib * GIB == pytest.approx(saved_act)
    assert est.attention_scores_gib * GIB == pytest.approx(saved_scores)
    assert est.transient_gib == 0.0


def test_peak_optimizer_step_with_torch_adam(small_model, small_semantics, one_gpu):
    # no apex/TE: torch's multi-tensor Adam allocates one fp32 temporary per parameter,
    # which for this tiny model is larger than any activation peak
    est = _mem(small_model, small_semantics, one_gpu, micro_batch_size=B)
    assert est.peak_phase == "optimizer_step"
    e2 = B * N * S * S
    assert est.transient_gib * GIB == pytest.approx(4 * PARAMS_TP1)
    assert est.allocated_gib * GIB == pytest.approx(_static(PARAMS_TP1) + 4 * PARAMS_TP1 + A * e2)


def test_recompute_and_backend_order_the_peak(small_model):
    sem = Semantics(global_batch_size=8, seq_length=1024)
    res = Resources(world_size=1, gpu_memory_gib=80.0, features=["apex"])
    peaks = {
        (rc, att): estimate_memory(
            small_model, sem, res,
            {"micro_batch_size": 4, "recompute": rc, "attention_backend": att},
        ).allocated_gib
        for rc in ("none", "selective", "full")
        for att in ("unfused", "sdpa")
    }  # fmt: skip
    assert peaks["none", "unfused"] > peaks["selective", "unfused"] > peaks["full", "unfused"]
    assert peaks["none", "sdpa"] < peaks["none", "unfused"]
    assert peaks["full", "sdpa"] <= peaks["none", "sdpa"]


def test_pipeline_inflight_microbatches(small_model, small_semantics):
    from dse.model.costmodel.memory import inflight_layer_microbatches

    res = Resources(world_size=4, features=[])
    lay = resolve(small_model, small_semantics, res, {"pipeline_model_parallel_size": 4})
    # m = GBS / (MBS * DP) = 8 micro-batches; 1F1B: stage r holds min(PP - r, m)
    assert inflight_layer_microbatches(lay, 1, 0) == (4.0, 4)
    assert inflight_layer_microbatches(lay, 1, 3) == (1.0, 1)
    lay_v = resolve(
        ModelSpec(num_layers=8, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                  vocab_size=1000),
        small_semantics, res,
        {"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2},
    )  # fmt: skip
    # interleaved: 2(PP-1) + (v-1)PP + 1 = 11 chunks of layers/v = 1 layer on the first stage
    assert inflight_layer_microbatches(lay_v, 2, 0) == (11.0, 6)


def test_total_adds_fragmentation_and_context(small_model, small_semantics, one_gpu):
    co = Coefficients(fragmentation=0.2, context_gib=1.0)
    est = estimate_memory(small_model, small_semantics, one_gpu, {"micro_batch_size": B}, co)
    assert est.fragmentation_gib == pytest.approx(0.2 * (est.activations_gib
                                                         + est.attention_scores_gib
                                                         + est.logits_gib))  # fmt: skip
    assert est.total_gib == pytest.approx(est.allocated_gib + est.fragmentation_gib + 1.0)
    d = est.as_dict()
    assert d["total_gib"] == pytest.approx(est.total_gib, abs=1e-3)
    assert {
        "weights_gib",
        "gradients_gib",
        "optimizer_gib",
        "activations_gib",
        "logits_gib",
    } <= set(d)
    with pytest.raises(AttributeError):
        est.weights_gib = 1.0  # type: ignore[misc]


def test_activation_scale_scales_activation_terms(small_model):
    sem = Semantics(global_batch_size=8, seq_length=1024)
    res = Resources(world_size=1, features=["apex"])
    base = estimate_memory(small_model, sem, res, {"micro_batch_size": 8})
    more = estimate_memory(
        small_model, sem, res, {"micro_batch_size": 8}, Coefficients(activation_scale=2.0)
    )
    assert more.static_gib == pytest.approx(base.static_gib)
    assert more.activation_dependent_gib == pytest.approx(2 * base.activation_dependent_gib)


def test_unknown_knob_is_an_error(small_model, small_semantics, one_gpu):
    from dse.core.exceptions import UnknownKnobError

    with pytest.raises(UnknownKnobError):
        _mem(small_model, small_semantics, one_gpu, micro_batchsize=2)


def test_gpu_spec_lookup():
    from dse.model.costmodel import gpu_spec

    assert gpu_spec("NVIDIA H200").bf16_tflops == 989.0
    assert gpu_spec("NVIDIA H100 80GB HBM3").hbm_tbps == 3.35
    assert gpu_spec("NVIDIA A100-SXM4-80GB").bf16_tflops == 312.0
    assert isinstance(gpu_spec("mystery accelerator"), GPUSpec)
    assert gpu_spec(None).name.startswith("unknown")


def test_gradient_buffer_follows_grad_reduce_in_fp32(small_model, small_semantics, one_gpu):
    """Megatron-Core DDP's grad buffer is fp32 with grad_reduce_in_fp32, else the parameter
    dtype (bf16), whatever the optimizer's main_grads_dtype says."""
    bf16 = _mem(
        small_model, small_semantics, one_gpu, micro_batch_size=B, grad_reduce_in_fp32=False
    )
    assert bf16.gradients_gib * GIB == pytest.approx(2 * PARAMS_TP1)
    assert bf16.details["grad_bytes_per_param"] == 2
    fp32 = _mem(
        small_model, small_semantics, one_gpu, micro_batch_size=B, grad_reduce_in_fp32=True
    )
    assert fp32.gradients_gib * GIB == pytest.approx(4 * PARAMS_TP1)


def test_dropout_masks_are_counted_where_tp_does_not_shard_them(small_model, small_semantics):
    two = Resources(world_size=2, gpu_memory_gib=80.0, features=[])
    drop = small_model.model_copy(update={"hidden_dropout": 0.1, "attention_dropout": 0.1})

    def layer(model: ModelSpec, **params):
        p = {"tensor_model_parallel_size": 2, "micro_batch_size": B, **params}
        return layer_activations(model, small_semantics, resolve(model, small_semantics, two, p))

    base, d = layer(small_model), layer(drop)
    # two bool masks of the residual stream (bias-dropout-add after attention and MLP): TP
    # leaves the whole sequence on every rank without sequence parallelism
    assert d.norms - base.norms == pytest.approx(2 * H * T)
    # a bool mask per attention probability; TP splits the heads
    assert d.scores - base.scores == pytest.approx(B * (N // 2) * S * S)
    sp = {"sequence_parallel": True}
    assert layer(drop, **sp).norms - layer(small_model, **sp).norms == pytest.approx(H * T)
    full = {"recompute": "full"}
    assert layer(drop, **full).total == layer(small_model, **full).total  # recomputed
    est = estimate_memory(
        drop, small_semantics, two, {"tensor_model_parallel_size": 2, "micro_batch_size": B}
    )
    est0 = estimate_memory(
        small_model, small_semantics, two, {"tensor_model_parallel_size": 2, "micro_batch_size": B}
    )
    assert est.allocated_gib > est0.allocated_gib
