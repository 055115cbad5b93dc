"""CloudAI's DeepSeek-V3 Bayesian grid and Bridge's DeepSeek-V3 GB200 performance layout,
as dse now describes them (issue 38): dense-first MoE layers, uneven pipelines.

    python bench/deepseek_grid.py [--json]

1. The grid: CloudAI's current-schema test ``megatron_bridge_deepseekv3_bayesian.toml``
   (tests/fixtures/cloudai_current; 256 GB200, GBS 2048, seq 4096, FP8 current scaling,
   TP {1,2} x PP {1,2,4,8} x EP {32,64} x VP {1,2,4,8} x recompute {[mlp], [mlp, moe_act],
   []}: 192 configurations) imported by ``dse cloudai import``. CloudAI's own check
   (its MegatronBridge ``constraint_check``, restated below for the swept fields, with
   constraint 18: the (PP, VP) pairs Bridge's DeepSeek-V3 recipe has a layout for) keeps
   some; dse's rules and its memory pre-screen (an estimate) decide each configuration with
   the layout Bridge's recipe gives its (PP, VP) set as ``pipeline_model_parallel_layout``
   (the recipe sets it itself at run time: Megatron-Bridge
   ``set_deepseek_v3_pipeline_model_parallel_layout``; the import writes dse's derivation
   ``pipeline_model_parallel_layout: bridge_deepseek_v3``, dse/space/derive.py). Printed:
   how many each keeps, and every configuration CloudAI keeps that dse refuses, counted by
   its reason (rule name, or ``predicted_oom``).
2. Bridge's DeepSeek-V3 GB200 performance configuration (TP 1, PP 4, VP 4, EP 64, 256 GPUs,
   ``recompute_modules: [mlp]``, the (4, 4) layout): its rules and its estimate (peak memory
   per stage, step time and TFLOP/s per GPU: cost-model estimates, never measurements).

   Printed twice: with the recipe's precision settings (:data:`BRIDGE_GB200_FP8CS`), and
   with the settings this bench used before (for the before/after of BENCHMARKS).
3. DeepSeek-V3's model FLOPs per token against the published 6 x 37B activated parameters
   plus the attention matmuls.

The catalog model describes Multi-Latent Attention as Megatron-Core builds it; it has no
multi-token-prediction layer, so Bridge's layouts are used without their ``m`` (MTP) symbol
(dse/space/catalog/models/deepseek_v3.yaml; the table is
``dse.space.derive.BRIDGE_DEEPSEEK_V3_LAYOUTS``). Every memory and speed figure is an estimate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

from dse.interop.cloudai import import_scenario
from dse.model.costmodel.memory import estimate_memory
from dse.model.costmodel.model import CostModel
from dse.model.costmodel.throughput import estimate_throughput
from dse.model.rules import check
from dse.space.derive import BRIDGE_DEEPSEEK_V3_LAYOUTS
from dse.space.searchspace import SearchSpace, parse_space

ROOT = Path(__file__).resolve().parents[1]
CUR = ROOT / "tests" / "fixtures" / "cloudai_current"
TEST = CUR / "test" / "megatron_bridge_deepseekv3_bayesian.toml"
SYSTEM = CUR / "system" / "example_slurm_cluster.toml"


def cloudai_keeps(a: dict[str, Any]) -> bool:
    """CloudAI's MegatronBridge constraint_check for the fields this grid sweeps: the world
    divides by TP*PP*CP and by ET*EP*PP, DP > 0, GBS by MBS*DP, and (DeepSeek-V3,
    constraint 18) (PP, VP) among the layouts Bridge has."""
    n, tp, pp, cp = a["num_gpus"], a["tp"], a["pp"], a["cp"]
    if n % (tp * pp * cp):
        return False
    dp = n // (tp * pp * cp)
    if dp == 0 or a["gb"] % (a["mb"] * dp) or n % (a["et"] * a["ep"] * pp):
        return False
    return (pp, a["vp"]) in BRIDGE_DEEPSEEK_V3_LAYOUTS


def decide(space: SearchSpace, cm: CostModel, params: dict[str, Any]) -> tuple[str, float | None]:
    """``kept``, a rule's name, or ``predicted_oom``; and the predicted peak (GiB). The
    space's ``derived`` section gives each configuration Bridge's layout of its (PP, VP)."""
    full = space.full_params(params)
    bad = check(space, full, space.resources.features)
    if bad:
        return bad[0].rule, None
    # the study's pre-screen: its margin before any trial calibrated the model
    ok, pred = cm.fits(full, cm.margin(space.prescreen.margin))
    return ("kept" if ok else "predicted_oom"), round(float(pred), 1)


def grid() -> dict[str, Any]:
    cmd = tomllib.loads(TEST.read_text())["cmd_args"]
    swept = {k: v for k, v in cmd.items() if isinstance(v, list)}
    cloudai = []
    for combo in itertools.product(*swept.values()):
        a = {**cmd, **dict(zip(swept, combo, strict=True))}
        if cloudai_keeps(a):
            cloudai.append(a)
    space = parse_space(import_scenario(TEST, system=SYSTEM, seq_length=4096).space, "dsv3")
    # the import derives the layout as Bridge's DeepSeek-V3 recipe sets it (dse.space.derive)
    assert space.derived.get("pipeline_model_parallel_layout") == "bridge_deepseek_v3"
    cm = CostModel(space.model, space.semantics, space.resources)
    configs = list(space.iter_configs())
    decided = [(c, *decide(space, cm, c)) for c in configs]

    def key(c: dict[str, Any]) -> tuple[Any, ...]:
        return (
            c["tensor_model_parallel_size"],
            c["pipeline_model_parallel_size"],
            c["expert_model_parallel_size"],
            c.get("virtual_pipeline_model_parallel_size") or 1,
            str(c.get("recompute_modules")) if c.get("recompute") == "selective" else "None",
        )

    cloudai_keys = {
        (a["tp"], a["pp"], a["ep"], a["vp"], str(_modules(a["recompute_modules"])))
        for a in cloudai
    }
    dse_keys = {key(c) for c, why, _ in decided if why == "kept"}
    refused = Counter(why for c, why, _ in decided if key(c) in cloudai_keys and why != "kept")
    names = ("tp", "pp", "ep", "vp", "recompute_modules")
    kept_rows = [
        (dict(zip(names, k, strict=True)), pred)
        for k, pred in sorted((key(c), pred) for c, why, pred in decided if why == "kept")
    ]
    return {
        "grid": len(configs),
        "cloudai_keeps": len(cloudai),
        "cloudai_keeps_by_pp": dict(sorted(Counter(a["pp"] for a in cloudai).items())),
        "dse_keeps": len(dse_keys),
        "dse_keeps_by_pp": dict(sorted(Counter(k[1] for k in dse_keys).items())),
        "dse_keeps_outside_cloudai": len(dse_keys - cloudai_keys),
        "cloudai_kept_dse_refused_by_reason": dict(sorted(refused.items())),
        "refused_by_reason_all": dict(sorted(Counter(w for _, w, _ in decided).items())),
        "gpu": space.resources.gpu,
        "gpu_memory_gib": space.resources.gpu_memory_gib,
        "prescreen_margin": cm.margin(space.prescreen.margin),
        "kept": [{**k, "predicted_peak_gib": p} for k, p in kept_rows],
    }


def _modules(value: Any) -> str | None:
    """A CloudAI recompute_modules value as the knob's comma-separated string (None: [])."""
    text = str(value).strip().strip("[]").replace(" ", "")
    return text or None


