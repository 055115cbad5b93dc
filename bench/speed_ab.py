"""One configuration's step: where its time goes (torch profiler), and speed-ups A/B-tested
in one process, interleaved, with their losses checked against the default's.

    python bench/speed_ab.py --space examples/llama_1b_h200.yaml \
        --config attention_backend=sdpa,micro_batch_size=8,recompute=none,\
bias_activation_fusion=true,cross_entropy_loss_fusion=true \
        --conditions default,foreach_adam,legacy_norm,threads1,cuda_graph \
        --steps 10 --repeats 3 --profile-steps 2 --parity-steps 5 --json speed_ab.json

The configuration is built once with dse's trainer (one rank in this process, as
``bench/host_jitter.py`` does) and trained in windows of ``--steps`` steps (after
``semantics.warmup_steps`` steps of the window that are not counted), the conditions
interleaved ``--repeats`` times (A B C A B C ...), so that a drift of the machine is not read
as an effect. Conditions:

* ``default``: the trainer as a trial runs it (torch's fused AdamW where Megatron-Core fell
  back to torch, the gradient norm on the device);
* ``foreach_adam``: torch's default multi-tensor AdamW (what Megatron-Core's fallback got
  before the trainer asked for the fused one; the same model and optimizer state, switched);
* ``legacy_norm``: Megatron-Core's own host-copy gradient norm patched back in;
* ``manual_gc``: Python's collector frozen and off during the window;
* ``threads1``: ``torch.set_num_threads(1)`` during the window (``torchrun``'s
  ``OMP_NUM_THREADS=1`` in a process per trial, against a warm worker's cores per slot);
* ``cuda_graph``: the configuration with ``cuda_graph_impl: local`` (Megatron-Core's own
  per-layer CUDA graphs; a build of its own, made and released around its windows): where
  Megatron-Core refuses it, the row records its reason.

``--profile-steps N`` profiles N steps of ``default`` (torch.profiler) and summarises the
device time by kind from the profile's Chrome trace: only the device's own work (kernels,
copies, fills), each kernel classified by its name (matmul, attention, norm, optimizer,
softmax/loss, communication, memcpy/memset, elementwise/other); the profiler's annotations
(``ProfilerStep#N`` and ``record_function`` ranges, which the trace also puts on the device's
timeline, as long as the kernels inside them) and CPU events are left out. The device's idle
time is the steps' wall time less the union of the kernels' spans. ``--trace FILE`` keeps
the trace (gzip) for another look. On CPU the summary is of CPU operator self time, without
the annotations (no idle figure).
``--parity-steps K`` builds the model afresh for ``default`` and for each condition that
changes a computation, trains K steps from the same seed and data, and records the largest
relative loss difference from ``default``: a speed-up must not change the training.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adaptive_window as aw  # noqa: E402  (a sibling bench script)
import host_jitter as hj  # noqa: E402

from dse.stats.measure import MeasurementSpec  # noqa: E402

CONDITIONS = ("default", "foreach_adam", "legacy_norm", "manual_gc", "threads1", "cuda_graph")
#: Conditions that are another configuration (a build of their own): their knob values.
VARIANTS: dict[str, dict[str, Any]] = {"cuda_graph": {"cuda_graph_impl": "local"}}
#: Conditions whose computation differs from default's (their losses are compared).
CHANGES_MATH = ("foreach_adam", "legacy_norm", "cuda_graph")

#: Kernel (or CPU operator) names by kind, first match wins. Device work is classified by
#: the kernel's own name (``nvjet_*``/``sm90_xmma_gemm_*``: matmul; ``flash_fwd_*``: attention;
#: ``multi_tensor_apply_kernel``/``FusedAdam``: optimizer; ...); copies and fills by their
#: trace category (:data:`DEVICE_CATS`).
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (k, re.compile(p, re.I))
    for k, p in (
        ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast"),
        ("attention", r"flash|fmha|attention|sdpa|_efficient_attention|cudnn.*(sdpa|attn)"),
        ("optimizer", r"adam|multi_tensor|foreach|l2norm|_amp_"),
        ("norm", r"rms_?norm|layer_?norm|layernorm|rowwisemoments|welford|norm_"),
        ("softmax/loss", r"softmax|cross_?entropy|nll_?loss"),
        ("matmul", r"gemm|cutlass|cublas|xmma|nvjet|wgmma|matmul|\bmm\b|addmm|bmm|linear|"
                   r"splitk|sm\d+_|ampere_|hopper_"),
    )
)  # fmt: skip

#: Chrome-trace categories of device work (what the GPU ran): kernels, copies, fills. The
#: profiler also puts annotations on the device's timeline (``gpu_user_annotation``: each
#: ``record_function`` range and the ``ProfilerStep#N`` of the schedule, as long as the work
#: inside them); those, and every CPU-side event (``cpu_op``, ``user_annotation``,
#: ``python_function``, ``cuda_runtime``, ...), are not device work and are left out.
DEVICE_CATS = {"kernel": None, "gpu_memcpy": "memcpy/memset", "gpu_memset": "memcpy/memset"}


def kind_of(name: str) -> str:
    for k, rx in KINDS:
        if rx.search(name):
            return k
    return "elementwise/other"


def _union_s(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end]`` intervals (same unit as they are)."""
    total, end = 0.0, -float("inf")
    start = 0.0
    for a, b in sorted(spans):
        if a > end:
            if end > -float("inf"):
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end > -float("inf"):
        total += end - start
    return total


