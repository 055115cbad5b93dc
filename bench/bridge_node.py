"""What of Megatron-Bridge runs on this node, and the resolved-configuration check where it does.

1. Imports, each in a fresh interpreter: the Bridge modules dse's entry script and a recipe
   trial need (``megatron.bridge.training.config``, ``.mixed_precision``,
   ``.utils.omegaconf_utils``, ``.pretrain``, ``megatron.bridge.recipes``), and
   ``transformer_engine``. For each: ok, or the exception, the missing module's name and the
   import chain (the traceback's files) that led to it: the exact blocker.
2. Where the configuration modules and the recipe import: for each configuration of a small
   space (MBS x recompute x grad_reduce_in_fp32 on Bridge's bare GPT H100 recipe), dse
   renders the trial's overrides, the recipe is built, the overrides applied through dse's
   entry-script hooks and Bridge's ``process_config_with_overrides``, Bridge's
   ``runtime_config_update`` runs, and dse's check compares the resolved fields with what it
   asked (``dse.workloads.launchers.resolved.compare``).

Writes ``summary.json`` under ``--out``. Usage (repo root): ``python bench/bridge_node.py
--out DIR``; on the GPU node through ``bench/bridge_node.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODULES = (
    "megatron.bridge.training.mixed_precision",
    "megatron.bridge.training.utils.omegaconf_utils",
    "megatron.bridge.training.config",
    "megatron.bridge.recipes",
    "megatron.bridge.training.pretrain",
    "transformer_engine",
)
#: Bridge's bare GPT recipe: a GPTModelProvider with no Hugging Face hub access (the Llama
#: recipes read their config from the hub); run without TE through the fixed overrides below.
RECIPE = "vanilla_gpt_pretrain_1gpu_h100_bf16_config"

_PROBE = r"""
import json, sys, traceback
name = sys.argv[1]
try:
    __import__(name)
    print(json.dumps({"ok": True}))
except BaseException as e:
    tb = traceback.extract_tb(e.__traceback__)
    chain = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in tb][-8:]
    print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}",
                      "missing": getattr(e, "name", None), "chain": chain}))
"""


def probe(name: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, name], capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"module": name, "ok": False, "error": "import took over 300 s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {"ok": False, "error": r.stderr[-2000:]}
    return {"module": name, **out, "seconds": round(time.perf_counter() - t0, 1)}


def space() -> Any:
    from dse.space.searchspace import parse_space

    return parse_space({
        "version": 1, "study": "bridge-llama32-1b-node", "recipe": f"Bridge {RECIPE}",
        "model": {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 32,
                  "num_query_groups": 8, "ffn_hidden_size": 8192, "vocab_size": 128256,
                  "activation": "swiglu", "normalization": "RMSNorm",
                  "position_embedding_type": "rope"},
        "semantics": {"global_batch_size": 8, "seq_length": 2048, "steps": 10,
                      "warmup_steps": 2, "precision": "bf16", "lr": 3e-4,
                      "data": {"kind": "synthetic"}},
        "resources": {"world_size": 1, "gpus_per_node": 1, "device": "cuda"},
        "knobs": {"micro_batch_size": {"values": [1, 2], "baseline": 1},
                  "recompute": {"values": ["none", "full"], "baseline": "none"},
                  "grad_reduce_in_fp32": {"type": "bool", "baseline": True}},
        "objective": {"metric": "tflops_per_gpu", "direction": "maximize"},
        "budget": {"n_trials": 8},
        "workload": {"name": "bridge", "launcher": {"recipe": RECIPE, "overrides": {
            "model.transformer_impl": "local", "model.cross_entropy_fusion_impl": "native"}}},
    }, "bridge_node")  # fmt: skip


def resolve_all() -> list[dict[str, Any]]:
    """Each configuration: build, override (dse's hooks), runtime_config_update, compare."""
    import copy
    import itertools

    import megatron.bridge.recipes as recipes
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    from dse.workloads.launchers import bridge_entry, launcher_for
    from dse.workloads.launchers.bridge import resolved_expectations
    from dse.workloads.launchers.resolved import compare

    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("RANK", "0")
    sp = space()
    launcher = launcher_for(sp)
    build = getattr(recipes, RECIPE)
    base = build()
    rows = []
    for mbs, rec, fp32 in itertools.product([1, 2], ["none", "full"], [True, False]):
        params = sp.full_params({"micro_batch_size": mbs, "recompute": rec,
                                 "grad_reduce_in_fp32": fp32})  # fmt: skip
        argv = launcher.render(params).argv
        overrides = [a for a in argv[argv.index("--") + 1 :] if "=" in a and not a.startswith("-")]
        cfg = copy.deepcopy(base)
        row: dict[str, Any] = {"params": params, "overrides": overrides}
        try:
            rest = bridge_entry.prepare_mixed_precision(cfg, overrides, get_mixed_precision_config)
            cfg = process_config_with_overrides(cfg, cli_overrides=rest)
            runtime_config_update(cfg)
            fields = bridge_entry.resolved_fields(cfg)
            bad = compare(resolved_expectations(argv), fields)
            row.update(checked=len(resolved_expectations(argv)), mismatches=[str(m) for m in bad],
                       grad_reduce_in_fp32=fields.get("ddp.grad_reduce_in_fp32"))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - recorded: what stopped this configuration
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"python": sys.version.split()[0], "imports": []}
    try:
        import torch

        summary["torch"] = torch.__version__
        summary["cuda"] = torch.cuda.is_available()
    except Exception as e:  # noqa: BLE001
        summary["torch"] = f"not importable: {e}"
    for m in MODULES:
        summary["imports"].append(probe(m))
        print(json.dumps(summary["imports"][-1])[:600], flush=True)
    ok = {r["module"] for r in summary["imports"] if r["ok"]}
    need = {"megatron.bridge.training.config", "megatron.bridge.recipes"}
    if need <= ok:
        summary["resolved"] = resolve_all()
        for row in summary["resolved"]:
            print(json.dumps({k: row.get(k) for k in ("params", "mismatches", "error")})[:600])
    else:
        first = next(r for r in summary["imports"] if r["module"] in need and not r["ok"])
        summary["blocker"] = {
            "module": first["module"], "error": first.get("error"),
            "missing": first.get("missing"), "chain": first.get("chain"),
        }  # fmt: skip
        print("blocker:", json.dumps(summary["blocker"]), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
