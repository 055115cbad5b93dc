"""The training state a CPU trial holds against the cost model's static memory terms.

    python bench/training_state_vs_estimate.py --space SPACE.yaml --export study.json \
        [--space ... --export ...] -o summary.json

On a CPU the trainer's peak memory is the process's resident set, which says nothing about a
tiny model. What it can count exactly is the training state: after its steps every trial
records ``training_state_bytes`` (rank 0's weights split into trained and frozen, DDP
gradient buffers, Adam's state and master weights, counted from the live tensors;
:func:`dse.workloads.megatron.trainer.training_state_bytes`). This compares each complete
trial of each study (``dse export`` JSON) with the cost model's estimate of the same
configuration (``estimate_memory``: ``weights_gib``, ``gradients_gib``, ``optimizer_gib``;
estimates), term by term, and reports the relative error of each and the band (the largest
|error| over the trials). Activations, the logits and the allocator's terms are GPU-only
quantities: not measured here, left out of the comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dse.model.costmodel.memory import GIB, estimate_memory
from dse.space.searchspace import load_space


def study_rows(space_path: str, export_path: str) -> list[dict[str, Any]]:
    space = load_space(space_path)
    data = json.loads(Path(export_path).read_text())
    rows = []
    for t in sorted(data.get("trials", []), key=lambda t: t.get("number", 0)):
        m = t.get("metrics") or {}
        got = m.get("training_state_bytes")
        if t.get("state") != "complete" or not got:
            continue
        params = space.full_params(t.get("params") or {})
        est = estimate_memory(space.model, space.semantics, space.resources, params)
        pairs = {
            "weights": (got["weights_trained"] + got["weights_frozen"], est.weights_gib * GIB),
            "gradients": (got["grads"], est.gradients_gib * GIB),
            "optimizer": (got["optimizer"], est.optimizer_gib * GIB),
        }
        rows.append({
            "study": space.study,
            "number": t.get("number"),
            "params": t.get("params"),
            "measured_bytes": {k: v[0] for k, v in pairs.items()},
            "estimated_bytes": {k: round(v[1]) for k, v in pairs.items()},
            "rel_error": {k: (v[1] - v[0]) / v[0] if v[0] else None for k, v in pairs.items()},
            "weights_frozen_bytes": got["weights_frozen"],
            "optimizer_params": got["optimizer_params"],
            "frozen_in_optimizer": got["frozen_in_optimizer"],
            "packing": m.get("packing"),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", action="append", required=True)
    ap.add_argument("--export", action="append", required=True)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    if len(args.space) != len(args.export):
        ap.error("give one --export per --space")
    rows = [r for s, e in zip(args.space, args.export, strict=True) for r in study_rows(s, e)]
    band = {k: max((abs(r["rel_error"][k]) for r in rows if r["rel_error"][k] is not None),
                   default=None) for k in ("weights", "gradients", "optimizer")}  # fmt: skip
    out = {
        "source": "measured (live tensors of rank 0) vs estimate (cost model)",
        "not_measured": "activations, logits, allocator slack, context: GPU-only terms",
        "trials": len(rows),
        "band_abs_rel_error": band,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("trials", "band_abs_rel_error")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
