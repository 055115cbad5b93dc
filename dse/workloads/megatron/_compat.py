"""Caller-side fixes for megatron-core 0.16.1 without Transformer Engine (CPU and GPU).

Applied inside the trial process (never at import time), after megatron is importable and
before the model is built:

* ``megatron.core.transformer.moe.moe_utils`` binds ``te_general_gemm`` only when
  Transformer Engine imports, but ``RouterGatingLinearFunction`` reads the name
  unconditionally: every MoE router then fails with ``NameError``. Binding it to ``None``
  selects the module's own torch matmul path.
* Without Apex or Transformer Engine, ``megatron.core.optimizer.clip_grads`` computes the
  gradient norm with ``megatron.core.utils.local_multi_tensor_l2_norm``, which turns the
  list of per-tensor norms into a host tensor: one device-to-host copy, and so one wait for
  the GPU, per parameter tensor and step (105 a step for the 0.9B example on the H200,
  ``bench/host_jitter.py --count-syncs``). The fused kernels of Apex and Transformer Engine
  stay on the device; :func:`l2_norm_on_device` does the same sum in float32 on the
  gradients' device (on the H200: 5 syncs per step instead of 105; the step time did not
  move beyond its spread, docs/BENCHMARKS.md section 17).
"""

from __future__ import annotations

from typing import Any

__all__ = ["apply", "l2_norm_on_device"]


def l2_norm_on_device(
    chunk_size: int, noop_flag: Any, tensor_lists: list[list[Any]], per_tensor: bool, *args: Any
) -> tuple[Any, None]:
    """``local_multi_tensor_l2_norm``'s result (the L2 norm of all tensors, float32, shape
    ``[1]``) computed where the tensors are, without a copy to the host."""
    import torch

    tensors = [t for group in tensor_lists for t in group]
    if not tensors:
        return torch.zeros(1, dtype=torch.float), None
    norms = torch.stack([torch.linalg.vector_norm(t).float() for t in tensors])
    return torch.linalg.vector_norm(norms).reshape(1), None


def apply() -> list[str]:
    """Apply the fixes that this megatron-core needs; return the names of those applied."""
    applied: list[str] = []
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        applied.append("moe_utils.te_general_gemm=None")
    if getattr(clip_grads, "l2_norm_impl", None) is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = l2_norm_on_device
        applied.append("clip_grads.l2_norm_impl=l2_norm_on_device")
    return applied
