"""Adaptive trial length against a fixed 50-step window: GPU-seconds and rank agreement.

    python bench/adaptive_window.py --space examples/llama_1b_h200.yaml --configs 20 \
        --set semantics.global_batch_size=4 --json adaptive_window.json

For ``--configs`` configurations of the space (the baseline first, then a seeded sample of
those that pass the validity rules and, where the space names a GPU memory, the cost model's
memory screen), each is measured twice with dse's own trainer loop
(``dse.workloads.megatron.trainer``, one rank in this process):

* **fixed**: ``--fixed-steps`` steps (default 50), the first ``semantics.warmup_steps``
  excluded, the value the window's median (``measurement.mode: fixed``);
* **adaptive**: ``measurement.mode: adaptive`` with ``--min-steps``, ``--max-steps``,
  ``--rel-halfwidth`` and ``--confidence``: warm-up detected from the data, stopped once the
  steady-state step time is known to the precision (:mod:`dse.measure`).

``--adaptive live`` (default) runs both: the adaptive run first, on a freshly built model (its
real cold start), then the fixed window continuing the same model (its GPU-seconds then miss
the cold start, which makes the ratio smaller than it is: conservative), or with
``--rebuild`` on a fresh build of its own, the two in alternating order. ``--adaptive series``
runs the fixed window once and applies the adaptive rule to the prefix of its series (what a
live run stops at when its steps take those times).

It prints one row per configuration and: the median ratio of GPU-seconds fixed / adaptive
(the training steps, and with each run's model build), Kendall's tau between the rankings of
the objective from the two, and whether both name the same best. GPU-seconds are wall seconds
of the step loop times the GPUs of a trial (one here); a real trial adds process start,
imports and NCCL set-up to both.

``--set FIELD=VALUE`` changes a field of the space for this bench only (e.g.
``resources.world_size=1`` to run a space of more ranks on one, ``semantics.global_batch_size``
to shrink the step so that the bench fits a time budget).
``--time-budget-s`` starts no configuration past it (the rows measured so far count).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from dse.measure import MeasurementSpec, StepSeries
from dse.records import TrialSpec, summarize_steps
from dse.rules import check
from dse.space import SearchSpace, load_space, params_key, parse_space


def _space(args: argparse.Namespace) -> SearchSpace:
    space = load_space(args.space)
    data = space.model_dump(mode="json")
    for item in args.set:
        path, _, raw = item.partition("=")
        *head, last = path.split(".")
        node = data
        for k in head:
            node = node[k]
        if last not in node:
            raise SystemExit(f"--set {item}: the space has no field {path}")
        node[last] = yaml.safe_load(raw)
    data["semantics"]["steps"] = max(args.fixed_steps, data["semantics"]["warmup_steps"] + 1)
    return parse_space(data, args.space)


def _pick(space: SearchSpace, n: int, seed: int, features: set[str]) -> list[dict[str, Any]]:
    """The baseline, then a seeded sample of valid configurations predicted to fit."""
    cm = None
    if space.resources.gpu_memory_gib and space.resources.device == "cuda":
        from dse.costmodel.model import CostModel

        cm = CostModel(space.model, space.semantics, space.resources)
    ok: list[dict[str, Any]] = []
    for p in space.iter_configs():
        full = space.full_params(p)
        if check(space, full, features):
            continue
        if cm is not None and not cm.fits(full, space.prescreen.margin)[0]:
            continue
        ok.append(p)
    base = space.baseline()
    rest = [p for p in ok if params_key(p) != params_key(base)]
    random.Random(seed).shuffle(rest)
    head = [base] if any(params_key(p) == params_key(base) for p in ok) else []
    return (head + rest)[:n]


def _estimate_s(space: SearchSpace, configs: list[dict[str, Any]], steps: int) -> float | None:
    """Cost-model seconds of ``steps`` steps of every configuration (None off the GPU)."""
    if space.resources.device != "cuda" or not space.resources.gpu:
        return None
    from dse.costmodel.model import CostModel

    cm = CostModel(space.model, space.semantics, space.resources)
    return sum(
        steps * float(cm.estimate_throughput(space.full_params(p))["step_time_s"]) for p in configs
    )


class Trainer:
    """dse's trainer in this process: one rank, one configuration at a time."""

    def __init__(self, device: str) -> None:
        from dse.workloads.megatron import trainer

        trainer._quiet_known_warnings()
        if device == "cpu":
            from dse.workloads.megatron import _cpu_shims

            _cpu_shims.install()
        else:
            os.environ.update(trainer.cuda_environment(os.environ))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        self.trainer = trainer
        self.dist = trainer._Dist()
        self.device = self.dist.init(device)
        from dse.workloads.megatron import _compat

        _compat.apply()

    def build(self, spec: TrialSpec, features: set[str]) -> tuple[Any, Any, float]:
        from dse.workloads.megatron._plan import make_plan

        t0 = time.perf_counter()
        plan = make_plan(spec, features)
        built = self.trainer.build(plan, self.device)
        self._sync()
        return plan, built, time.perf_counter() - t0

    def train(self, plan: Any, built: Any, spec: TrialSpec) -> tuple[list[Any], StepSeries, float]:
        plan = dataclasses.replace(plan, spec=spec)  # the run's measurement
        self._sync()
        t0 = time.perf_counter()
        steps, series = self.trainer._train(plan, built, self.device, self.dist, None)
        self._sync()
        return steps, series, time.perf_counter() - t0

    def release(self, built: Any) -> None:
        from megatron.core import parallel_state

        del built
        parallel_state.destroy_model_parallel()
        gc.collect()
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize()


