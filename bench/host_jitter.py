"""Where a configuration's step-time drift comes from: host work, garbage collection, the CPU.

    python bench/host_jitter.py --space examples/llama_1b_h200.yaml \
        --set semantics.global_batch_size=4 --config micro_batch_size=1,recompute=full \
        --steps 40 --repeats 2 --json host_jitter.json

One configuration at a time is built once with dse's trainer (one rank in this process, as
``bench/adaptive_window.py`` does) and trained in fixed windows of ``--steps`` steps, the
conditions interleaved ``--repeats`` times (A B C A B C ...) so that a drift of the machine
over time is not read as an effect of a condition:

* ``default``: the trainer as a trial runs it;
* ``manual_gc``: Python's cyclic garbage collector frozen and disabled during the window
  (what Megatron-LM's ``--manual-gc`` does between its collections);
* ``pinned``: ``manual_gc``, and the training thread bound to one CPU core;
* ``legacy_loss``: the trainer's loss function as it was before it kept the token count on
  the device (``torch.tensor(n, device=...)``: a copy from host memory, which on a GPU waits
  for the stream to drain at every micro-batch);
* ``legacy_norm``: Megatron-Core's own ``local_multi_tensor_l2_norm`` for the gradient norm
  again, where dse's trainer bound its on-device norm (``dse/workloads/megatron/_compat.py``):
  one copy to the host per parameter tensor and step.

``--count-syncs`` (CUDA) then runs 5 more steps per condition under
``torch.cuda.set_sync_debug_mode("warn")`` and records how many operations synchronized the
host with the GPU per step.

Per step it records the wall time of the step loop's iteration, the training thread's own CPU
time in it (``time.thread_time``: near the wall time when the host, not the GPU, sets the
pace), the machine's steal time (``/proc/stat``: CPU time the hypervisor gave to others) and
the garbage collector's pauses. Per window it prints the median step time, its spread
(coefficient of variation and max/min), the median CPU/wall ratio, the steal share and the
collection time. Nothing here changes the trainer; a condition that helps is a finding to
build on, not a result of dse.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adaptive_window as aw  # noqa: E402  (a sibling bench script)

from dse.stats.measure import MeasurementSpec  # noqa: E402

CONDITIONS = ("default", "manual_gc", "pinned", "legacy_loss", "legacy_norm")


def _legacy_loss_func(output_tensor: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The trainer's loss function before it kept the token count on the device."""
    import torch

    losses = output_tensor.float()
    loss_sum = losses.sum()
    num_tokens = torch.tensor(losses.numel(), dtype=torch.int, device=losses.device)
    report = torch.stack([loss_sum.detach().clone(), num_tokens.detach().float()])
    return loss_sum, num_tokens, {"lm loss": report}


@contextlib.contextmanager
def _legacy_parts(tr: aw.Trainer, condition: str) -> Iterator[None]:
    """Within: the trainer's loss function or Megatron-Core's gradient norm as they were,
    per ``condition``; both restored on the way out."""
    loss_func = tr.trainer._loss_func
    clip_grads = norm = None
    if condition == "legacy_norm":
        from megatron.core import utils
        from megatron.core.optimizer import clip_grads

        norm = clip_grads.l2_norm_impl
        clip_grads.l2_norm_impl = utils.local_multi_tensor_l2_norm
    if condition == "legacy_loss":
        tr.trainer._loss_func = _legacy_loss_func
    try:
        yield
    finally:
        tr.trainer._loss_func = loss_func
        if clip_grads is not None:
            clip_grads.l2_norm_impl = norm


def _proc_stat() -> tuple[int, int]:
    """(total, steal) jiffies of all CPUs; (0, 0) where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return sum(fields), fields[7] if len(fields) > 7 else 0


class _StepProbe:
    """Stands in for the trainer's metrics writer: samples the host at every step's end."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.gc_s = 0.0
        self._gc_t0 = 0.0
        self._last = (time.perf_counter(), time.thread_time(), *_proc_stat())

    def gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_t0

    def step(self, m: Any) -> None:
        now = (time.perf_counter(), time.thread_time(), *_proc_stat())
        wall, cpu = now[0] - self._last[0], now[1] - self._last[1]
        total, steal = now[2] - self._last[2], now[3] - self._last[3]
        self.rows.append({
            "step_time_s": float(m.step_time_s),
            "iter_wall_s": wall,
            "thread_cpu_s": cpu,
            "steal_share": steal / total if total > 0 else 0.0,
            "gc_s": self.gc_s,
        })  # fmt: skip
        self.gc_s = 0.0
        self._last = now


