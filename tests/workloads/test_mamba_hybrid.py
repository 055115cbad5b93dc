"""Hybrid (Mamba) models in the built-in trainer: the local Mamba spec, the labelled kernel
stand-ins, the plan's checks, and real Megatron-Core training of a tiny Mamba-MoE hybrid on
CPU (Megatron's MambaModel / MambaStack / MambaMixer; only the SSD scan and gated norm run on
dse's torch reference, which the trial reports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dse.core.records import TrialSpec
from dse.workloads.megatron._plan import TrialFailure, make_plan
from tests.conftest import needs_megatron
from tests.workloads.test_megatron_trainer import make_spec, run_trial

HYBRID = {
    "num_layers": 5,
    "hybrid_layer_pattern": "M*-ME",
    "activation": "squared_relu",
    "position_embedding_type": "none",
    "num_moe_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 64,
    "moe_shared_expert_intermediate_size": 64,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "mamba_state_dim": 16,
    "mamba_num_groups": 2,
    "mamba_chunk_size": 32,
}
DENSE_HYBRID = {
    k: v
    for k, v in HYBRID.items()
    if k not in ("num_moe_experts", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size")
} | {"hybrid_layer_pattern": "M*-M-"}
SEM = {"global_batch_size": 4, "steps": 3, "warmup_steps": 1}


def _spec(tmp: Path, name: str, params: dict[str, Any], **kw: Any) -> TrialSpec:
    model = kw.pop("model", HYBRID)
    return make_spec(tmp, name, {"attention_backend": "sdpa", **params}, model=model,
                     semantics=SEM, **kw)  # fmt: skip


# --- torch computations of the stand-ins (torch only; needs_megatron: the megatron extra) --


def _ssd_by_recurrence(x, dt, A, B, C, D, z):  # noqa: N803 - the SSD's names
    """The SSD scan step by step:
    s_t = exp(dt_t A) s_{t-1} + dt_t B_t x_t, y_t = C_t s_t + D x_t (gated by silu(z))."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    b, length, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    state = torch.zeros(b, h, p, n, dtype=torch.float64)
    ys = []
    for t in range(length):
        bt = B[:, t].repeat_interleave(h // g, dim=1).double()  # (b, h, n)
        ct = C[:, t].repeat_interleave(h // g, dim=1).double()
        decay = torch.exp(dt[:, t].double() * A.double())  # (b, h)
        step = dt[:, t].double()[..., None, None] * x[:, t].double()[..., None]
        state = decay[..., None, None] * state + step * bt[:, :, None, :]
        y = (state * ct[:, :, None, :]).sum(-1) + D.double()[None, :, None] * x[:, t].double()
        ys.append(y * F.silu(z[:, t].double()))
    return torch.stack(ys, dim=1)


@needs_megatron
def test_ssd_reference_matches_the_recurrence() -> None:
    import torch

    from dse.workloads.megatron._mamba_kernels import ssd_reference

    g = torch.Generator().manual_seed(0)
    b, length, h, p, groups, n = 2, 12, 4, 3, 2, 5
    x = torch.randn(b, length, h, p, generator=g)
    dt = torch.rand(b, length, h, generator=g) * 0.5
    A = -torch.rand(h, generator=g) - 0.1  # noqa: N806
    B = torch.randn(b, length, groups, n, generator=g)  # noqa: N806
    C = torch.randn(b, length, groups, n, generator=g)  # noqa: N806
    D = torch.randn(h, generator=g)  # noqa: N806
    z = torch.randn(b, length, h, p, generator=g)
    got = ssd_reference(x, dt, A, B, C, D, z)
    want = _ssd_by_recurrence(x, dt, A, B, C, D, z)
    assert torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)
    # softplus(dt + bias) is the mixer's dt; the reference applies it when asked
    bias = torch.randn(h, generator=g)
    raw = torch.randn(b, length, h, generator=g)
    soft = ssd_reference(x, raw, A, B, C, D, z, dt_bias=bias, dt_softplus=True)
    direct = ssd_reference(x, torch.nn.functional.softplus(raw + bias), A, B, C, D, z)
    assert torch.allclose(soft, direct, atol=1e-6)


@needs_megatron
def test_conv1d_stand_in_matches_torch_conv_and_its_gradients() -> None:
    """The causal_conv1d_cuda stand-in writes what nn.Conv1d (causal, depthwise) computes,
    forward and backward, into the caller's buffers as the extension does."""
    import torch

    from dse.workloads.megatron import _mamba_kernels as mk

    g = torch.Generator().manual_seed(1)
    b, d, s, w = 2, 6, 9, 4
    x = torch.randn(b, s, d, generator=g).transpose(1, 2)  # channels-last, as mamba passes it
    weight = torch.randn(d, w, generator=g)
    bias = torch.randn(d, generator=g)
    conv = torch.nn.Conv1d(d, d, w, groups=d, padding=w - 1)
    with torch.no_grad():
        conv.weight.copy_(weight.unsqueeze(1))
        conv.bias.copy_(bias)
    xr = x.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.silu(conv(xr)[..., :s])
    out = torch.empty_like(x)
    mk._conv_fwd(x, weight, bias, None, None, out, None, True)
    assert torch.allclose(out, ref, atol=1e-6)
    dout = torch.randn(b, d, s, generator=g)
    ref.backward(dout)
    dx, dw, db = torch.empty_like(x), torch.zeros(d, w), torch.zeros(d)
    mk._conv_bwd(x, weight, bias, dout, None, None, None, dx, dw, db, None, True)
    assert torch.allclose(dx, xr.grad, atol=1e-5)
    assert torch.allclose(dw, conv.weight.grad.squeeze(1), atol=1e-5)
    assert torch.allclose(db, conv.bias.grad, atol=1e-5)
    with pytest.raises(NotImplementedError, match="seq_idx"):
        mk._conv_fwd(x, weight, bias, torch.zeros(1), None, out, None, True)
    # causal-conv1d calls the extension inside a torch.library custom op, below autograd:
    # the stand-in's backward must not rely on autograd there
    schema = (
        "(Tensor x, Tensor w, Tensor b, Tensor g, Tensor(a!) dx, Tensor(b!) dw, Tensor(c!) db) "
        "-> ()"
    )

    @torch.library.custom_op("dse_test::conv_bwd", mutates_args={"dx", "dw", "db"}, schema=schema)
    def op(x, w, b, g, dx, dw, db):  # type: ignore[no-untyped-def]
        mk._conv_bwd(x, w, b, g, None, None, None, dx, dw, db, None, True)

    dx2, dw2, db2 = torch.empty_like(x), torch.zeros(d, w), torch.zeros(d)
    op(x, weight, bias, dout, dx2, dw2, db2)
    assert torch.allclose(dx2, dx) and torch.allclose(dw2, dw) and torch.allclose(db2, db)


@needs_megatron
def test_memory_efficient_reference_is_conv_then_scan_then_gate() -> None:
    """The split scan (mem-eff path) equals the default path's pieces: conv1d + silu, the
    scan with the z gate (Megatron then applies the gated norm without z)."""
    import torch

    from dse.workloads.megatron import _mamba_kernels as mk

    g = torch.Generator().manual_seed(2)
    b, length, h, p, groups, n, w = 2, 10, 4, 8, 2, 4, 4
    dim = h * p
    conv_dim = dim + 2 * groups * n
    zxbcdt = torch.randn(b, length, 2 * dim + 2 * groups * n + h, generator=g)
    weight = torch.randn(conv_dim, w, generator=g) * 0.3
    bias = torch.randn(conv_dim, generator=g) * 0.1
    dt_bias, A, D = torch.randn(h, generator=g), -torch.rand(h, generator=g), torch.ones(h)  # noqa: N806
    got = mk._split_conv1d_scan(zxbcdt, weight, bias, dt_bias, A, D, 4, headdim=p, ngroups=groups)
    z, xbc, dt = torch.split(zxbcdt, [dim, conv_dim, h], dim=-1)
    xbc = mk.causal_conv1d_reference(xbc.transpose(1, 2), weight, bias, True).transpose(1, 2)
    x, B, C = torch.split(xbc, [dim, groups * n, groups * n], dim=-1)  # noqa: N806
    want = mk.ssd_reference(
        x.reshape(b, length, h, p), dt, A, B.reshape(b, length, groups, n),
        C.reshape(b, length, groups, n), D, z.reshape(b, length, h, p), dt_bias, True,
    ).reshape(b, length, dim)  # fmt: skip
    assert torch.allclose(got, want, atol=1e-6)


@needs_megatron
def test_gated_norm_reference_groups_and_gate_order() -> None:
    import torch

    from dse.workloads.megatron._mamba_kernels import gated_rms_norm_reference

    x = torch.tensor([[3.0, 4.0, 1.0, 1.0]])
    z = torch.zeros(1, 4)
    w = torch.ones(4)
    # groups of 2: [3, 4] has rms sqrt(12.5), [1, 1] rms 1
    plain = gated_rms_norm_reference(x, w, None, 0.0, 2, False)
    assert torch.allclose(plain, torch.tensor([[3 / 12.5**0.5, 4 / 12.5**0.5, 1.0, 1.0]]))
    # norm_before_gate=False gates first: silu(0) = 0 -> all zero (eps keeps it finite)
    gated = gated_rms_norm_reference(x, w, z, 1e-6, 2, False)
    assert torch.count_nonzero(gated) == 0


# --- the spec and the plan ----------------------------------------------------------------


_SPEC_CHECK = """
from dse.workloads.megatron import _cpu_shims, _mamba_kernels
_cpu_shims.install()  # megatron's Mamba mixer imports a triton module (stubbed on CPU)
_mamba_kernels.install_cpu_reference()
from megatron.core.ssm.mamba_block import MambaStack
from megatron.core.ssm.mamba_mixer import MambaMixer
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from dse.workloads.megatron._sdpa import SDPAttention
from dse.workloads.megatron.mamba import mamba_stack_spec

spec = mamba_stack_spec(normalization="RMSNorm", attention_backend="sdpa", num_experts=4,
                        moe_grouped_gemm=False, chunk_size=64)
assert issubclass(spec.module, MambaStack) and spec.module is not MambaStack
assert spec.params["final_norm"] is WrappedTorchNorm
mixer = spec.submodules.mamba_layer.submodules.mixer
assert mixer.module is MambaMixer and mixer.params == {"chunk_size": 64}
assert mixer.submodules.in_proj is ColumnParallelLinear
assert mixer.submodules.out_proj is RowParallelLinear
assert spec.submodules.mamba_layer.submodules.norm is WrappedTorchNorm
attn = spec.submodules.attention_layer.submodules
assert attn.self_attention.submodules.core_attention is SDPAttention
assert attn.input_layernorm is WrappedTorchNorm
assert spec.submodules.moe_layer.submodules.mlp.module is MoELayer
unfused = mamba_stack_spec(normalization="RMSNorm", attention_backend="unfused",
                           num_experts=None, moe_grouped_gemm=False, chunk_size=128)
core = unfused.submodules.attention_layer.submodules.self_attention.submodules
assert core.core_attention is not SDPAttention
try:
    mamba_stack_spec(normalization="RMSNorm", attention_backend="te", num_experts=None,
                     moe_grouped_gemm=False, chunk_size=128)
except ValueError as e:
    assert "sdpa or unfused" in str(e)
else:
    raise AssertionError("te accepted")
print("SPEC-OK")
"""


@needs_megatron
def test_local_mamba_spec_is_built_from_megatron_core_parts() -> None:
    """The stack spec uses Megatron-Core's own non-TE parts and a MambaStack subclass for
    the final norm (a process of its own: the CPU shims are process-wide)."""
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _SPEC_CHECK],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "SPEC-OK" in proc.stdout, proc.stderr[-3000:]


