"""How long ``dse import`` takes on a large export, phase by phase.

Builds an export document of ``--trials`` completed trials (4 knobs each, a metrics dict and
``--steps`` per-step rows, plus one rejection per 10 trials), writes it to a temporary JSON
file, then times (wall clock and this process's CPU time, which the machine's other load
does not inflate): reading and parsing the JSON, validating the document (schema, the
duplicate-number check), and the whole ``dse import`` command into a fresh SQLite database.

    python bench/import_export.py [--trials 50000] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from dse.cli.main import main
from dse.storage._study_file import parse_export

#: The study's space: the import derives the study's fields from it and checks every trial
#: is one of its configurations.
SPACE_YAML = """\
study: bench-import
model: {num_layers: 4, hidden_size: 256, num_attention_heads: 8, ffn_hidden_size: 1024,
        vocab_size: 32000}
semantics: {global_batch_size: 64, seq_length: 512}
resources: {world_size: 8, device: cuda, gpu: NVIDIA H200, gpu_memory_gib: 139.8}
knobs:
  tensor_model_parallel_size: {values: [1, 2, 4, 8]}
  micro_batch_size: {values: [1, 2, 3, 4, 5, 6, 7, 8]}
  recompute: {values: [none, selective, full]}
"""


def build(n: int, steps: int) -> dict[str, Any]:
    trials = []
    for i in range(n):
        p = {
            "tensor_model_parallel_size": 1 << (i % 4),
            "micro_batch_size": 1 + i % 8,
            "recompute": ["none", "selective", "full"][i % 3],
        }
        trials.append(
            {
                "number": i,
                "state": "complete",
                "params": p,
                "params_key": json.dumps(p, sort_keys=True),
                "metrics": {"tflops_per_gpu": 100.0 + i % 97, "step_time_s": 1.5},
                "value": 100.0 + i % 97,
                "failure_class": None,
                "reason": None,
                "source": "agent",
                "runner": "bench",
                "host": "h",
                "log_path": None,
                "metrics_path": None,
                "queued_at": 1.0e9 + i,
                "started_at": 1.0e9 + i + 0.1,
                "finished_at": 1.0e9 + i + 1.0,
                "heartbeat_at": 1.0e9 + i + 1.0,
                "gpu_seconds": 8.0,
                "attempts": 1,
                "history": [],
                "steps": [
                    {
                        "step": s,
                        "step_time_s": 1.5,
                        "tflops_per_gpu": 100.0,
                        "peak_mem_gib": 40.0,
                        "peak_reserved_gib": 42.0,
                        "loss": 10.0 - s,
                        "grad_norm": 1.0,
                    }
                    for s in range(steps)
                ],
            }
        )
    return {
        "format": "dse-study",
        "format_version": 1,
        "schema_revision": None,
        "exported_at": 1.0e9,
        "study": {
            "name": "bench-import",
            "space_yaml": SPACE_YAML,
            "space_hash": "h",  # recomputed by the import
            "state": "stopped",
            "direction": "maximize",
            "metric": "tflops_per_gpu",
            "model": {},  # stated fields may be left out: the space gives them
            "hardware": {},
            "created_at": 1.0e9,
            "updated_at": 1.0e9,
        },
        "attrs": {},
        "trials": trials,
        "rejections": [
            {
                "params": {"tensor_model_parallel_size": 3},
                "params_key": f"r{i}",
                "kind": "invalid",
                "rule": "tp_divides_heads",
                "reason": "32 % 3 != 0",
                "values": {},
                "created_at": 1.0e9,
            }
            for i in range(n // 10)
        ],
    }


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50_000)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dse-bench-import-") as d:
        path = Path(d) / "study.json"
        path.write_text(json.dumps(build(args.trials, args.steps), indent=1))
        size_mb = path.stat().st_size / 1e6
        t0, c0 = time.perf_counter(), time.process_time()
        data = json.loads(path.read_text())
        t1, c1 = time.perf_counter(), time.process_time()
        parse_export(data)
        t2, c2 = time.perf_counter(), time.process_time()
        rc = main(["import", str(path), "--storage", f"sqlite:///{Path(d) / 'dst.db'}"])
        t3, c3 = time.perf_counter(), time.process_time()
    print(f"trials {args.trials}, steps/trial {args.steps}, file {size_mb:.1f} MB")
    print("phase                 wall s    cpu s")
    print(f"json.loads          {t1 - t0:8.2f} {c1 - c0:8.2f}")
    print(f"validate (parse)    {t2 - t1:8.2f} {c2 - c1:8.2f}")
    print(f"dse import (total)  {t3 - t2:8.2f} {c3 - c2:8.2f}   exit {rc}")


if __name__ == "__main__":
    main_()