def _spec(space: SearchSpace, p: dict[str, Any], m: MeasurementSpec, tmp: Path) -> TrialSpec:
    return TrialSpec(
        study="adaptive-window",
        trial_number=0,
        params=space.full_params(p),
        model=space.model.model_dump(),
        semantics=space.semantics.model_dump(),
        world_size=space.resources.world_size,
        device=space.resources.device,
        metrics_path=str(tmp / "unused.jsonl"),
        measurement=m.model_dump(mode="json"),
    )


def _objective(space: SearchSpace, m: Any, tokens: float) -> float:
    metric = space.objective.metric
    if metric == "step_time_s":
        return float(m.step_time_s)
    if metric == "tokens_per_s_per_gpu":
        return tokens / (m.step_time_s * space.resources.world_size)
    if metric == "tflops_per_gpu":
        return float(m.tflops_per_gpu)
    raise SystemExit(f"the objective {metric} is not a step-time figure")


def _fixed_result(steps: list[Any], series: StepSeries, warmup: int) -> Any:
    s = summarize_steps(steps, warmup)
    return series.result(s["step_time_s"], s["tflops_per_gpu"])


def _replay(m: MeasurementSpec, steps: list[Any], fixed_steps: int, warmup: int) -> Any:
    """The adaptive rule on the prefix of a measured series: (stop step, result)."""
    s = StepSeries(m, steps=fixed_steps, warmup_steps=warmup)
    for x in steps:
        if s.add(x.step_time_s, x.tflops_per_gpu) is not None:
            break
    return len(s.times), s.result(), sum(x.step_time_s for x in steps[: len(s.times)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--space", required=True)
    ap.add_argument("--configs", type=int, default=20)
    ap.add_argument("--fixed-steps", type=int, default=50)
    ap.add_argument("--min-steps", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=50)
    ap.add_argument("--rel-halfwidth", type=float, default=0.01)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--adaptive", choices=("live", "series"), default="live")
    ap.add_argument("--rebuild", action="store_true", help="live: a fresh build for each run")
    ap.add_argument(
        "--control", action="store_true",
        help="also a second fixed window per configuration: the rank agreement of two fixed "
        "windows is the noise floor of the comparison",
    )  # fmt: skip
    ap.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="change a field of the space for this bench, e.g. semantics.global_batch_size=4",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-budget-s", type=float, default=None)
    ap.add_argument("--json", default=None, help="write every row and the summary here")
    args = ap.parse_args(argv)
    t_start = time.monotonic()

    space = _space(args)
    if space.resources.world_size != 1:
        raise SystemExit(
            "this bench runs one rank in its own process: pass --set resources.world_size=1"
        )
    warmup = space.semantics.warmup_steps
    adaptive = MeasurementSpec(
        mode="adaptive", min_steps=args.min_steps, max_steps=args.max_steps,
        rel_halfwidth=args.rel_halfwidth, confidence=args.confidence,
    )  # fmt: skip
    fixed = MeasurementSpec(mode="fixed", confidence=args.confidence)
    from dse.workloads.megatron.features import detect_features

    feats = set(detect_features())
    configs = _pick(space, args.configs, args.seed, feats)
    est = _estimate_s(space, configs, args.fixed_steps + (args.min_steps + 5) * (
        args.adaptive == "live"))  # fmt: skip
    print(
        f"{len(configs)} configurations of {args.space} ({space.resources.device}, "
        f"GBS {space.semantics.global_batch_size}); fixed: {args.fixed_steps} steps after "
        f"{warmup} warm-up; adaptive ({args.adaptive}): {args.min_steps}-{args.max_steps} "
        f"steps, +-{args.rel_halfwidth:.1%} at {args.confidence:.0%}"
        + (f"; cost-model estimate of the step loops: {est:.0f} s" if est else ""),
        flush=True,
    )
    tr = Trainer(space.resources.device)
    tokens = space.semantics.global_batch_size * space.semantics.seq_length
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # prime the process (CUDA context, kernels' first use): not measured
        plan, built, _ = tr.build(_spec(space, configs[0], fixed, tmp), feats)
        tr.train(plan, built, _spec(space, configs[0], MeasurementSpec(
            mode="adaptive", min_steps=5, max_steps=5), tmp))  # fmt: skip
        tr.release(built)
        for i, p in enumerate(configs):
            if args.time_budget_s and time.monotonic() - t_start > args.time_budget_s:
                print(f"time budget of {args.time_budget_s:.0f} s spent after {i} configurations")
                break
            row: dict[str, Any] = {"params": p}
            try:
                row.update(_measure(tr, space, p, fixed, adaptive, args, i, feats, tmp, warmup))
            except Exception as e:  # noqa: BLE001 - an OOM or a refusal is a row, not the end
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                tr.release(None)
            if "error" not in row:
                row["fixed_value"] = _objective(space, row.pop("_fixed"), tokens)
                row["adaptive_value"] = _objective(space, row.pop("_adaptive"), tokens)
                if "_control" in row:
                    row["control_value"] = _objective(space, row.pop("_control"), tokens)
            rows.append(row)
            _print_row(i, row)
    summary = _summary(space, rows)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows,
                                               "summary": summary}, indent=1))  # fmt: skip
    return 0


