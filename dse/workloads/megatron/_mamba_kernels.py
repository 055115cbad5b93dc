"""Which kernels a Mamba layer runs on, and the labelled torch stand-ins for the missing ones.

Megatron-Core's ``MambaMixer`` (``megatron/core/ssm/mamba_mixer.py``) calls three pieces of
mamba-ssm / causal-conv1d:

* the SSD scan, ``mamba_ssm.ops.triton.ssd_combined`` (``mamba_chunk_scan_combined``, and
  ``mamba_split_conv1d_scan_combined`` on the memory-efficient path), and the gated RMSNorm
  ``mamba_ssm.ops.triton.layernorm_gated.RMSNorm``: Triton kernels, which run on a GPU once
  the mamba-ssm sources are installed (no CUDA build needed);
* the causal depthwise convolution: on the default path ``causal_conv1d_fn`` when the
  compiled ``causal_conv1d_cuda`` extension exists, else torch's ``nn.Conv1d`` (Megatron's own
  fallback); the memory-efficient path has no fallback and calls
  ``causal_conv1d.cpp_functions`` (the compiled extension) directly.

Two stand-ins, both labelled wherever a trial reports its kernels (:func:`kernel_path`):

* :func:`install_conv1d_stand_in` registers a torch module as ``causal_conv1d_cuda`` (forward:
  ``F.conv1d``; backward: autograd of the same) where the compiled extension is absent, so
  that the memory-efficient path can run on a GPU without a CUDA build. It must run before
  mamba-ssm's ``ssd_combined`` is first imported (it binds the functions at import).
* :func:`install_cpu_reference` registers a torch *reference* of the SSD scan and of the gated
  RMSNorm as ``mamba_ssm.ops.triton.*`` for CPU trials only (tests and the embedded default:
  Triton does not run on a CPU). It is quadratic in the sequence length and never used on a
  GPU; a trial that ran on it says so.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

__all__ = [
    "STAND_IN_MARK",
    "has_module",
    "conv1d_kind",
    "install_conv1d_stand_in",
    "install_cpu_reference",
    "kernel_path",
    "ssd_kind",
    "ssd_reference",
    "causal_conv1d_reference",
    "gated_rms_norm_reference",
]

#: Attribute set on every module this file registers (the feature probe reads it).
STAND_IN_MARK = "__dse_stand_in__"


def _is_stand_in(module: Any) -> bool:
    return bool(getattr(module, STAND_IN_MARK, False))


def has_module(name: str) -> bool:
    """True when ``name`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# --- what is present ----------------------------------------------------------------------


def ssd_kind() -> str:
    """``triton`` (mamba-ssm's Triton SSD kernels import), ``torch-reference`` (this file's
    CPU reference is registered) or ``absent``. Imports the modules the way Megatron does:
    ``import mamba_ssm`` fails without its CUDA extension (``selective_scan_cuda``) but leaves
    ``mamba_ssm.ops.triton`` importable, and ``mamba_mixer`` tries the Triton modules after it."""
    mod = sys.modules.get("mamba_ssm.ops.triton.ssd_combined")
    if mod is not None and _is_stand_in(mod):
        return "torch-reference"
    try:
        importlib.import_module("mamba_ssm")
    except Exception:  # noqa: BLE001, S110 - expected without selective_scan_cuda
        pass
    try:
        ssd = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
        norm = importlib.import_module("mamba_ssm.ops.triton.layernorm_gated")
    except Exception:  # noqa: BLE001 - a broken install (missing triton, .so) counts as absent
        return "absent"
    if _is_stand_in(ssd):
        return "torch-reference"
    ok = all(
        hasattr(ssd, a) for a in ("mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")
    )
    return "triton" if ok and hasattr(norm, "RMSNorm") else "absent"


def conv1d_kind() -> str:
    """``compiled`` (``causal_conv1d_cuda`` is the real extension), ``torch-stand-in`` (this
    file's stand-in is registered under its name) or ``absent``."""
    mod = sys.modules.get("causal_conv1d_cuda")
    if mod is not None:
        return "torch-stand-in" if _is_stand_in(mod) else "compiled"
    try:
        mod = importlib.import_module("causal_conv1d_cuda")
    except Exception:  # noqa: BLE001 - absent or built for another torch
        return "absent"
    return "torch-stand-in" if _is_stand_in(mod) else "compiled"


def kernel_path(mem_eff: bool) -> dict[str, str]:
    """The kernels a Mamba layer of this process runs, as a trial records them:
    ``ssd`` (``mamba_ssm-triton`` or ``torch-reference``), ``conv1d`` (``causal_conv1d-compiled``,
    ``torch-stand-in`` where the extension is absent and the stand-in registered,
    ``torch-nn.Conv1d``: Megatron's fallback on the default path, ``torch-reference`` on a
    CPU), ``path`` (``mem_eff`` or ``default``)."""
    ssd = ssd_kind()
    conv = conv1d_kind()
    if ssd == "torch-reference":
        # the reference's split scan has its own torch conv; the default path takes nn.Conv1d
        conv_label = "torch-reference" if mem_eff else "torch-nn.Conv1d"
    elif conv == "compiled":
        conv_label = "causal_conv1d-compiled"
    elif mem_eff:
        conv_label = "torch-stand-in" if conv == "torch-stand-in" else "absent"
    else:
        # Megatron falls back to nn.Conv1d when `from causal_conv1d import ...` fails or
        # binds the stand-in's package functions; with the stand-in registered it binds them
        conv_label = "torch-stand-in" if conv == "torch-stand-in" else "torch-nn.Conv1d"
    return {
        "ssd": {"triton": "mamba_ssm-triton"}.get(ssd, ssd),
        "conv1d": conv_label,
        "path": "mem_eff" if mem_eff else "default",
    }


# --- torch computations (shared by the stand-ins; tested against each other) ---------------


def causal_conv1d_reference(x: Any, weight: Any, bias: Any, silu: bool) -> Any:
    """Depthwise causal convolution of ``x`` (batch, dim, seq) with ``weight`` (dim, width)."""
    import torch.nn.functional as F  # noqa: N812

    width = weight.shape[-1]
    out = F.conv1d(F.pad(x, (width - 1, 0)), weight.unsqueeze(1), bias, groups=x.shape[1])
    return F.silu(out) if silu else out


def ssd_reference(
    x: Any,
    dt: Any,
    A: Any,  # noqa: N803 - the SSD's names
    B: Any,  # noqa: N803
    C: Any,  # noqa: N803
    D: Any = None,  # noqa: N803
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> Any:
    """The Mamba-2 SSD scan in its quadratic (masked attention-like) form, fp32 inside.

    ``x`` (b, l, h, p), ``dt`` (b, l, h), ``A`` (h), ``B``/``C`` (b, l, g, n) shared by h/g
    heads each, ``D`` (h) or (h, p); ``z`` gates the output with silu. State recurrence:
    ``s_t = exp(dt_t A) s_{t-1} + dt_t B_t x_t``, ``y_t = C_t s_t + D x_t``.
    """
    import torch
    import torch.nn.functional as F  # noqa: N812

    dtype = x.dtype
    xf, dtf = x.float(), dt.float()
    if dt_bias is not None:
        dtf = dtf + dt_bias.float()
    if dt_softplus:
        dtf = F.softplus(dtf)
    heads, groups = x.shape[2], B.shape[2]
    Bh = B.float().repeat_interleave(heads // groups, dim=2)  # noqa: N806
    Ch = C.float().repeat_interleave(heads // groups, dim=2)  # noqa: N806
    cum = (dtf * A.float()).cumsum(dim=1)  # (b, l, h)
    seg = cum[:, :, None, :] - cum[:, None, :, :]  # (b, t, s, h): sum of dt*A over (s, t]
    length = x.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp(seg.masked_fill(~causal[None, :, :, None], float("-inf")))
    scores = torch.einsum("bthn,bshn->btsh", Ch, Bh) * decay
    y = torch.einsum("btsh,bsh,bshp->bthp", scores, dtf, xf)
    if D is not None:
        y = y + xf * (D.float()[:, None] if D.dim() == 1 else D.float())
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(dtype)


def gated_rms_norm_reference(
    x: Any, weight: Any, z: Any, eps: float, group_size: int | None, norm_before_gate: bool
) -> Any:
    """mamba-ssm's gated RMSNorm: ``rmsnorm(x * silu(z))`` (``norm_before_gate=False``) or
    ``rmsnorm(x) * silu(z)``, normalised over groups of ``group_size`` channels."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    dtype = x.dtype
    xf = x.float()
    if z is not None and not norm_before_gate:
        xf = xf * F.silu(z.float())
    size = group_size or x.shape[-1]
    g = xf.reshape(*xf.shape[:-1], x.shape[-1] // size, size)
    g = g * torch.rsqrt(g.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = g.reshape(xf.shape) * weight.float()
    if z is not None and norm_before_gate:
        out = out * F.silu(z.float())
    return out.to(dtype)


# --- the causal_conv1d_cuda stand-in (GPU without the CUDA build) ----------------------------


def _conv_fwd(
    x: Any,
    weight: Any,
    bias: Any,
    seq_idx: Any,
    initial_states: Any,
    out: Any,
    final_states_out: Any,
    silu_activation: bool,
) -> None:
    """``causal_conv1d_cuda.causal_conv1d_fwd`` in torch: writes ``out``."""
    if seq_idx is not None or initial_states is not None or final_states_out is not None:
        raise NotImplementedError(
            "the torch stand-in for causal_conv1d_cuda has no seq_idx / initial or final "
            "states (packed sequences, inference)"
        )
    import torch

    with torch.no_grad():
        out.copy_(causal_conv1d_reference(x, weight, bias, silu_activation))


def _conv_bwd(
    x: Any,
    weight: Any,
    bias: Any,
    dout: Any,
    seq_idx: Any,
    initial_states: Any,
    dfinal_states: Any,
    dx: Any,
    dweight: Any,
    dbias: Any,
    dinitial_states: Any,
    silu_activation: bool,
) -> None:
    """``causal_conv1d_cuda.causal_conv1d_bwd`` in torch: writes ``dx``, ``dweight`` and
    ``dbias``. Computed by hand (fp32), not by autograd: a ``torch.library`` custom op (which
    causal-conv1d wraps the extension in) runs below autograd."""
    if seq_idx is not None or initial_states is not None or dfinal_states is not None:
        raise NotImplementedError(
            "the torch stand-in for causal_conv1d_cuda has no seq_idx / initial or final states"
        )
    import torch
    import torch.nn.functional as F  # noqa: N812

    with torch.no_grad():
        width = weight.shape[-1]
        length = x.shape[-1]
        xf, wf, gf = x.float(), weight.float(), dout.float()
        xpad = F.pad(xf, (width - 1, 0))
        pre = F.conv1d(xpad, wf.unsqueeze(1), bias.float() if bias is not None else None,
                       groups=x.shape[1])  # fmt: skip
        if silu_activation:
            sig = torch.sigmoid(pre)
            gf = gf * sig * (1 + pre * (1 - sig))
        del pre
        # dx[t] = sum_k w[k] g[t + W - 1 - k]: the anti-causal conv with the flipped kernel
        grad_x = F.conv1d(F.pad(gf, (0, width - 1)), wf.flip(-1).unsqueeze(1), groups=x.shape[1])
        dx.copy_(grad_x)
        del grad_x
        for k in range(width):
            dweight[:, k] = (gf * xpad[..., k : k + length]).sum(dim=(0, 2)).to(dweight.dtype)
        if dbias is not None:
            dbias.copy_(gf.sum(dim=(0, 2)))


def _conv_update(*args: Any, **kwargs: Any) -> None:
    raise NotImplementedError("the torch stand-in for causal_conv1d_cuda has no decode update")


def install_conv1d_stand_in() -> str:
    """Register the torch stand-in as ``causal_conv1d_cuda`` where the compiled extension is
    absent and the causal-conv1d Python package is installed; returns :func:`conv1d_kind`.
    Call before anything imports ``causal_conv1d`` or mamba-ssm's ``ssd_combined``."""
    kind = conv1d_kind()
    if kind != "absent" or not has_module("causal_conv1d"):
        return kind
    mod = types.ModuleType("causal_conv1d_cuda")
    mod.__doc__ = "dse's torch stand-in for the causal-conv1d CUDA extension (not compiled)"
    mod.causal_conv1d_fwd = _conv_fwd  # type: ignore[attr-defined]
    mod.causal_conv1d_bwd = _conv_bwd  # type: ignore[attr-defined]
    mod.causal_conv1d_update = _conv_update  # type: ignore[attr-defined]
    setattr(mod, STAND_IN_MARK, True)
    sys.modules["causal_conv1d_cuda"] = mod
    return "torch-stand-in"


# --- the CPU reference of mamba-ssm's Triton modules -------------------------------------------


def _chunk_scan(
    x: Any,
    dt: Any,
    A: Any,  # noqa: N803
    B: Any,  # noqa: N803
    C: Any,  # noqa: N803
    chunk_size: int,
    D: Any = None,  # noqa: N803
    z: Any = None,
    dt_bias: Any = None,
    initial_states: Any = None,
    seq_idx: Any = None,
    cu_seqlens: Any = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> Any:
    if initial_states is not None or seq_idx is not None or cu_seqlens is not None:
        raise NotImplementedError("the CPU SSD reference has no states or packed sequences")
    if return_final_states or return_varlen_states:
        raise NotImplementedError("the CPU SSD reference returns no final states (inference)")
    if dt_limit != (0.0, float("inf")):
        raise NotImplementedError("the CPU SSD reference has no dt_limit")
    return ssd_reference(x, dt, A, B, C, D, z, dt_bias, dt_softplus)


def _split_conv1d_scan(
    zxbcdt: Any,
    conv1d_weight: Any,
    conv1d_bias: Any,
    dt_bias: Any,
    A: Any,  # noqa: N803
    D: Any,  # noqa: N803
    chunk_size: int,
    initial_states: Any = None,
    seq_idx: Any = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    activation: str | None = "silu",
    rmsnorm_weight: Any = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: Any = None,
    outproj_bias: Any = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
) -> Any:
    import torch

    if initial_states is not None or seq_idx is not None or return_final_states:
        raise NotImplementedError("the CPU SSD reference has no states or packed sequences")
    if outproj_weight is not None:
        raise NotImplementedError("the CPU SSD reference has no fused output projection")
    nheads = D.shape[0]
    hd = headdim if D.dim() == 1 else D.shape[1]
    if hd is None:
        raise ValueError("headdim is required with a per-head D")
    dim = nheads * hd
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    b, length, total = zxbcdt.shape
    if total != 2 * dim + 2 * ngroups * dstate + nheads:
        raise NotImplementedError("the CPU SSD reference has no non-SSM (swiglu) part")
    z, xbc, dt = torch.split(zxbcdt, [dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    conv = causal_conv1d_reference(
        xbc.transpose(1, 2), conv1d_weight, conv1d_bias, activation in ("silu", "swish")
    ).transpose(1, 2)
    x, Bm, Cm = torch.split(conv, [dim, ngroups * dstate, ngroups * dstate], dim=-1)  # noqa: N806
    x = x.reshape(b, length, nheads, hd)
    Bm = Bm.reshape(b, length, ngroups, dstate)  # noqa: N806
    Cm = Cm.reshape(b, length, ngroups, dstate)  # noqa: N806
    zh = z.reshape(b, length, nheads, hd)
    y = ssd_reference(
        x, dt, A, Bm, Cm, D, zh if rmsnorm_weight is None else None, dt_bias, dt_softplus=True
    ).reshape(b, length, dim)
    if rmsnorm_weight is not None:
        y = gated_rms_norm_reference(
            y, rmsnorm_weight, z, rmsnorm_eps, dim // ngroups, norm_before_gate
        )
    return y


def _gated_norm_class() -> type:
    import torch

    class RMSNorm(torch.nn.Module):
        """Torch reference of mamba-ssm's gated RMSNorm (CPU only)."""

        def __init__(
            self,
            hidden_size: int,
            eps: float = 1e-5,
            group_size: int | None = None,
            norm_before_gate: bool = True,
            device: Any = None,
            dtype: Any = None,
        ) -> None:
            super().__init__()
            self.eps = eps
            self.group_size = group_size
            self.norm_before_gate = norm_before_gate
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
            self.register_parameter("bias", None)

        def reset_parameters(self) -> None:
            torch.nn.init.ones_(self.weight)

        def forward(self, x: Any, z: Any = None) -> Any:
            return gated_rms_norm_reference(
                x, self.weight, z, self.eps, self.group_size, self.norm_before_gate
            )

    return RMSNorm


def _no_decode(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the CPU SSD reference has no decode step (inference)")


def install_cpu_reference() -> str:
    """Register the torch reference as mamba-ssm's Triton modules, for a CPU trial process
    only (never on a GPU; the caller checks). Does nothing where the Triton modules import.
    Returns :func:`ssd_kind` afterwards. Call before ``megatron.core.ssm`` is imported."""
    kind = ssd_kind()
    if kind != "absent":
        return kind
    names = ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton")
    for name in names:
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = []  # a package (its submodules below are registered, not found)
            setattr(pkg, STAND_IN_MARK, True)
            sys.modules[name] = pkg
    ssd = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")
    ssd.mamba_chunk_scan_combined = _chunk_scan  # type: ignore[attr-defined]
    ssd.mamba_split_conv1d_scan_combined = _split_conv1d_scan  # type: ignore[attr-defined]
    norm = types.ModuleType("mamba_ssm.ops.triton.layernorm_gated")
    norm.RMSNorm = _gated_norm_class()  # type: ignore[attr-defined]
    state = types.ModuleType("mamba_ssm.ops.triton.selective_state_update")
    state.selective_state_update = _no_decode  # type: ignore[attr-defined]
    for mod in (ssd, norm, state):
        mod.__doc__ = "dse's torch reference of a mamba-ssm Triton module (CPU only)"
        setattr(mod, STAND_IN_MARK, True)
        sys.modules[mod.__name__] = mod
    sys.modules["mamba_ssm"].__version__ = "0.0+dse.cpu.reference"  # type: ignore[attr-defined]
    return ssd_kind()
