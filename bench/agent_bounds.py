"""Seconds per proposal of an agent on a space at the documented bounds (dse/bounds.py).

Cases: ``one4096`` (one knob of MAX_DOMAIN_VALUES values), ``k256x16`` (MAX_KNOBS knobs of 16
values), ``k256x4096`` (both bounds at once). Asks 4 proposals (the baseline, then the
structured start), telling each a made-up measurement, and prints one JSON line with the
seconds of each ask.

    python bench/agent_bounds.py --case one4096 --agent tpe [--no-prior]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dse import bounds as B  # noqa: E402
from dse.agents import create_agent  # noqa: E402
from dse.agents._base import Feedback  # noqa: E402
from dse.space import parse_space  # noqa: E402

MODEL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_query_groups": 8,
         "ffn_hidden_size": 1024, "vocab_size": 1024}  # fmt: skip


def knobs(case: str) -> dict[str, dict[str, object]]:
    full = {"type": "int", "low": 1, "high": B.MAX_DOMAIN_VALUES}
    if case == "one4096":
        return {"micro_batch_size": full}
    n = B.MAX_KNOBS
    high = 16 if case == "k256x16" else B.MAX_DOMAIN_VALUES
    return {f"env.NCCL_X{i}": {"type": "int", "low": 1, "high": high} for i in range(n)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["one4096", "k256x16", "k256x4096"], default="one4096")
    ap.add_argument("--agent", default="tpe")
    ap.add_argument("--no-prior", action="store_true", help="agent.prior: false")
    a = ap.parse_args()
    space = parse_space({
        "study": "bounds", "model": MODEL,
        "semantics": {"global_batch_size": 8, "seq_length": 128},
        "resources": {"world_size": 1, "gpu_memory_gib": 80.0, "features": []},
        "knobs": knobs(a.case),
        "agent": {"name": a.agent, "prior": not a.no_prior, "seed": 1},
    })  # fmt: skip
    agent = create_agent(space)
    took = []
    for i in range(4):
        t = time.perf_counter()
        props = agent.ask(1)
        took.append(round(time.perf_counter() - t, 3))
        for p in props:
            agent.tell(p.trial_id, Feedback("complete", values=(100.0 + i,),
                                            metrics={"peak_mem_gib": 10.0}))  # fmt: skip
    print(json.dumps({"case": a.case, "agent": a.agent, "prior": not a.no_prior,
                      "seconds_per_ask": took}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
