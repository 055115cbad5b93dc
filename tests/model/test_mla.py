"""Multi-Latent Attention in dse's model (issue 38): Megatron-Core's MLA fields, the parameter
count against the layer Megatron-Core builds, and FLOPs and saved activations against counts
made by hand from the shapes of megatron/core/transformer/multi_latent_attention.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dse.model.costmodel._layout import resolve
from dse.model.costmodel._params import _attention_params, total_params
from dse.model.costmodel.memory import layer_activations
from dse.model.flops import model_flops_per_step
from dse.space.searchspace import ModelSpec, Resources, Semantics, mla_linear_shapes
from tests.conftest import free_port, needs_megatron

REPO = Path(__file__).resolve().parents[2]

#: A small MLA model: h 64, 4 heads, q rank 24, kv rank 16, query/key heads 8 + 4 RoPE
#: dims, value heads 6.
SMALL = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "ffn_hidden_size": 96,
    "vocab_size": 256,
    "multi_latent_attention": True,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_head_dim": 8,
    "qk_pos_emb_head_dim": 4,
    "v_head_dim": 6,
}

#: Builds one Megatron-Core MLA transformer layer on the CPU (the local spec) per case and
#: prints the parameter count of its attention and input norm. Two things of a GPU build are
#: replaced, neither holding a weight: the rotary embedding asks torch.cuda for its device
#: (MLA passes no use_cpu_initialization to it), and the local DotProductAttention takes no
#: k_channels (MLA's query/key heads differ from its value heads), so the weightless core
#: attention is a stand-in module.
_BUILD = r"""
import json, os, sys
import torch
torch.cuda.current_device = lambda: "cpu"
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel()
import megatron.core.transformer.multi_latent_attention as mla
mla.HAVE_TE = False  # the local spec: no Transformer-Engine linears to special-case
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import build_module
from megatron.core.transformer.transformer_config import MLATransformerConfig