def test_plan_accepts_a_hybrid_on_cpu_and_names_what_it_refuses(tmp_path: Path) -> None:
    plan = make_plan(_spec(tmp_path, "ok", {}), [])
    assert plan.hybrid and plan.mamba_mem_eff_path
    assert not make_plan(
        _spec(tmp_path, "d", {"use_mamba_mem_eff_path": False}), []
    ).mamba_mem_eff_path
    with pytest.raises(TrialFailure, match="local spec: attention_backend must be one of"):
        make_plan(_spec(tmp_path, "te", {"attention_backend": "te"}), ["transformer_engine"])
    with pytest.raises(TrialFailure, match="hybrid_full_recompute"):
        make_plan(_spec(tmp_path, "full", {"recompute": "full"}), [])
    with pytest.raises(TrialFailure, match="mamba_tp"):
        make_plan(_spec(tmp_path, "tp4", {"tensor_model_parallel_size": 4}, world=4,
                        model=DENSE_HYBRID), [])  # fmt: skip


def test_gpu_trial_without_the_triton_kernels_is_refused(tmp_path: Path) -> None:
    """On a GPU the Triton kernels are probed whatever the spec declares; the pre-launch rule
    names the missing feature where the features are known."""
    from dse.workloads.megatron.features import has_feature

    if has_feature("mamba_ssm"):
        pytest.skip("mamba-ssm's Triton kernels import here")
    spec = _spec(tmp_path, "g", {}).model_copy(update={"device": "cuda"})
    with pytest.raises(TrialFailure, match="Mamba layers need the mamba-ssm kernels") as err:
        make_plan(spec, ["mamba_ssm"])
    assert err.value.failure_class == "invalid" and "do not import here" in err.value.reason
    with pytest.raises(TrialFailure, match="missing_feature: Mamba layers need"):
        make_plan(spec, [])