def _window(tr: aw.Trainer, plan: Any, built: Any, spec: Any, condition: str, core: int) -> Any:
    probe = _StepProbe()
    gc.callbacks.append(probe.gc_callback)
    old_affinity = os.sched_getaffinity(0)
    try:
        if condition in ("manual_gc", "pinned"):
            gc.collect()
            gc.freeze()
            gc.disable()
        if condition == "pinned":
            os.sched_setaffinity(0, {core})  # pid 0: this (the training) thread only
        probe._last = (time.perf_counter(), time.thread_time(), *_proc_stat())
        with _legacy_parts(tr, condition):
            tr.trainer.train(plan, built, tr.device, tr.dist, probe)
    finally:
        os.sched_setaffinity(0, old_affinity)
        gc.enable()
        gc.unfreeze()
        gc.callbacks.remove(probe.gc_callback)
    return probe.rows


def _syncs_per_step(tr: aw.Trainer, plan: Any, built: Any, spec: Any, condition: str) -> float:
    """Host-device synchronizations per step under ``condition`` (5 steps, CUDA only)."""
    import torch

    steps = 5
    short = spec.model_copy(update={"measurement": MeasurementSpec(
        mode="adaptive", min_steps=steps, max_steps=steps).model_dump(mode="json")})  # fmt: skip
    with _legacy_parts(tr, condition), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            tr.trainer.train(
                dataclasses.replace(plan, spec=short), built, tr.device, tr.dist, None
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / steps


def _summary(rows: list[dict[str, float]], warmup: int) -> dict[str, float]:
    xs = rows[warmup:]
    t = [r["step_time_s"] for r in xs]
    return {
        "median_step_s": statistics.median(t),
        "cv": statistics.stdev(t) / statistics.mean(t) if len(t) > 1 else 0.0,
        "max_over_min": max(t) / min(t),
        "cpu_over_wall": statistics.median(r["thread_cpu_s"] / r["iter_wall_s"] for r in xs),
        "steal_share": statistics.mean(r["steal_share"] for r in xs),
        "gc_s": sum(r["gc_s"] for r in xs),
    }


def _config(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in text.split(","):
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"--config {text}: {item!r} is not KNOB=VALUE")
        out[k.strip()] = yaml.safe_load(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument(
        "--config",
        action="append",
        required=True,
        metavar="KNOB=V,KNOB=V",
        help="a configuration (the space's baseline for knobs left out); repeatable",
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument(
        "--core",
        type=int,
        default=None,
        help="the core of 'pinned' (default: the highest this process may use)",
    )
    ap.add_argument(
        "--count-syncs",
        action="store_true",
        help="CUDA: count host-device synchronizations per step and condition",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)  # fmt: skip
    conditions = [c.strip() for c in args.conditions.split(",")]
    for c in conditions:
        if c not in CONDITIONS:
            raise SystemExit(f"--conditions: {c!r} is not one of {', '.join(CONDITIONS)}")
    args.fixed_steps = args.steps  # the window, as adaptive_window's --fixed-steps
    space = aw._space(args)
    warmup = space.semantics.warmup_steps
    core = args.core if args.core is not None else max(os.sched_getaffinity(0))
    fixed = MeasurementSpec(mode="fixed")
    from dse.workloads.megatron.features import detect_features

    feats = set(detect_features())
    tr = aw.Trainer(space.resources.device)
    out: dict[str, Any] = {"args": vars(args), "core": core, "configs": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for text in args.config:
            params = _config(text)
            spec = aw._spec(space, params, fixed, tmp)
            plan, built, build_s = tr.build(spec, feats)
            windows = []
            for rep in range(args.repeats):
                for cond in conditions:
                    rows = _window(tr, plan, built, spec, cond, core)
                    s = _summary(rows, warmup)
                    windows.append({"condition": cond, "repeat": rep, "summary": s, "steps": rows})
                    print(f"{text:50s} {cond:10s} #{rep}  median {s['median_step_s']:.4f} s  "
                          f"cv {s['cv']:.2%}  max/min {s['max_over_min']:.3f}  "
                          f"cpu/wall {s['cpu_over_wall']:.2f}  steal {s['steal_share']:.2%}  "
                          f"gc {s['gc_s']:.3f} s", flush=True)  # fmt: skip
            syncs = {}
            if args.count_syncs and tr.device.type == "cuda":
                for cond in conditions:
                    syncs[cond] = _syncs_per_step(tr, plan, built, spec, cond)
                print(f"{text:50s} host-device syncs per step: {syncs}", flush=True)
            tr.release(built)
            out["configs"].append({"config": params, "build_s": build_s, "windows": windows,
                                   "syncs_per_step": syncs})  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