class NoWeights(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()

out = []
for case in json.loads(sys.argv[1]):
    qkln = case.pop("qk_layernorm")
    cfg = MLATransformerConfig(num_layers=1, normalization="RMSNorm", add_bias_linear=False,
                               use_cpu_initialization=True, rope_type="rope",
                               gated_linear_unit=True, qk_layernorm=qkln, **case)
    spec = get_gpt_layer_local_spec(multi_latent_attention=True, normalization="RMSNorm",
                                    qk_layernorm=qkln)
    spec.submodules.self_attention.submodules.core_attention = NoWeights
    layer = build_module(spec, config=cfg, layer_number=1)
    shapes = {n: list(p.shape) for n, p in layer.self_attention.named_parameters()}
    count = sum(p.numel() for p in layer.self_attention.parameters())
    count += sum(p.numel() for p in layer.input_layernorm.parameters())
    out.append({"count": count, "shapes": shapes})
print(json.dumps(out))
"""


def _model(**over: Any) -> ModelSpec:
    return ModelSpec.model_validate({**SMALL, **over})


@needs_megatron
def test_mla_parameters_are_those_of_megatron_cores_mla_layer() -> None:
    """dse's attention parameters (with the input norm) equal those of the MLA layer
    Megatron-Core 0.16.1 builds, with and without the query's low rank and the q/kv norms;
    and its linear shapes are Megatron's (weights are out x in)."""
    fields = ("hidden_size", "num_attention_heads", "ffn_hidden_size", "q_lora_rank",
              "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")  # fmt: skip
    cases = []
    for q_lora, qkln in ((24, False), (24, True), (None, True)):
        case = {k: SMALL[k] for k in fields}
        case.update(q_lora_rank=q_lora, qk_layernorm=qkln)
        cases.append(case)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    r = subprocess.run([sys.executable, "-c", _BUILD, json.dumps(cases)], capture_output=True,
                       text=True, timeout=600, env=env, cwd=REPO)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    built = json.loads(r.stdout.strip().splitlines()[-1])
    for case, got in zip(cases, built, strict=True):
        m = _model(q_lora_rank=case["q_lora_rank"], qk_layernorm=case["qk_layernorm"])
        sharded, replicated = _attention_params(m)
        assert sharded + replicated == got["count"], (case, got)
        for name, (n_in, n_out, _) in m.mla_linears().items():
            assert got["shapes"][f"{name}.weight"] == [n_out, n_in], name
    # by hand, the first case: q down 64x24, q up 24x(4*12), kv down 64x(16+4),
    # kv up 16x(4*(8+6)), output 24x64, input norm 64
    assert built[0]["count"] == 64 * 24 + 24 * 48 + 64 * 20 + 16 * 56 + 24 * 64 + 64 == 6464
    assert built[1]["count"] == 6464 + 24 + 16  # the q and kv norms


def test_mla_shapes_split_over_tensor_parallelism_as_megatron_does() -> None:
    """The down projections are whole on every TP rank (the Transformer-Engine spec's
    duplicated linears); up and output projections are split by heads."""
    shapes = mla_linear_shapes(64, 4, 24, 16, 8, 4, 6)
    assert {k: v[2] for k, v in shapes.items()} == {
        "linear_q_down_proj": False,
        "linear_q_up_proj": True,
        "linear_kv_down_proj": False,
        "linear_kv_up_proj": True,
        "linear_proj": True,
    }
    assert set(mla_linear_shapes(64, 4, None, 16, 8, 4, 6)) == {
        "linear_q_proj", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj"
    }  # fmt: skip
    m = _model(qk_layernorm=True)
    sharded, replicated = _attention_params(m)
    assert sharded == 24 * 48 + 16 * 56 + 24 * 64
    assert replicated == 64 * 24 + 64 * 20 + 24 + 16 + 64


def test_mla_total_parameters_by_hand() -> None:
    """The whole small model: per layer MLA + norm + SwiGLU MLP + norm; embedding and
    untied output layer; final norm."""
    m = _model()
    attn = 64 * 24 + 24 * 48 + 64 * 20 + 16 * 56 + 24 * 64 + 64
    mlp = 64 * 2 * 96 + 96 * 64 + 64
    assert total_params(m, 32) == 2 * (attn + mlp) + 2 * 256 * 64 + 64


def test_mla_flops_per_token_by_hand_as_megatron_lm_counts_them() -> None:
    """Megatron-LM's num_floating_point_operations for MLA, by hand for the small model at
    sequence 32: 6 x per token (q rank (h + heads (qk + rope) + 1) + kv rank (h + heads (qk
    + v) + 1) + h rope + heads v h + s heads (qk + rope) / 2 + s heads v / 2) per layer,
    plus the MLP and the logits."""
    m = _model(qk_layernorm=True)
    seq, gbs = 32, 2
    per_layer = (
        24 * (64 + 4 * 12 + 1)
        + 16 * (64 + 4 * 14 + 1)
        + 64 * 4
        + 4 * 6 * 64
        + seq * 4 * 12 / 2
        + seq * 4 * 6 / 2
    )
    mlp = 64 * 3 * 96
    logits = 64 * 256  # vocabulary 256 is already a multiple of 128
    want = 6 * gbs * seq * (2 * (per_layer + mlp) + logits)
    got = model_flops_per_step(m, Semantics(global_batch_size=gbs, seq_length=seq))
    assert got == pytest.approx(want, rel=1e-12)
    # the stand-in it replaces (plain attention of 4 heads of 16) counts otherwise
    plain = model_flops_per_step(
        _model(multi_latent_attention=False), Semantics(global_batch_size=gbs, seq_length=seq)
    )
    assert plain != pytest.approx(got, rel=1e-3)


def _saved(m: ModelSpec, **params: Any) -> float:
    sem = Semantics(global_batch_size=8, seq_length=32, precision="bf16")
    res = Resources(world_size=params.pop("world", 1), gpu_memory_gib=80.0, features=[])
    layout = resolve(m, sem, res, {"micro_batch_size": 1, "attention_backend": "flash", **params})
    return layer_activations(m, sem, layout).attention


def test_mla_saved_activations_by_hand() -> None:
    """Bytes one MLA block saves per micro-batch (bf16, MBS 1, sequence 32), by hand from
    the tensors multi_latent_attention.py keeps for the backward: the compressed query and
    its norm's output, the compressed key/value with its RoPE part and its norm's output;
    the query, key and value the fused attention keeps, its output and the fp32 log-sum-exp
    per head. TP 2 splits the heads, never the down projections' tensors."""
    t = 32
    down = 2 * (24 + 24 + 20 + 16) * t  # q_c, q norm out, kv_c (+ RoPE part), kv norm out
    up = 2 * (12 * 4 + 12 * 4 + 6 * 4) * t  # query, key, value
    out = 2 * 6 * 4 * t + 4 * 4 * t  # attention output + fp32 log-sum-exp per head
    m = _model(qk_layernorm=True)
    assert _saved(m) == down + up + out
    tp2 = _saved(m, world=2, tensor_model_parallel_size=2)
    assert tp2 == down + (up + out) / 2
    # without the q/kv norms their outputs are not separate tensors
    assert _saved(_model()) == down - 2 * (24 + 16) * t + up + out


def test_mla_refuses_grouped_query_attention_by_name() -> None:
    with pytest.raises(ValidationError, match="num_query_groups=2"):
        _model(num_query_groups=2)
    with pytest.raises(ValidationError, match="q_lora_rank"):
        _model(q_lora_rank=0)


def test_mla_fields_render_as_megatron_lm_flags_and_read_back() -> None:
    """The Megatron-LM launcher passes MLA's fields as Megatron-LM's own flags (each in its
    argument parser at the pinned commit) and its command line reads back into the same
    model; the built-in trainer refuses MLA by name (it cannot build it on a CPU)."""
    from dse.core.records import TrialSpec
    from dse.workloads.launchers.megatron_lm import model_flags, parse_megatron_args
    from dse.workloads.megatron._plan import TrialFailure, make_plan
    from tests.conftest import small_space

    upstream = json.loads((REPO / "tests/fixtures/upstream/megatron_lm_args.json").read_text())
    upstream = upstream["flags"]
    space = small_space("mla", {"micro_batch_size": {"values": [1]}},
                        model={**SMALL, "qk_layernorm": True})  # fmt: skip
    flags = model_flags(space)
    for flag in ("--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
                 "--qk-pos-emb-head-dim", "--v-head-dim", "--qk-layernorm"):  # fmt: skip
        assert flag in flags and flag in upstream, flag
    model, _, _ = parse_megatron_args(flags)
    back = ModelSpec.model_validate(model)
    for k in ("multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
              "qk_pos_emb_head_dim", "v_head_dim", "qk_layernorm"):  # fmt: skip
        assert getattr(back, k) == getattr(space.model, k), k
    spec = TrialSpec(study="mla", trial_number=0, params=space.full_params(space.baseline()),
                     model=space.model.model_dump(), semantics=space.semantics.model_dump(),
                     world_size=1, device="cpu", metrics_path="m.jsonl", features=[])  # fmt: skip
    with pytest.raises(TrialFailure, match="model.multi_latent_attention"):
        make_plan(spec, [])


def test_mla_up_proj_recompute_is_refused_without_mla_and_saves_the_query_key_value() -> None:
    """recompute_modules mla_up_proj: Megatron-Core refuses it without Multi-Latent
    Attention (TransformerConfig.__post_init__), and dse names the rule; with MLA it frees
    the query, key and value (recomputed in the backward) and costs their up projections
    again in the step time (estimates)."""
    from dse.model.costmodel.throughput import estimate_throughput
    from dse.model.rules import check
    from tests.conftest import small_space

    knobs = {"recompute": {"values": ["selective"]},
             "recompute_modules": {"values": ["mla_up_proj", "layernorm"]}}  # fmt: skip
    plain = small_space("plain", knobs)
    sel = {"recompute": "selective"}
    bad = check(plain, plain.full_params({**sel, "recompute_modules": "mla_up_proj"}), set())
    assert bad and bad[0].rule == "recompute_modules"
    assert "needs multi-latent attention" in bad[0].message
    space = small_space("mla", knobs, model=dict(SMALL))
    up = space.full_params({**sel, "recompute_modules": "mla_up_proj"})
    assert check(space, up, set()) == []
    m = space.model
    kept = _saved(m, recompute="selective", recompute_modules="layernorm")
    freed = _saved(m, recompute="selective", recompute_modules="mla_up_proj")
    assert kept - freed == 2 * (12 * 4 + 12 * 4 + 6 * 4) * 32  # query, key, value (bf16)
    big = small_space("mla_big", knobs, model={**SMALL, "hidden_size": 4096, "q_lora_rank": 1536,
                      "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                      "v_head_dim": 128, "num_attention_heads": 32})  # fmt: skip

    def step(mods: str) -> float:
        p = big.full_params({**sel, "recompute_modules": mods})
        est = estimate_throughput(big.model, big.semantics, big.resources, p)
        return float(est["step_time_s"])

    assert step("mla_up_proj") > step("layernorm")