def test_feature_probe_does_not_count_the_cpu_reference() -> None:
    """In a process where dse's CPU reference is registered as mamba_ssm.ops.triton, the
    probe still reports the Triton kernels absent, and the kernel path says reference."""
    code = (
        "from dse.workloads.megatron import _mamba_kernels as mk\n"
        "from dse.workloads.megatron.features import has_feature\n"
        "print(mk.install_cpu_reference(), has_feature('mamba_ssm'), mk.kernel_path(True))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split(maxsplit=2)  # fmt: skip
    assert out[:2] == ["torch-reference", "False"]
    assert "'ssd': 'torch-reference'" in out[2]


# --- real training on CPU (slow) -------------------------------------------------------------


@pytest.mark.slow
@needs_megatron
def test_hybrid_mamba_moe_trains_and_both_mamba_paths_agree(tmp_path: Path) -> None:
    """A Mamba-attention-MLP-Mamba-MoE model trains with Megatron-Core's MambaModel on CPU;
    the trial records the kernels it ran on (the torch reference, never passed off as
    mamba-ssm) and hybrid FLOPs; the memory-efficient and default paths give the same losses
    on the same seeded data and weights."""
    rc, mem_eff = run_trial(_spec(tmp_path, "eff", {}), tmp_path, torchrun=False)
    assert rc == 0 and mem_eff.ok, mem_eff.reason
    m = mem_eff.metrics
    assert m["mamba_kernels"] == {"ssd": "torch-reference", "conv1d": "torch-reference",
                                  "path": "mem_eff"}  # fmt: skip
    assert m["model_flops_per_step"] > 0 and m["tflops_per_gpu"] > 0
    rc, default = run_trial(
        _spec(tmp_path, "def", {"use_mamba_mem_eff_path": False}), tmp_path, torchrun=False
    )
    assert rc == 0 and default.ok, default.reason
    assert default.metrics["mamba_kernels"]["conv1d"] == "torch-nn.Conv1d"
    a, b = mem_eff.metrics["losses"], default.metrics["losses"]
    assert len(a) == len(b) == 3 and all(abs(x - y) < 1e-4 for x, y in zip(a, b, strict=True))


@pytest.mark.slow
@needs_megatron
def test_hybrid_trains_with_mamba_tensor_parallel(tmp_path: Path) -> None:
    """TP=2 splits Mamba heads and groups (4 and 2) across 2 ranks; it trains."""
    spec = _spec(tmp_path, "tp2", {"tensor_model_parallel_size": 2}, world=2, model=DENSE_HYBRID)
    env_before = dict(os.environ)
    rc, out = run_trial(spec, tmp_path)
    assert os.environ == env_before
    assert rc == 0 and out.ok, out.reason
    assert out.metrics["tp"] == 2 and len(out.metrics["losses"]) == 3