def _shares(by_kind: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    total = sum(by_kind.values()) or 1.0
    ordered = sorted(by_kind.items(), key=lambda kv: -kv[1])
    return dict(ordered), {k: v / total for k, v in ordered}


def summarise_trace(events: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Device time by kind, top kernels and the device's idle share of ``wall_s`` from a
    torch-profiler Chrome trace's ``traceEvents``: only device work (:data:`DEVICE_CATS`),
    classified by kernel name (:func:`kind_of`); the idle time is ``wall_s`` less the union
    of the kernels' spans (overlapping kernels count once)."""
    by_kind: dict[str, float] = {}
    top: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    left_out: dict[str, int] = {}
    for ev in events:
        cat = str(ev.get("cat", ""))
        if ev.get("ph") != "X" or cat not in DEVICE_CATS:
            if ev.get("ph") == "X":
                left_out[cat] = left_out.get(cat, 0) + 1
            continue
        us = float(ev.get("dur") or 0.0)
        if us <= 0:
            continue
        ts = float(ev.get("ts") or 0.0)
        spans.append((ts, ts + us))
        name = str(ev.get("name", ""))
        kind = DEVICE_CATS[cat] or kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + us / 1e6
        top[name] = top.get(name, 0.0) + us / 1e6
    busy = _union_s(spans) / 1e6
    idle = max(0.0, wall_s - busy)
    s, share = _shares(by_kind)
    return {
        "device": "cuda",
        "classified": "device work of the trace (kernels, copies, fills) by kernel name; "
        "annotations and CPU events left out",
        "wall_s": wall_s,
        "kernel_s": sum(by_kind.values()),
        "kernels": len(spans),
        "busy_union_s": busy,
        "idle_s": idle,
        "idle_share": idle / wall_s if wall_s else None,
        "by_kind_s": s,
        "by_kind_share": share,
        "left_out": dict(sorted(left_out.items())),
        "top": [[k, v] for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:25]],
    }


def _trace_events(prof: Any, keep: str | None) -> list[dict[str, Any]]:
    """The profiler's Chrome trace (``traceEvents``); kept gzipped at ``keep`` if given."""
    import gzip
    import os

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        raw = Path(path).read_bytes()
    finally:
        os.unlink(path)
    if keep:
        Path(keep).write_bytes(gzip.compress(raw))
    data = json.loads(raw)
    return list(data.get("traceEvents", []) if isinstance(data, dict) else data)


def summarise_profile(prof: Any, wall_s: float, device: str,
                      keep_trace: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Device time by kind, top kernels, and the idle share of ``wall_s`` (CUDA: from the
    trace's device work, :func:`summarise_trace`); on CPU, operator self time with the
    profiler's annotations (``record_function`` ranges, ``ProfilerStep``) left out."""
    events = _trace_events(prof, keep_trace)
    if device == "cuda":
        return summarise_trace(events, wall_s)
    annotations = {
        str(ev.get("name"))
        for ev in events
        if ev.get("cat") in ("user_annotation", "gpu_user_annotation", "python_function")
    }
    by_kind: dict[str, float] = {}
    top: dict[str, float] = {}
    for ev in prof.key_averages():
        sec = float(ev.self_cpu_time_total) / 1e6
        if sec <= 0 or ev.key.startswith("ProfilerStep") or ev.key in annotations:
            continue
        by_kind[kind_of(ev.key)] = by_kind.get(kind_of(ev.key), 0.0) + sec
        top[ev.key] = top.get(ev.key, 0.0) + sec
    s, share = _shares(by_kind)
    return {
        "device": device,
        "classified": "CPU operators' self time by name; annotations left out",
        "wall_s": wall_s,
        "kernel_s": sum(by_kind.values()),
        "busy_union_s": sum(by_kind.values()),
        "idle_s": None,
        "idle_share": None,
        "by_kind_s": s,
        "by_kind_share": share,
        "left_out": {"annotations": len(annotations)},
        "top": [[k, v] for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:25]],
    }


class _Probe:
    """Stands in for the trainer's metrics writer: per-step rows (and a profiler step)."""

    def __init__(self, prof: Any = None) -> None:
        self.prof = prof
        self.steps: list[Any] = []

    def step(self, m: Any) -> None:
        self.steps.append(m)
        if self.prof is not None:
            self.prof.step()


@contextlib.contextmanager
def _condition(tr: aw.Trainer, built: Any, cond: str) -> Iterator[None]:
    """Within: ``cond`` applied to this process and the built model; undone on the way out."""
    import torch

    from dse.workloads.megatron._speed import DEFAULT_ADAM_IMPL, set_adam_impl

    threads = torch.get_num_threads()
    frozen = False
    try:
        if cond == "foreach_adam":
            set_adam_impl(built.optimizer, "foreach")
        if cond == "threads1":
            torch.set_num_threads(1)
        if cond == "manual_gc":
            gc.collect()
            gc.freeze()
            gc.disable()
            frozen = True
        with hj._legacy_parts(tr, "legacy_norm" if cond == "legacy_norm" else "default"):
            yield
    finally:
        if cond == "foreach_adam":
            set_adam_impl(built.optimizer, DEFAULT_ADAM_IMPL)
        torch.set_num_threads(threads)
        if frozen:
            gc.enable()
            gc.unfreeze()


def _alternation(t: list[float]) -> dict[str, float | None]:
    """How much even and odd steps differ (the 0.421 / 0.445 s pattern) and the lag-1
    autocorrelation of the window's steps."""
    if len(t) < 4:
        return {"even_over_odd": None, "lag1": None}
    even, odd = t[0::2], t[1::2]
    m = statistics.fmean(t)
    den = sum((x - m) ** 2 for x in t)
    lag1 = sum((t[i] - m) * (t[i + 1] - m) for i in range(len(t) - 1)) / den if den else 0.0
    return {"even_over_odd": statistics.median(even) / statistics.median(odd), "lag1": lag1}


def _window(tr: aw.Trainer, plan: Any, built: Any, steps: int, warmup: int) -> dict[str, Any]:
    spec = plan.spec.model_copy(
        update={
            "measurement": MeasurementSpec(mode="fixed").model_dump(mode="json"),
            "semantics": {**plan.spec.semantics, "steps": warmup + steps},
        }
    )
    probe = _Probe()
    tr._sync()
    t0 = time.perf_counter()
    tr.trainer._train(dataclasses.replace(plan, spec=spec), built, tr.device, tr.dist, probe)
    tr._sync()
    wall = time.perf_counter() - t0
    rows = probe.steps[warmup:]
    t = [float(m.step_time_s) for m in rows]
    return {
        "median_step_s": statistics.median(t),
        "median_tflops": statistics.median(float(m.tflops_per_gpu) for m in rows),
        "min_step_s": min(t),
        "max_step_s": max(t),
        "wall_s": wall,
        **_alternation(t),
        "step_time_s": t,
        "loss": [float(m.loss) for m in probe.steps],
    }


def _profile(tr: aw.Trainer, plan: Any, built: Any, n: int, warmup: int,
             keep_trace: str | None = None) -> dict[str, Any]:  # fmt: skip
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU]
    if tr.device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    spec = plan.spec.model_copy(
        update={
            "measurement": MeasurementSpec(mode="fixed").model_dump(mode="json"),
            "semantics": {**plan.spec.semantics, "steps": warmup + n},
        }
    )
    with profile(
        activities=acts, schedule=schedule(wait=0, warmup=warmup, active=n, repeat=1)
    ) as prof:
        probe = _Probe(prof)
        tr.trainer._train(dataclasses.replace(plan, spec=spec), built, tr.device, tr.dist, probe)
    wall = sum(float(m.step_time_s) for m in probe.steps[warmup:])
    out = summarise_profile(prof, wall, tr.device.type, keep_trace)
    out["steps"] = n
    return out


def _build(tr: aw.Trainer, space: Any, params: dict[str, Any], feats: set[str], tmp: Path,
           extra: dict[str, Any] | None = None) -> tuple[Any, Any, float]:  # fmt: skip
    """A fresh build; one that fails leaves no parallel state behind (the next can build)."""
    spec = aw._spec(space, params, MeasurementSpec(mode="fixed"), tmp)
    if extra:
        spec = spec.model_copy(update={"params": {**spec.params, **extra}})
    try:
        return tr.build(spec, feats)
    except BaseException:
        from megatron.core import parallel_state

        from dse.workloads.megatron._speed import clear_trial_caches

        clear_trial_caches()
        parallel_state.destroy_model_parallel()
        gc.collect()
        raise


def _release(tr: aw.Trainer, built: Any) -> None:
    from dse.workloads.megatron._speed import clear_trial_caches

    clear_trial_caches()
    tr.release(built)


def _parity(tr: aw.Trainer, space: Any, params: dict[str, Any], feats: set[str], tmp: Path,
            conds: list[str], k: int) -> dict[str, Any]:  # fmt: skip
    """Losses of K steps from a fresh build per condition, against default's."""
    out: dict[str, Any] = {}
    ref: list[float] | None = None
    for cond in ["default", *[c for c in conds if c in CHANGES_MATH]]:
        try:
            plan, built, _ = _build(tr, space, params, feats, tmp, VARIANTS.get(cond))
        except Exception as e:  # noqa: BLE001 - a refusal is the row's result
            out[cond] = {"error": f"{type(e).__name__}: {e}"[:400]}
            continue
        try:
            with _condition(tr, built, cond):
                w = _window(tr, plan, built, k, 0)
            losses = w["loss"]
            row: dict[str, Any] = {"loss": losses}
            if ref is None:
                ref = losses
            else:
                row["max_rel_diff"] = max(
                    abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref, strict=False)
                )
            out[cond] = row
        except Exception as e:  # noqa: BLE001
            out[cond] = {"error": f"{type(e).__name__}: {e}"[:400]}
        finally:
            _release(tr, built)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--config", required=True, metavar="KNOB=V,KNOB=V")
    ap.add_argument("--conditions", default="default,foreach_adam,legacy_norm,threads1")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=0)
    ap.add_argument("--parity-steps", type=int, default=0)
    ap.add_argument("--trace", default=None, help="keep the profile's Chrome trace here (gzip)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="start no further window past this many seconds")  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    conds = [c.strip() for c in args.conditions.split(",") if c.strip()]
    for c in conds:
        if c not in CONDITIONS:
            raise SystemExit(f"--conditions: {c!r} is not one of {', '.join(CONDITIONS)}")
    if "default" not in conds:
        conds.insert(0, "default")
    t_start = time.perf_counter()
    args.fixed_steps = args.steps
    space = aw._space(args)
    warmup = space.semantics.warmup_steps
    params = hj._config(args.config)
    from dse.workloads.megatron.features import detect_features

    feats = set(detect_features())
    tr = aw.Trainer(space.resources.device)
    out: dict[str, Any] = {"args": vars(args), "config": params, "windows": [], "errors": {}}

    def save() -> None:
        out["elapsed_s"] = time.perf_counter() - t_start
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))

    def over() -> bool:
        return (
            args.time_budget_s is not None and time.perf_counter() - t_start > args.time_budget_s
        )

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plan, built, build_s = _build(tr, space, params, feats, tmp)
        out["build_s"] = build_s
        from dse.workloads.megatron._speed import adam_impl_of

        out["adam_impl"] = adam_impl_of(built.optimizer)
        current = "default"
        for rep in range(args.repeats):
            for cond in conds:
                if over():
                    break
                if cond in out["errors"]:
                    continue
                want = cond if cond in VARIANTS else "default"
                if want != current:
                    _release(tr, built)
                    built = None
                    try:
                        plan, built, _ = _build(tr, space, params, feats, tmp, VARIANTS.get(want))
                        current = want
                    except Exception as e:  # noqa: BLE001 - Megatron's refusal, recorded
                        out["errors"][cond] = f"{type(e).__name__}: {e}"[:600]
                        print(f"{cond:14s} refused: {out['errors'][cond]}", flush=True)
                        plan, built, _ = _build(tr, space, params, feats, tmp)
                        current = "default"
                        continue
                try:
                    with _condition(tr, built, cond):
                        w = _window(tr, plan, built, args.steps, warmup)
                except Exception as e:  # noqa: BLE001 - a condition that fails is a row
                    out["errors"][cond] = f"{type(e).__name__}: {e}"[:600]
                    print(f"{cond:14s} failed: {out['errors'][cond]}", flush=True)
                    continue
                w.update(condition=cond, repeat=rep)
                out["windows"].append(w)
                alt = w["even_over_odd"]
                print(f"{cond:14s} #{rep}  median {w['median_step_s']:.4f} s  "
                      f"{w['median_tflops']:.4g} TFLOP/s  min {w['min_step_s']:.4f}  "
                      f"max {w['max_step_s']:.4f}  even/odd "
                      f"{'-' if alt is None else f'{alt:.3f}'}", flush=True)  # fmt: skip
                save()
        if current != "default":
            _release(tr, built)
            plan, built, _ = _build(tr, space, params, feats, tmp)
        if args.profile_steps and not over():
            out["profile"] = _profile(tr, plan, built, args.profile_steps, warmup, args.trace)
            p = out["profile"]
            shares = ", ".join(f"{k} {v:.1%}" for k, v in p["by_kind_share"].items())
            idle = p["idle_share"]
            print(f"profile ({p['steps']} steps, {p['device']}): {shares}; idle "
                  f"{'n/a' if idle is None else f'{idle:.1%}'}", flush=True)  # fmt: skip
        _release(tr, built)
        if args.parity_steps and not over():
            out["parity"] = _parity(tr, space, params, feats, tmp, conds, args.parity_steps)
            for c, row in out["parity"].items():
                print(f"parity {c:14s} {row.get('max_rel_diff', row.get('error', 'reference'))}",
                      flush=True)  # fmt: skip
    out["summary"] = _ab_summary(out["windows"])
    for c, s in out["summary"].items():
        print(f"A/B {c:14s} median of window medians {s['median_step_s']:.4f} s "
              f"({s['vs_default']:+.2%} vs default, {s['windows']} windows)",
              flush=True)  # fmt: skip
    save()
    return 0


def _ab_summary(windows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per condition: the median of its windows' median step times, and its step time
    relative to default's (negative: faster)."""
    by: dict[str, list[float]] = {}
    for w in windows:
        by.setdefault(w["condition"], []).append(w["median_step_s"])
    base = statistics.median(by["default"]) if by.get("default") else None
    return {
        c: {
            "median_step_s": statistics.median(v),
            "windows": len(v),
            "vs_default": (statistics.median(v) / base - 1) if base else 0.0,
        }
        for c, v in by.items()
    }


if __name__ == "__main__":
    raise SystemExit(main())