def _measure(
    tr: Trainer,
    space: SearchSpace,
    p: dict[str, Any],
    fixed: MeasurementSpec,
    adaptive: MeasurementSpec,
    args: argparse.Namespace,
    i: int,
    feats: set[str],
    tmp: Path,
    warmup: int,
) -> dict[str, Any]:
    fspec, aspec = _spec(space, p, fixed, tmp), _spec(space, p, adaptive, tmp)
    plan, built, build_s = tr.build(fspec, feats)
    out: dict[str, Any] = {"build_s": build_s}
    if args.adaptive == "series":
        steps, series, wall = tr.train(plan, built, fspec)
        tr.release(built)
        f = _fixed_result(steps, series, warmup)
        n, a, a_wall = _replay(adaptive, steps, args.fixed_steps, warmup)
        out.update(fixed_s=wall, adaptive_s=a_wall * wall / sum(s.step_time_s for s in steps))
    else:
        # shared build: the adaptive run takes the cold start; fresh builds: alternate
        order = ["fixed", "adaptive"] if args.rebuild and i % 2 else ["adaptive", "fixed"]
        res: dict[str, Any] = {}
        for k, which in enumerate(order):
            if k == 1 and args.rebuild:
                tr.release(built)
                plan, built, _ = tr.build(fspec, feats)
            res[which] = tr.train(plan, built, aspec if which == "adaptive" else fspec)
        tr.release(built)
        steps, series, wall = res["fixed"]
        a_steps, a_series, a_wall = res["adaptive"]
        f = _fixed_result(steps, series, warmup)
        n, a = len(a_steps), a_series.result()
        out.update(fixed_s=wall, adaptive_s=a_wall, first=order[0])
    if args.control:
        plan, built, _ = tr.build(fspec, feats)
        c_steps, c_series, _ = tr.train(plan, built, fspec)
        tr.release(built)
        out["_control"] = _fixed_result(c_steps, c_series, warmup)
    out.update(
        adaptive_steps=n,
        adaptive_warmup=a.warmup_steps,
        adaptive_stop=a.stop_reason,
        adaptive_ci_s=a.step_time_ci_s,
        fixed_step_s=f.step_time_s,
        adaptive_step_s=a.step_time_s,
        _fixed=f,
        _adaptive=a,
    )
    return out