#: What Bridge's ``deepseek_v3_pretrain_256gpu_gb200_fp8cs_config`` sets beyond the layout
#: (src/megatron/bridge/perf_recipes/deepseek/gb200/deepseek_v3.py): GBS 4096 and the
#: benchmark precision preset ``_perf_precision("fp8_cs")`` (perf_recipes/_common.py):
#: ``bf16_with_fp8_current_scaling_mixed`` (fp8 hybrid, tensorwise, ``fp8_param_gather``
#: True, which Bridge's MixedPrecisionConfig copies to the model's ``fp8_param``) with
#: ``grad_reduce_in_fp32=False`` (bf16 gradient buffers).
BRIDGE_GB200_FP8CS: dict[str, Any] = {"fp8_param": True, "grad_reduce_in_fp32": False}


#: Bridge's ``deepseek_v3_pretrain_256gpu_gb200_bf16_config`` (same file): no FP8,
#: ``_perf_precision("bf16")`` (bf16 gradient buffers), ``recompute_modules=["mla_up_proj"]``.
BRIDGE_GB200_BF16: dict[str, Any] = {
    "fp8": None,
    "recompute_modules": "mla_up_proj",
    "grad_reduce_in_fp32": False,
}


def gb200_layout(variant: str = "fp8cs") -> dict[str, Any]:
    """Bridge's DeepSeek-V3 GB200 performance configuration: rules and estimates.

    ``variant``: ``fp8cs`` (the recipe's FP8 current-scaling settings), ``bf16`` (its BF16
    sibling, which recomputes MLA's up projections), ``earlier`` (the settings this bench
    used before it took Bridge's precision preset: bf16 weights with an FP8 copy, fp32
    gradient buffers, GBS 2048)."""
    bridge_precision = variant != "earlier"
    extra = {"fp8cs": BRIDGE_GB200_FP8CS, "bf16": BRIDGE_GB200_BF16}.get(variant, {})
    fixed = {
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 4,
        "virtual_pipeline_model_parallel_size": 4,
        "expert_model_parallel_size": 64,
        "recompute": "selective",
        "recompute_modules": "mlp",
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "moe_grouped_gemm": True,
        "use_distributed_optimizer": True,
        "attention_backend": "te",
        **extra,
    }
    space = parse_space(
        {
            "study": "dsv3_gb200_perf",
            "model": "deepseek_v3",
            "semantics": {
                "seq_length": 4096,
                "global_batch_size": 4096 if bridge_precision else 2048,
                "precision": "bf16",
            },
            "resources": {
                "world_size": 256,
                "gpus_per_node": 4,
                "gpu": "NVIDIA GB200",
                "gpu_memory_gib": 184.0,  # dse's GPU table, as the import sets it
                "features": ["transformer_engine", "apex"],
            },  # fmt: skip
            "fixed": fixed,
            "derived": {"pipeline_model_parallel_layout": "bridge_deepseek_v3"},  # the (4, 4) one
            "knobs": {"micro_batch_size": {"values": [1]}},
        },
        "gb200",
    )
    params = space.full_params(space.baseline())
    rules = [v.rule + ": " + v.message for v in check(space, params, space.resources.features)]
    mem = estimate_memory(space.model, space.semantics, space.resources, params)
    terms = ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib")
    speed = estimate_throughput(space.model, space.semantics, space.resources, params)
    cm = CostModel(space.model, space.semantics, space.resources)
    fits, _ = cm.fits(params, cm.margin(space.prescreen.margin))
    return {
        "settings": {k: fixed[k] for k in extra},
        "global_batch_size": space.semantics.global_batch_size,
        "rules_broken": rules,
        "peak_gib_estimate": round(mem.total_gib, 1),
        "peak_terms_gib": {t: round(getattr(mem, t), 1) for t in terms},
        "peak_stage": mem.peak_stage,
        "prescreen_keeps": bool(fits),
        "stages": {
            s: {"layers": v["layers"], "params": v["params"]}
            for s, v in mem.details["stages"].items()
        },
        "gpu_memory_gib": space.resources.gpu_memory_gib,
        "step_time_s_estimate": round(float(speed["step_time_s"]), 2),
        "tflops_per_gpu_estimate": round(float(speed["tflops_per_gpu"]), 1),
    }


