"""Measure a replay table on a GPU node: one torchrun of the built-in trainer per configuration.

    python bench/measure_table.py SPACE.yaml OUT.jsonl --world-size 2 \
        --grid tensor_model_parallel_size=1,2 --grid micro_batch_size=1,2,4,8 ...

Every combination of the ``--grid`` values (on top of the space's baseline) that passes
:func:`dse.rules.check` is run once as a separate trial process; each becomes one row of
the replay format (see the shared data README): ``ok`` with the summary's figures, ``oom``
with the peak reached, ``invalid`` or ``error`` with the reason. Rows are appended as they
finish, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dse.records import Outcome, TrialSpec, read_metrics
from dse.rules import check
from dse.space import load_space

_MODEL_KEYS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
    "vocab_size", "gated_linear_unit", "activation", "normalization",
)  # fmt: skip


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("space")
    ap.add_argument("out")
    ap.add_argument("--world-size", type=int, default=None)
    ap.add_argument("--grid", action="append", default=[], metavar="KNOB=V1,V2")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--skip", type=int, default=0, help="skip the first N configurations")
    ap.add_argument("--limit", type=int, default=None, help="run at most N configurations")
    ap.add_argument(
        "--stop-at", type=float, default=None, help="start no configuration after this epoch time"
    )
    args = ap.parse_args(argv)

    space = load_space(args.space)
    if args.world_size is not None:
        res = space.resources.model_copy(update={"world_size": args.world_size})
        space = space.model_copy(update={"resources": res})
    sem = space.semantics
    if args.steps is not None:
        sem = sem.model_copy(update={"steps": args.steps, "warmup_steps": args.steps // 2})
    names = [g.split("=", 1)[0] for g in args.grid]
    values = [[_value(v) for v in g.split("=", 1)[1].split(",")] for g in args.grid]
    configs = []
    for combo in itertools.product(*values):
        p = space.full_params({**space.baseline(), **dict(zip(names, combo, strict=True))})
        if not check(space, p):
            configs.append(p)
    configs = configs[args.skip : None if args.limit is None else args.skip + args.limit]
    world = space.resources.world_size
    model_row = {k: getattr(space.model, k) for k in _MODEL_KEYS}
    model_row.update(
        seq_length=sem.seq_length, global_batch_size=sem.global_batch_size, precision=sem.precision
    )
    hw = {"gpu": space.resources.gpu, "gpu_memory_gib": space.resources.gpu_memory_gib}
    out = Path(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="dse_measure_"))
    print(f"{len(configs)} configurations, world size {world}", flush=True)
    for i, params in enumerate(configs):
        if args.stop_at is not None and time.time() > args.stop_at:
            print(f"stopped at the deadline: {len(configs) - i} configurations not run")
            break
        tdir = tmp / f"c{i}"
        tdir.mkdir()
        spec = TrialSpec(
            study="measure",
            trial_number=i,
            params=params,
            model=space.model.model_dump(),
            semantics=sem.model_dump(),
            world_size=world,
            device=args.device,
            metrics_path=str(tdir / "metrics.jsonl"),
            gpu=space.resources.gpu,
            gpu_memory_gib=space.resources.gpu_memory_gib,
        )
        (tdir / "trial.json").write_text(spec.model_dump_json())
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}", "-m", "dse.workloads.megatron.trainer",
            "--spec", str(tdir / "trial.json"),
        ]  # fmt: skip
        t0 = time.monotonic()
        try:
            with open(tdir / "log.txt", "w") as log:
                subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False,
                )  # fmt: skip
        except subprocess.TimeoutExpired:
            pass
        oc = read_metrics(tdir / "metrics.jsonl")
        if oc is None:
            oc = Outcome.failure("error", f"no final metrics line (timeout {args.timeout_s} s)")
        metrics: dict[str, Any] = {}
        if oc.ok:
            status = "ok"
            m = oc.metrics
            metrics = {
                k: m.get(k)
                for k in ("tflops_per_gpu", "step_time_s", "peak_mem_gib", "peak_reserved_gib")
            }
            metrics["loss"] = [s.loss for s in oc.steps]
            # the measurement and its intervals (dse.measure), which the replay passes on
            for k in ("measurement", "step_time_ci_s", "tflops_per_gpu_ci"):
                if k in m:
                    metrics[k] = m[k]
        else:
            fc = oc.failure_class or "error"
            status = fc if fc in ("oom", "invalid") else "error"
            metrics = {k: v for k, v in oc.metrics.items() if k.startswith("peak_")}
            metrics["error"] = (oc.reason or "")[:300]
        row = {
            "params": {k: params[k] for k in sorted(params)},
            "status": status,
            "metrics": metrics,
            "world_size": world,
            "model": model_row,
            "hardware": hw,
        }
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"[{i + 1}/{len(configs)}] {time.monotonic() - t0:5.1f}s {status} "
            f"{metrics.get('peak_mem_gib')} {json.dumps(params, sort_keys=True)}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