def _print_row(i: int, r: dict[str, Any]) -> None:
    knobs = " ".join(f"{k}={v}" for k, v in r["params"].items())
    if "error" in r:
        print(f"{i:>3} {'-':>9} {'-':>9} {'-':>6} {'-':>5}   {r['error']} | {knobs}", flush=True)
        return
    ratio = r["fixed_s"] / r["adaptive_s"]
    rel = (r["adaptive_value"] - r["fixed_value"]) / r["fixed_value"]
    print(
        f"{i:>3} {r['fixed_value']:>9.4g} {r['adaptive_value']:>9.4g} {rel:>+6.1%} "
        f"{r['adaptive_steps']:>3}/{r['adaptive_warmup']:<2} {r['adaptive_stop']:<9} "
        f"{r['fixed_s']:>7.2f}s {r['adaptive_s']:>6.2f}s x{ratio:<5.2f} | {knobs}",
        flush=True,
    )


def _summary(space: SearchSpace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from scipy.stats import kendalltau

    ok = [r for r in rows if "error" not in r]
    if len(ok) < 2:
        return {"configs": len(rows), "measured": len(ok)}
    sign = 1 if space.objective.direction == "maximize" else -1
    fx = [r["fixed_value"] for r in ok]
    ad = [r["adaptive_value"] for r in ok]
    tau = kendalltau(fx, ad)
    ratios = [r["fixed_s"] / r["adaptive_s"] for r in ok]
    # a trial builds its model once: each run is charged one build
    with_build = [(r["fixed_s"] + r["build_s"]) / (r["adaptive_s"] + r["build_s"]) for r in ok]
    control: dict[str, Any] = {}
    if all("control_value" in r for r in ok):
        cx = [r["control_value"] for r in ok]
        control = {
            "kendall_tau_fixed_vs_fixed": float(kendalltau(fx, cx).statistic),
            "median_abs_rel_diff_fixed_vs_fixed": statistics.median(
                abs(c - f) / f for f, c in zip(fx, cx, strict=True)
            ),
        }
    best_f = max(range(len(ok)), key=lambda i: sign * fx[i])
    best_a = max(range(len(ok)), key=lambda i: sign * ad[i])
    rel = [abs(a - f) / f for f, a in zip(fx, ad, strict=True)]
    return {
        "configs": len(rows),
        "measured": len(ok),
        "objective": space.objective.metric,
        "median_gpu_seconds_ratio": statistics.median(ratios),
        "median_gpu_seconds_ratio_with_build": statistics.median(with_build),
        "total_fixed_s": sum(r["fixed_s"] for r in ok),
        "total_adaptive_s": sum(r["adaptive_s"] for r in ok),
        "median_adaptive_steps": statistics.median(r["adaptive_steps"] for r in ok),
        "stops": {
            k: sum(r["adaptive_stop"] == k for r in ok) for k in ("converged", "max_steps")
        },  # fmt: skip
        "kendall_tau": float(tau.statistic),
        "kendall_p": float(tau.pvalue),
        "same_best": best_f == best_a,
        "median_abs_rel_diff": statistics.median(rel),
        "max_abs_rel_diff": max(rel),
        **control,
    }


if __name__ == "__main__":
    sys.exit(main())
