"""The same trial as a process of its own and in a warm worker, alternated on one node: step
time, start-up and what the worker keeps after each trial.

    python bench/warm_vs_process.py --space examples/llama_1b_h200.yaml \
        --config attention_backend=sdpa,micro_batch_size=8,recompute=none,\
bias_activation_fusion=true,cross_entropy_loss_fusion=true \
        --pairs 3 --steps 12 --json warm_vs_process.json

Each pair runs the configuration once through the local runner with a process per trial
(``torchrun``, as ``runner.options.warm_workers: false`` does) and once through a warm worker
(the same runner with warm workers; one worker for the whole run, so its later trials are
the 2nd, 3rd, ... of a worker, as in a study), in alternating order (P W W P P W ...). The
trials are real dse trials (trial spec, metrics file), measured in ``fixed`` mode for
``--steps`` steps with ``semantics.warmup_steps`` warm-up steps. ``--others N`` runs N other
configurations of the space in the worker first (a study's worker has run other trials
before the best).

Per trial it records the median of the measured steps, their per-step times (with the
even/odd ratio that shows alternating steps), the wall time the runner held the slot, the
model build and the first step (``build_s``, ``first_step_s``), and for the warm worker its
memory after the release (reserved and allocated MiB on CUDA, the resident set on CPU) and
the tensors still reachable (``DSE_WORKER_COUNT_TENSORS``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adaptive_window as aw  # noqa: E402  (a sibling bench script)
import host_jitter as hj  # noqa: E402

from dse.runners import Finished, Launch, LocalRunner  # noqa: E402
from dse.runners.warm import WarmSettings  # noqa: E402
from dse.stats.measure import MeasurementSpec  # noqa: E402
from dse.workloads import trial_command  # noqa: E402

OWNER = "bench:warm_vs_process"


def _launch(root: Path, tid: int, spec: Any) -> Launch:
    d = root / f"trial-{tid:05d}"
    d.mkdir(parents=True)
    spec = spec.model_copy(update={"metrics_path": str(d / "metrics.jsonl"), "trial_number": tid})
    (d / "trial.json").write_text(spec.model_dump_json())
    return Launch(trial_id=tid, number=tid, argv=trial_command("megatron", str(d / "trial.json"),
                  world_size=1), trial_dir=d, metrics_path=d / "metrics.jsonl",
                  log_path=d / "log.txt", world_size=1, device=spec.device,
                  env={"DSE_TRIAL_OWNER": OWNER}, spec=spec, timeout_s=400.0,
                  hang_timeout_s=200.0)  # fmt: skip


def _run(r: LocalRunner, launch: Launch, timeout: float = 420.0) -> Finished:
    r.submit(launch)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in r.poll():
            return f
        time.sleep(0.02)
    raise SystemExit(f"trial {launch.trial_id} did not finish within {timeout:.0f} s")


def _row(mode: str, f: Finished, warmup: int) -> dict[str, Any]:
    o = f.outcome
    t = [float(s.step_time_s) for s in o.steps][warmup:]
    even, odd = t[0::2], t[1::2]
    m = o.metrics
    return {
        "mode": mode,
        "ok": o.ok,
        "failure": None if o.ok else f"{o.failure_class}: {o.reason}"[:300],
        "median_step_s": statistics.median(t) if t else None,
        "tflops_per_gpu": m.get("tflops_per_gpu"),
        "even_over_odd": statistics.median(even) / statistics.median(odd) if len(t) >= 4 else None,
        "step_time_s": t,
        "held_s": f.wall_s,
        "steps_s": sum(float(s.step_time_s) for s in o.steps),
        "build_s": m.get("build_s"),
        "first_step_s": m.get("first_step_s"),
        "adam_impl": m.get("adam_impl"),
        "worker": f.worker,
    }


def _released(root: Path) -> list[dict[str, Any]]:
    p = root / "workers" / "events.jsonl"
    if not p.exists():
        return []
    evs = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return [e for e in evs if e.get("event") in ("released", "recycle")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--config", required=True, metavar="KNOB=V,KNOB=V")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="measured steps per trial")
    ap.add_argument("--others", type=int, default=0)
    ap.add_argument("--time-budget-s", type=float, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.fixed_steps = args.steps
    space = aw._space(args)
    warmup = space.semantics.warmup_steps
    space_sem = {**space.semantics.model_dump(), "steps": warmup + args.steps}
    params = hj._config(args.config)
    t0 = time.perf_counter()
    os.environ["DSE_WORKER_COUNT_TENSORS"] = "1"
    out: dict[str, Any] = {"args": vars(args), "config": params, "trials": []}

    def save() -> None:
        out["elapsed_s"] = time.perf_counter() - t0
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        fixed = MeasurementSpec(mode="fixed")
        spec = aw._spec(space, params, fixed, root)
        spec = spec.model_copy(update={"semantics": space_sem})
        dev = space.resources.device
        warm_root = root / "warm"
        settings = WarmSettings(python=sys.executable, workdir=warm_root)
        warm = LocalRunner(device=dev, world_size=1, max_parallel=1, warm=settings)
        proc = LocalRunner(device=dev, world_size=1, max_parallel=1)
        warm.prepare(OWNER)
        tid = 0
        try:
            others = [p for p in aw._pick(space, args.others + 1, 0, set()) if p != params]
            for p in others[: args.others]:
                tid += 1
                s = aw._spec(space, p, fixed, root).model_copy(update={"semantics": space_sem})
                row = _row("warm_other", _run(warm, _launch(root, tid, s)), warmup)
                row["config"] = p
                out["trials"].append(row)
                save()
            for i in range(args.pairs):
                order = ("process", "warm") if i % 2 == 0 else ("warm", "process")
                for mode in order:
                    if args.time_budget_s and time.perf_counter() - t0 > args.time_budget_s:
                        break
                    tid += 1
                    r = warm if mode == "warm" else proc
                    row = _row(mode, _run(r, _launch(root, tid, spec)), warmup)
                    row["pair"] = i
                    out["trials"].append(row)
                    ms = row["median_step_s"]
                    print(f"pair {i} {mode:8s} median step {ms if ms is None else f'{ms:.4f}'} s"
                          f"  held {row['held_s']:.1f} s  build {row['build_s']}  first step "
                          f"{row['first_step_s']}  even/odd {row['even_over_odd']}",
                          flush=True)  # fmt: skip
                    save()
            deadline = time.monotonic() + 60
            want = sum(1 for t in out["trials"] if t["mode"] != "process")
            while len(_released(warm_root)) < want and time.monotonic() < deadline:
                warm.poll()
                time.sleep(0.05)
        finally:
            warm.close()
        out["worker_releases"] = _released(warm_root)
    by: dict[str, list[float]] = {}
    for t in out["trials"]:
        if t["ok"] and t["median_step_s"] and t["mode"] in ("process", "warm"):
            by.setdefault(t["mode"], []).append(t["median_step_s"])
    out["summary"] = {m: {"median_step_s": statistics.median(v), "trials": len(v)}
                      for m, v in by.items()}  # fmt: skip
    if "process" in by and "warm" in by:
        out["summary"]["warm_over_process"] = statistics.median(by["warm"]) / statistics.median(
            by["process"]
        )
    for e in out["worker_releases"]:
        rel = e.get("release") or {}
        live = {k: v for k, v in rel.items() if k.startswith("live_")}
        print(f"worker after a trial: memory {e.get('memory_mib')} MiB, allocated "
              f"{rel.get('allocated_mib')} MiB, live tensors {live}", flush=True)  # fmt: skip
    print(json.dumps(out["summary"]), flush=True)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