def flops_check() -> dict[str, Any]:
    """DeepSeek-V3's model FLOPs per token (dse's count, Megatron-LM's convention) against
    the published 37 B activated parameters: ``6 x 37e9`` per token plus the attention
    matmuls (``6 x`` per token ``layers x heads x s/2 x (qk + rope + v)``, causal)."""
    from dse.model.costmodel._params import total_params
    from dse.model.flops import model_flops_per_step

    space = parse_space(
        {
            "study": "dsv3_flops",
            "model": "deepseek_v3",
            "semantics": {"seq_length": 4096, "global_batch_size": 1, "precision": "bf16"},
            "resources": {"world_size": 1, "gpu": "NVIDIA GB200", "gpu_memory_gib": 184.0},
            "knobs": {"micro_batch_size": {"values": [1]}},
        },
        "flops",
    )
    m, seq = space.model, space.semantics.seq_length
    per_token = model_flops_per_step(m, space.semantics) / seq
    head_dims = m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim
    attn = 6 * m.num_layers * m.num_attention_heads * seq / 2 * head_dims
    published = 6 * 37e9 + attn
    return {
        "total_params_b": round(total_params(m, seq) / 1e9, 1),
        "flops_per_token_t": round(per_token / 1e12, 4),
        "published_6x37b_plus_attention_t": round(published / 1e12, 4),
        "ratio": round(per_token / published, 3),
        "attention_matmuls_t": round(attn / 1e12, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    out = {
        "grid": grid(),
        "gb200_perf_layout": gb200_layout(),
        "gb200_perf_layout_earlier_settings": gb200_layout("earlier"),
        "gb200_bf16_layout": gb200_layout("bf16"),
        "flops": flops_check(),
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    g, p, f = out["grid"], out["gb200_perf_layout"], out["flops"]
    print(f"CloudAI DeepSeek-V3 grid: {g['grid']} configurations on {g['gpu']} "
          f"({g['gpu_memory_gib']} GiB, pre-screen margin {g['prescreen_margin']})")  # fmt: skip
    print(f"  CloudAI keeps {g['cloudai_keeps']} (by PP {g['cloudai_keeps_by_pp']})")
    print(f"  dse keeps {g['dse_keeps']} (by PP {g['dse_keeps_by_pp']}), "
          f"{g['dse_keeps_outside_cloudai']} of them outside CloudAI's")  # fmt: skip
    print(f"  kept by CloudAI, refused by dse: {g['cloudai_kept_dse_refused_by_reason']}")
    for row in g["kept"]:
        print(f"    kept {row}")
    e = out["gb200_perf_layout_earlier_settings"]
    print("Bridge DeepSeek-V3 GB200 performance layout (TP1 PP4 VP4 EP64, recompute mlp):")
    print(f"  with this bench's earlier settings (GBS 2048, bf16 weights + FP8 copies, fp32 "
          f"gradient buffers): peak {e['peak_gib_estimate']} GiB on stage {e['peak_stage']} "
          f"(estimate; {e['peak_terms_gib']}; pre-screen keeps: "
          f"{e['prescreen_keeps']})")  # fmt: skip
    print(f"  with Bridge's fp8cs recipe settings (GBS {p['global_batch_size']}, "
          f"{p['settings']}):")  # fmt: skip
    print(f"  rules broken: {p['rules_broken'] or 'none'}; pre-screen keeps: "
          f"{p['prescreen_keeps']}")  # fmt: skip
    print(f"  peak {p['peak_gib_estimate']} GiB on stage {p['peak_stage']} of "
          f"{p['gpu_memory_gib']} GiB (estimate; {p['peak_terms_gib']})")  # fmt: skip
    for st, v in p["stages"].items():
        print(f"    stage {st}: {v['layers']}, {v['params'] / 1e9:.2f}B parameters per rank")
    print(f"  step {p['step_time_s_estimate']} s, {p['tflops_per_gpu_estimate']} TFLOP/s/GPU "
          "(estimates)")  # fmt: skip
    b = out["gb200_bf16_layout"]
    print(f"Bridge's BF16 sibling ({b['settings']}): rules broken: "
          f"{b['rules_broken'] or 'none'}; peak {b['peak_gib_estimate']} GiB on stage "
          f"{b['peak_stage']} (estimate; {b['peak_terms_gib']}); step "
          f"{b['step_time_s_estimate']} s, {b['tflops_per_gpu_estimate']} TFLOP/s/GPU "
          "(estimates)")  # fmt: skip
    print(f"DeepSeek-V3 model FLOPs per token (seq 4096): {f['flops_per_token_t']} TFLOP; "
          f"published 6 x 37B + attention matmuls: {f['published_6x37b_plus_attention_t']} "
          f"TFLOP (ratio {f['ratio']}); parameters {f['total_params_b']}B")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
