"""Caller-side fixes for megatron-core 0.16.1 without Transformer Engine (CPU and GPU).

Applied inside the trial process (never at import time), after megatron is importable and
before the model is built:

* ``megatron.core.transformer.moe.moe_utils`` binds ``te_general_gemm`` only when
  Transformer Engine imports, but ``RouterGatingLinearFunction`` reads the name
  unconditionally: every MoE router then fails with ``NameError``. Binding it to ``None``
  selects the module's own torch matmul path.
"""

from __future__ import annotations

__all__ = ["apply"]


def apply() -> list[str]:
    """Apply the fixes that this megatron-core needs; return the names of those applied."""
    applied: list[str] = []
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        applied.append("moe_utils.te_general_gemm=None")
    return applied
