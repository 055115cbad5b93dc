"""How long ``agent.ask()`` takes with a long history (as after a restart from storage).

For each agent: ``--history`` distinct completed trials are fed with ``add_evaluated`` (about
10% of them infeasible OOMs, as a real study has), then ``--asks`` rounds of ``ask(1)``
followed by a ``tell`` are timed (the ask only). Prints the median and p99 per agent.

The space is synthetic and larger than any measured table (a table's space has a few dozen
configurations, too few for 500 distinct trials): 11 knobs of Megatron-Core, 18,432
combinations, 11,520 distinct configurations (one knob is conditional). The objective is a
smooth function of the knobs, with an out-of-memory region.

    python bench/agent_ask_overhead.py [--agents tpe,gp] [--history 500] [--asks 500]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from dse.agents import Feedback, create_agent
from dse.space.searchspace import SearchSpace, params_key, parse_space

SPACE: dict[str, Any] = {
    "study": "overhead",
    "model": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "ffn_hidden_size": 14336,
        "vocab_size": 128256,
    },
    "semantics": {"global_batch_size": 128, "seq_length": 8192},
    "resources": {"world_size": 8, "gpu_memory_gib": 139.8, "features": []},
    "knobs": {
        "tensor_model_parallel_size": {"values": [1, 2, 4, 8]},
        "pipeline_model_parallel_size": {"values": [1, 2, 4]},
        "micro_batch_size": {"values": [1, 2, 4, 8]},
        "recompute": {"values": ["none", "selective", "full"]},
        "attention_backend": {"values": ["unfused", "sdpa"]},
        "sequence_parallel": {"type": "bool"},
        "bias_activation_fusion": {"type": "bool"},
        "cross_entropy_loss_fusion": {"type": "bool"},
        "use_distributed_optimizer": {"type": "bool"},
        "overlap_grad_reduce": {"type": "bool"},
        "overlap_param_gather": {
            "type": "bool",
            "when": {"use_distributed_optimizer": True, "overlap_grad_reduce": True},
        },
    },
}


def objective(p: dict[str, Any]) -> tuple[float | None, float]:
    """(TFLOP/s or None for OOM, peak GiB) of a synthetic configuration."""
    mem = 20 + 12 * p["micro_batch_size"] * {"none": 3.0, "selective": 1.5, "full": 0.3}[
        p["recompute"]
    ] / (p["tensor_model_parallel_size"] * p["pipeline_model_parallel_size"] ** 0.5)
    if mem > 139.8:
        return None, mem
    t = 400.0 / (1 + 0.15 * (p["tensor_model_parallel_size"] - 1))
    t *= 1 - 0.05 * (p["pipeline_model_parallel_size"] - 1)
    t *= {"none": 1.0, "selective": 0.95, "full": 0.75}[p["recompute"]]
    t *= 1.0 if p["attention_backend"] == "sdpa" else 0.4
    t *= 1 + 0.02 * p["bias_activation_fusion"] + 0.01 * p["cross_entropy_loss_fusion"]
    return t, mem


def feedback(p: dict[str, Any]) -> Feedback:
    t, mem = objective(p)
    if t is None:
        return Feedback("infeasible", metrics={"peak_mem_gib": 139.0}, failure_class="oom")
    return Feedback("complete", values=(t,), metrics={"peak_mem_gib": mem})


def measure(space: SearchSpace, name: str, history: int, asks: int, seed: int) -> list[float]:
    sp = space.model_copy(
        update={"agent": space.agent.model_copy(update={"name": name, "seed": seed})}
    )
    agent = create_agent(sp)
    rng = random.Random(seed)
    seen: set[str] = set()
    configs = list(sp.iter_configs())
    rng.shuffle(configs)
    for p in configs:
        if len(seen) >= history:
            break
        seen.add(params_key(p))
        agent.add_evaluated(p, feedback(p))
    times: list[float] = []
    for _ in range(asks):
        t0 = time.perf_counter()
        (prop,) = agent.ask(1)
        times.append(time.perf_counter() - t0)
        agent.tell(prop.trial_id, feedback(prop.params))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="tpe,gp")
    ap.add_argument("--history", type=int, default=500)
    ap.add_argument("--asks", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    space = parse_space(SPACE)
    print(
        f"space: {space.size()} raw combinations, {len(list(space.iter_configs()))} canonical; "
        f"history {args.history} completed trials (add_evaluated), {args.asks} ask+tell rounds"
    )
    print(f"{'agent':<8} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} {'total s':>8}")
    for name in [a.strip() for a in args.agents.split(",") if a.strip()]:
        times = measure(space, name, args.history, args.asks, args.seed)
        q = statistics.quantiles(times, n=100, method="inclusive")
        print(
            f"{name:<8} {1e3 * statistics.median(times):>10.1f} {1e3 * q[98]:>8.1f} "
            f"{1e3 * max(times):>8.1f} {sum(times):>8.1f}"
        )


if __name__ == "__main__":
    main()
