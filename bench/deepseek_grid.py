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
   ``set_deepseek_v3_pipeline_model_parallel_layout``, :data:`BRIDGE_DSV3_LAYOUTS`). Printed:
   how many each keeps, and every configuration CloudAI keeps that dse refuses, counted by
   its reason (rule name, or ``predicted_oom``).
2. Bridge's DeepSeek-V3 GB200 performance configuration (TP 1, PP 4, VP 4, EP 64, 256 GPUs,
   ``recompute_modules: [mlp]``, the (4, 4) layout): its rules and its estimate (peak memory
   per stage, step time and TFLOP/s per GPU: cost-model estimates, never measurements).

The catalog model has no multi-token-prediction layer, so Bridge's layouts are used without
their ``m`` (MTP) symbol; its multi-head latent attention is modelled as plain attention
(dse/space/catalog/models/deepseek_v3.yaml). Every memory and speed figure is an estimate.
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
from dse.space.searchspace import SearchSpace, parse_space

ROOT = Path(__file__).resolve().parents[1]
CUR = ROOT / "tests" / "fixtures" / "cloudai_current"
TEST = CUR / "test" / "megatron_bridge_deepseekv3_bayesian.toml"
SYSTEM = CUR / "system" / "example_slurm_cluster.toml"

#: Megatron-Bridge's DeepSeek-V3 pipeline layouts by (PP, VP)
#: (src/megatron/bridge/recipes/deepseek/deepseek_v3.py
#: ``set_deepseek_v3_pipeline_model_parallel_layout``), in Megatron-Core's layout grammar,
#: without the MTP layer Bridge puts before the loss (dse's catalog model has none).
BRIDGE_DSV3_LAYOUTS: dict[tuple[int, int], str | None] = {
    (1, 1): None,
    (4, 1): "Et*16|t*16|t*16|t*13L",
    (8, 1): "Et*8|(t*8|)*6t*5L",
    (4, 2): "Et*8|(t*8|)*6t*5L",
    (16, 1): "Et*4|(t*4|)*14tL",
    (8, 2): "Et*4|(t*4|)*14tL",
    (4, 4): "Et*4|(t*4|)*14tL",
}


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
    return (pp, a["vp"]) in BRIDGE_DSV3_LAYOUTS


def with_layout(params: dict[str, Any]) -> dict[str, Any]:
    """The configuration as Bridge's DeepSeek-V3 recipe runs it: its (PP, VP)'s layout."""
    pp = int(params.get("pipeline_model_parallel_size") or 1)
    vp = int(params.get("virtual_pipeline_model_parallel_size") or 1)
    layout = BRIDGE_DSV3_LAYOUTS.get((pp, vp))
    return {**params, "pipeline_model_parallel_layout": layout} if layout else dict(params)


def decide(space: SearchSpace, cm: CostModel, params: dict[str, Any]) -> tuple[str, float | None]:
    """``kept``, a rule's name, or ``predicted_oom``; and the predicted peak (GiB)."""
    full = space.full_params(with_layout(params))
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


def gb200_layout() -> dict[str, Any]:
    """Bridge's DeepSeek-V3 GB200 performance configuration: rules and estimates."""
    space = parse_space(
        {
            "study": "dsv3_gb200_perf",
            "model": "deepseek_v3",
            "semantics": {"seq_length": 4096, "global_batch_size": 2048, "precision": "bf16"},
            "resources": {
                "world_size": 256,
                "gpus_per_node": 4,
                "gpu": "NVIDIA GB200",
                "gpu_memory_gib": 184.0,  # dse's GPU table, as the import sets it
                "features": ["transformer_engine", "apex"],
            },  # fmt: skip
            "fixed": {
                "tensor_model_parallel_size": 1,
                "pipeline_model_parallel_size": 4,
                "virtual_pipeline_model_parallel_size": 4,
                "expert_model_parallel_size": 64,
                "pipeline_model_parallel_layout": BRIDGE_DSV3_LAYOUTS[(4, 4)],
                "recompute": "selective",
                "recompute_modules": "mlp",
                "fp8": "hybrid",
                "fp8_recipe": "tensorwise",
                "moe_grouped_gemm": True,
                "use_distributed_optimizer": True,
                "attention_backend": "te",
            },
            "knobs": {"micro_batch_size": {"values": [1]}},
        },
        "gb200",
    )
    params = space.full_params(space.baseline())
    rules = [v.rule + ": " + v.message for v in check(space, params, space.resources.features)]
    mem = estimate_memory(space.model, space.semantics, space.resources, params)
    terms = ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib")
    speed = estimate_throughput(space.model, space.semantics, space.resources, params)
    return {
        "rules_broken": rules,
        "peak_gib_estimate": round(mem.total_gib, 1),
        "peak_terms_gib": {t: round(getattr(mem, t), 1) for t in terms},
        "peak_stage": mem.peak_stage,
        "stages": {
            s: {"layers": v["layers"], "params": v["params"]}
            for s, v in mem.details["stages"].items()
        },
        "gpu_memory_gib": space.resources.gpu_memory_gib,
        "step_time_s_estimate": round(float(speed["step_time_s"]), 2),
        "tflops_per_gpu_estimate": round(float(speed["tflops_per_gpu"]), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    out = {"grid": grid(), "gb200_perf_layout": gb200_layout()}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    g, p = out["grid"], out["gb200_perf_layout"]
    print(f"CloudAI DeepSeek-V3 grid: {g['grid']} configurations on {g['gpu']} "
          f"({g['gpu_memory_gib']} GiB, pre-screen margin {g['prescreen_margin']})")  # fmt: skip
    print(f"  CloudAI keeps {g['cloudai_keeps']} (by PP {g['cloudai_keeps_by_pp']})")
    print(f"  dse keeps {g['dse_keeps']} (by PP {g['dse_keeps_by_pp']}), "
          f"{g['dse_keeps_outside_cloudai']} of them outside CloudAI's")  # fmt: skip
    print(f"  kept by CloudAI, refused by dse: {g['cloudai_kept_dse_refused_by_reason']}")
    for row in g["kept"]:
        print(f"    kept {row}")
    print("Bridge DeepSeek-V3 GB200 performance layout (TP1 PP4 VP4 EP64, recompute mlp):")
    print(f"  rules broken: {p['rules_broken'] or 'none'}")
    print(f"  peak {p['peak_gib_estimate']} GiB on stage {p['peak_stage']} of "
          f"{p['gpu_memory_gib']} GiB (estimate; {p['peak_terms_gib']})")  # fmt: skip
    for st, v in p["stages"].items():
        print(f"    stage {st}: {v['layers']}, {v['params'] / 1e9:.2f}B parameters per rank")
    print(f"  step {p['step_time_s_estimate']} s, {p['tflops_per_gpu_estimate']} TFLOP/s/GPU "
          "(estimates)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
