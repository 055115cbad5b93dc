"""Agents on synthetic tables: does the search generalize beyond the one measured table?

The agents issue's figures are measured on one real table (a 0.9B model on one H200). This
benchmark builds other spaces the agents will meet (bigger models, several GPUs, tensor and
pipeline parallelism, both attention backends, a memory wall that moves with the layout)
and checks the same figures on them. The tables are **synthetic**: every row is the cost
model's *estimate* (``dse.model.costmodel``) made deliberately wrong, so that the agents' use of
the cost model's memory predictions is not tested against itself: the table's memory is the
estimate x a per-table bias (uniform in [1 - model_error, 1 + model_error]) x a per-knob-value
factor exp(N(0, model_error / 2)) x row noise exp(N(0, sigma)); its throughput is the
estimate x a per-knob-value factor exp(N(0, model_error)) x row noise exp(N(0, sigma)). A row
is ``oom`` when its memory exceeds the GPU, ``invalid`` when a validity rule rejects it.
They are no training result, only a terrain on which to run ``dse bench``; the pre-screen
stays off.

Run:  python bench/synthetic_tables.py [--seeds 20] [--agents tpe,random] [--sigma 0.01]
          [--model-error 0.1] [--no-memory-hint] [--no-prior] [--no-estimate] [--keep DIR]
          [--check]

Prints, per scenario, the table's size and, per agent, the median trials to within 2% of the
table's best (baseline included); ``--check`` exits 1 when the best model-based agent misses
a target of the agents issue on some scenario (median <= 1/3 of random's, <= 25% of valid).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from dse.cli.bench import bench
from dse.model.costmodel import CostModel
from dse.model.rules import check
from dse.space.searchspace import SearchSpace

LLAMA_8B = {
    "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
    "ffn_hidden_size": 14336, "vocab_size": 128256, "activation": "swiglu",
    "normalization": "RMSNorm",
}  # fmt: skip
LLAMA_70B = {
    "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_query_groups": 8,
    "ffn_hidden_size": 28672, "vocab_size": 128256, "activation": "swiglu",
    "normalization": "RMSNorm",
}  # fmt: skip
LLAMA_1B = {
    "num_layers": 16, "hidden_size": 2048, "num_attention_heads": 16, "num_query_groups": 8,
    "ffn_hidden_size": 5632, "vocab_size": 32000, "activation": "swiglu",
    "normalization": "RMSNorm",
}  # fmt: skip

COMMON_KNOBS = {
    "recompute": {"values": ["none", "selective", "full"]},
    "attention_backend": {"values": ["unfused", "sdpa"]},
    "use_distributed_optimizer": {"type": "bool"},
    "bias_activation_fusion": {"type": "bool"},
}

#: name -> (model, semantics, resources, knobs)
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "llama8b_h100x8": (
        LLAMA_8B,
        {"global_batch_size": 128, "seq_length": 8192},
        {"world_size": 8, "gpu": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.2},
        {
            "tensor_model_parallel_size": {"values": [1, 2, 4, 8]},
            "pipeline_model_parallel_size": {"values": [1, 2, 4]},
            "micro_batch_size": {"values": [1, 2, 4]},
            **COMMON_KNOBS,
        },
    ),
    "llama70b_h200x64": (
        LLAMA_70B,
        {"global_batch_size": 256, "seq_length": 4096},
        {"world_size": 64, "gpu": "NVIDIA H200", "gpu_memory_gib": 139.8},
        {
            "tensor_model_parallel_size": {"values": [2, 4, 8]},
            "pipeline_model_parallel_size": {"values": [1, 2, 4, 8]},
            "micro_batch_size": {"values": [1, 2, 4]},
            **COMMON_KNOBS,
        },
    ),
    "llama1b_h200x2": (
        LLAMA_1B,
        {"global_batch_size": 16, "seq_length": 4096},
        {"world_size": 2, "gpu": "NVIDIA H200", "gpu_memory_gib": 139.8},
        {
            "tensor_model_parallel_size": {"values": [1, 2]},
            "micro_batch_size": {"values": [1, 2, 4, 8]},
            "cross_entropy_loss_fusion": {"type": "bool"},
            **COMMON_KNOBS,
        },
    ),
    # like the held-out 2-GPU table of the agents issue: TP x MBS x recompute x distributed
    # optimizer, unfused attention only (a small space with a memory wall at large MBS)
    "llama1b_h200x2_unfused": (
        LLAMA_1B,
        {"global_batch_size": 16, "seq_length": 4096},
        {"world_size": 2, "gpu": "NVIDIA H200", "gpu_memory_gib": 139.8},
        {
            "tensor_model_parallel_size": {"values": [1, 2]},
            "micro_batch_size": {"values": [1, 2, 4, 8]},
            "recompute": {"values": ["none", "selective", "full"]},
            "use_distributed_optimizer": {"type": "bool"},
        },
    ),
}


def build_table(
    name: str, sigma: float, model_error: float, seed: int, out: Path
) -> tuple[Path, dict[str, int]]:
    """Write the synthetic table of scenario ``name``; returns its path and status counts."""
    model, sem, res, knobs = SCENARIOS[name]
    space = SearchSpace.model_validate(
        {
            "study": name,
            "model": model,
            "semantics": {**sem, "precision": "bf16"},
            "resources": {**res, "features": []},
            "knobs": knobs,
            "workload": {"name": "sim"},
        }
    )
    cm = CostModel(space.model, space.semantics, space.resources)
    cap = float(res["gpu_memory_gib"])
    rng = random.Random(seed)
    row_model = {
        **{k: v for k, v in model.items() if k != "activation"},
        "activation": "swiglu",
        "gated_linear_unit": True,
        "global_batch_size": sem["global_batch_size"],
        "seq_length": sem["seq_length"],
        "precision": "bf16",
    }
    hardware = {"gpu": res["gpu"], "gpu_memory_gib": cap}
    bias = 1 + rng.uniform(-model_error, model_error)
    mem_f = {(k, json.dumps(v)): math.exp(rng.gauss(0, model_error / 2))
             for k, spec in space.knobs.items() for v in spec.values()}  # fmt: skip
    thr_f = {(k, json.dumps(v)): math.exp(rng.gauss(0, model_error))
             for k, spec in space.knobs.items() for v in spec.values()}  # fmt: skip
    counts = {"ok": 0, "oom": 0, "invalid": 0}
    lines = []
    for params in space.iter_configs():
        full = space.full_params(params)
        row: dict[str, Any] = {"params": params, "world_size": res["world_size"],
                               "model": row_model, "hardware": hardware}  # fmt: skip
        violations = check(space, params, set())
        keys = [(k, json.dumps(v)) for k, v in params.items()]
        mem = cm.predict_memory(full).total_gib * bias * math.exp(rng.gauss(0, sigma))
        mem *= math.prod(mem_f[k] for k in keys)
        thr = cm.estimate_throughput(full)
        noise = math.exp(rng.gauss(0, sigma)) * math.prod(thr_f[k] for k in keys)
        if violations:
            row |= {"status": "invalid", "metrics": {"error": violations[0].message}}
        elif mem > cap:
            oom = {"peak_mem_gib": round(cap, 3), "error": "CUDA out of memory (synthetic)"}
            row |= {"status": "oom", "metrics": oom}
        else:
            row |= {
                "status": "ok",
                "metrics": {
                    "tflops_per_gpu": round(float(thr["tflops_per_gpu"]) * noise, 2),
                    "step_time_s": round(float(thr["step_time_s"]) / noise, 4),
                    "peak_mem_gib": round(mem, 3),
                    "loss": [10.0],
                },
            }
        counts[row["status"]] += 1
        lines.append(json.dumps(row))
    path = out / f"synthetic_{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--agents", default="tpe,random")
    ap.add_argument("--sigma", type=float, default=0.01, help="relative noise of a row")
    ap.add_argument(
        "--model-error", type=float, default=0.1, help="systematic error of the estimates"
    )
    ap.add_argument("--no-memory-hint", action="store_true", help="agents without the hint")
    ap.add_argument("--no-prior", action="store_true", help="agents without the structured start")
    ap.add_argument(
        "--no-estimate",
        action="store_true",
        help="with --no-prior: random start-up trials, not the cost model's speed estimate (the "
        "tables are made from that estimate: with it, the start is judged against itself)",
    )
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--keep", help="folder to keep the tables in (default: a temporary one)")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    agents = args.agents.split(",")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep) if args.keep else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        print("synthetic tables: cost-model ESTIMATES with noise, not measurements\n")
        for k, name in enumerate(args.scenarios.split(",")):
            path, counts = build_table(name, args.sigma, args.model_error, seed=k, out=out)
            rep = bench(
                str(path),
                agents,
                seeds=args.seeds,
                memory_hint=not args.no_memory_hint,
                prior=not args.no_prior,
                estimate=not args.no_estimate,
            )
            n_valid = rep["n_valid"]
            print(f"{name}: {sum(counts.values())} rows ({counts['ok']} ok, {counts['oom']} oom, "
                  f"{counts['invalid']} invalid), {n_valid} valid, best "
                  f"{rep['best_value']:.1f} TFLOP/s/GPU (estimate)")  # fmt: skip
            med = {a: rep["agents"][a]["median_trials_to_target"] for a in agents}
            for a in agents:
                r = rep["agents"][a]
                ttt = " ".join("-" if t is None else str(t) for t in r["trials_to_target"])
                m = med[a]
                share = f"{100 * m / n_valid:5.1f}%" if m is not None else "    -"
                print(f"  {a:8s} median {m!s:>5}  {share} of valid  reached "
                      f"{100 * r['reached_fraction']:3.0f}%   {ttt}")  # fmt: skip
            rnd = med.get("random")
            best_agent = min(
                (a for a in agents if a not in ("random", "grid") and med[a] is not None),
                key=lambda a: med[a] or math.inf,
                default=None,
            )
            if rnd is not None and best_agent is not None:
                m = med[best_agent]
                assert m is not None
                ok = m <= rnd / 3 and m <= 0.25 * n_valid
                print(f"  best model-based agent {best_agent}: {m} vs random {rnd} "
                      f"(ratio {m / rnd:.2f}; targets <= 0.33 and <= 25% of valid): "
                      f"{'ok' if ok else 'MISSED'}\n")  # fmt: skip
                if not ok:
                    failed.append(name)
    if failed:
        print(f"missed on: {', '.join(failed)}")
    return 1 if (args.check and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
