"""What the local spec's unfused attention keeps for the backward pass, per layer: the bytes
of the tensors autograd saves in Megatron-Core's ``DotProductAttention`` (scores, masked
softmax, attention dropout, probabilities x values), with the softmax in fp32
(``TransformerConfig.attention_softmax_in_fp32=True``, the dataclass default the built-in
trainer used) and in the input dtype (False, Megatron-LM's argument default), with and
without attention dropout (Megatron-LM's default 0.1, which upstream ran with before dse gave
the model's 0.0). CPU, bf16, one layer of a small shape; the bytes scale with
``b * heads * s * s`` (docs/trainer_vs_upstream.md).

    python bench/attention_saved_bytes.py [--seq 512] [--heads 16] [--mbs 2]
"""

from __future__ import annotations

import argparse
import json
import warnings


def saved_bytes(seq: int, heads: int, mbs: int, fp32_softmax: bool, dropout: float) -> int:
    import torch
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=heads * 64, num_attention_heads=heads, bf16=True,
        params_dtype=torch.bfloat16, attention_softmax_in_fp32=fp32_softmax,
        attention_dropout=dropout, masked_softmax_fusion=False, use_cpu_initialization=True,
    )  # fmt: skip
    attn = DotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                               attention_type="self")  # fmt: skip
    attn.train()
    shape = (seq, mbs, heads, 64)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in (q.data_ptr(), k.data_ptr(), v.data_ptr()):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with mrandom.get_cuda_rng_tracker().fork():
            out = attn(q, k, v, attention_mask=None)
    out.float().sum().backward()
    return sum(seen.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--mbs", type=int, default=2)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    import socket

    import torch.distributed as dist
    from megatron.core import parallel_state

    from dse.workloads.megatron import _cpu_shims

    _cpu_shims.install()
    with socket.socket() as sock:  # one gloo rank: Megatron's groups of TP 1
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    _cpu_shims.seed_model_parallel(1234)
    n = a.mbs * a.heads * a.seq * a.seq  # elements of one score tensor
    rows = []
    for fp32, drop in ((True, 0.0), (False, 0.0), (True, 0.1), (False, 0.1)):
        b = saved_bytes(a.seq, a.heads, a.mbs, fp32, drop)
        rows.append({"attention_softmax_in_fp32": fp32, "attention_dropout": drop,
                     "saved_bytes": b, "bytes_per_score": round(b / n, 3)})  # fmt: skip
    print(json.dumps({"seq": a.seq, "heads": a.heads, "mbs": a.mbs, "rows": rows}, indent=1))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
