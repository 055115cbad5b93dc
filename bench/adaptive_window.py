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
  steady-state step time is known to the precision (:mod:`dse.stats.measure`).

``--adaptive live`` (default) runs both: the adaptive run first, on a freshly built model (its
real cold start), then the fixed window continuing the same model (its GPU-seconds then miss
the cold start, which makes the ratio smaller than it is: conservative), or with
``--rebuild`` on a fresh build of its own, the two in alternating order. ``--adaptive series``
runs the fixed window once and applies the adaptive rule to the prefix of its series (what a
live run stops at when its steps take those times).

Every row keeps the per-step series of its runs (``series``: ``fixed``, ``adaptive`` in live
mode, ``control``; each ``step_time_s`` and ``tflops_per_gpu`` per step), so that a run can be
studied offline: ``--from-json FILE`` measures nothing; it re-applies the adaptive rule of
this checkout (``dse.stats.measure``, with the precision of the command line or else of the file,
and ``--trim``) to the saved series and prints the rows and the summary as a run would. The
rule replays on the adaptive run's own series (its cold start included), continued, when
the rule asks for more steps than that run took, by the fixed window that ran on the same
model (live mode without ``--rebuild``); GPU-seconds are the replayed steps' times scaled by
their run's loop wall time over its step times. A replay that runs out of saved steps
before the rule stops says so (``replay_exhausted``).

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

from dse.core.records import TrialSpec, summarize_steps
from dse.loop.dispatch import trial_spec
from dse.model.rules import check
from dse.space.searchspace import SearchSpace, load_space, params_key, parse_space
from dse.stats.measure import TRIM, MeasurementSpec, PruneTarget, StepSeries, prune_target


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
        from dse.model.costmodel.model import CostModel

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
    from dse.model.costmodel.model import CostModel

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
        steps, series = self.trainer.train(plan, built, self.device, self.dist, None)
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


def _spec(
    space: SearchSpace,
    p: dict[str, Any],
    m: MeasurementSpec,
    tmp: Path,
    prune: PruneTarget | None = None,
) -> TrialSpec:
    """The trial spec the study loop would write for ``p``, with measurement ``m``."""
    return trial_spec(
        space,
        p,
        tmp / "unused.jsonl",
        measurement=m.model_dump(mode="json"),
        prune=None if prune is None else prune.model_dump(mode="json"),
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


def _saved(steps: list[Any]) -> dict[str, list[float]]:
    """A run's per-step series as the JSON keeps it."""
    return {
        "step_time_s": [float(x.step_time_s) for x in steps],
        "tflops_per_gpu": [float(x.tflops_per_gpu) for x in steps],
    }


def _replay(
    m: MeasurementSpec,
    times: list[float],
    tflops: list[float],
    fixed_steps: int,
    warmup: int,
    trim: float = TRIM,
    prune: PruneTarget | None = None,
) -> tuple[int, Any]:
    """The adaptive rule on the prefix of a series: (steps it takes, its result), stopped
    as ``dominated`` where ``prune`` says so."""
    s = StepSeries(m, steps=fixed_steps, warmup_steps=warmup, trim=trim, prune=prune)
    for t, tf in zip(times, tflops, strict=True):
        if s.add(t, tf) is not None:
            break
    return len(s.times), s.result()


def _fixed_from_series(
    m: MeasurementSpec, run: dict[str, list[float]], fixed_steps: int, warmup: int
) -> Any:
    """The fixed window's result from its saved series (the median of the window)."""
    s = StepSeries(m, steps=fixed_steps, warmup_steps=warmup)
    for t, tf in zip(run["step_time_s"], run["tflops_per_gpu"], strict=True):
        s.add(t, tf)
    w = min(warmup, len(s.times) - 1)
    return s.result(
        statistics.median(run["step_time_s"][w:]), statistics.median(run["tflops_per_gpu"][w:])
    )


def _adaptive_fields(n: int, a: Any, f: Any) -> dict[str, Any]:
    """The row fields of an adaptive run of ``n`` steps (result ``a``) against the fixed
    window's result ``f``: one place for the live run and the replay."""
    return {
        "adaptive_steps": n,
        "adaptive_warmup": a.warmup_steps,
        "adaptive_stop": a.stop_reason,
        "adaptive_ci_s": a.step_time_ci_s,
        "adaptive_spikes": a.spikes,
        "fixed_step_s": f.step_time_s,
        "adaptive_step_s": a.step_time_s,
    }


def _pruning_note(args: argparse.Namespace) -> str:
    if not args.prune:
        return ""
    return f"; pruned against the best so far, margin {args.prune_margin:g}"


class _Best:
    """``--prune``: the best adaptive result so far among the runs not pruned, which the next
    run is pruned against as a study's next trial is (:func:`dse.stats.measure.prune_target`)."""

    def __init__(self, space: SearchSpace, margin: float | None) -> None:
        self.space = space
        self.margin = margin
        self.value: float | None = None
        self.metrics: dict[str, Any] = {}
        self.row: int | None = None

    def target(self) -> PruneTarget | None:
        if self.margin is None or self.value is None:
            return None
        obj = self.space.objective
        return prune_target(
            obj.metric,
            obj.direction,
            best_value=self.value,
            best_metrics=self.metrics,
            margin=self.margin,
            best_trial=self.row,
        )

    def update(self, i: int, value: float, a: Any) -> None:
        if a.stop_reason == "dominated":
            return
        sign = 1 if self.space.objective.direction == "maximize" else -1
        if self.value is None or sign * value > sign * self.value:
            self.value, self.row = value, i
            self.metrics = {
                "step_time_ci_s": a.step_time_ci_s,
                "tflops_per_gpu_ci": a.tflops_per_gpu_ci,
            }


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--space", help="the space file (required unless --from-json)")
    ap.add_argument("--configs", type=int, default=20)
    ap.add_argument("--fixed-steps", type=int, default=50)
    ap.add_argument("--min-steps", type=int, default=None, help="default 10 (or the file's)")
    ap.add_argument("--max-steps", type=int, default=None, help="default 50 (or the file's)")
    ap.add_argument("--rel-halfwidth", type=float, default=None, help="default 0.01")
    ap.add_argument("--confidence", type=float, default=None, help="default 0.95")
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
    ap.add_argument(
        "--start", type=int, default=0,
        help="skip the first START of the --configs configurations (the same seeded pick): "
        "one run split over several machines or calls, merged by --from-json A --from-json B",
    )  # fmt: skip
    ap.add_argument(
        "--from-json", action="append", default=None, metavar="FILE",
        help="measure nothing: re-apply the adaptive rule to the per-step series saved in "
        "FILE (a --json of this bench); repeated, the rows of each file in turn (runs of the "
        "same space and settings, e.g. split with --start)",
    )  # fmt: skip
    ap.add_argument(
        "--trim", type=float, default=None,
        help=f"the trimmed fraction of the replayed rule's location (default {TRIM}, "
        "dse.stats.measure.TRIM); only where the rule is replayed "
        "(--from-json, --adaptive series)",
    )  # fmt: skip
    ap.add_argument(
        "--prune", action="store_true",
        help="adaptive runs also stop as 'dominated' (a study's measurement.prune): in the "
        "order of the rows, each run is pruned against the best adaptive result so far",
    )  # fmt: skip
    ap.add_argument(
        "--prune-margin", type=float, default=None,
        help="measurement.prune_margin of --prune (default: the space file's default, 0.05)",
    )  # fmt: skip
    ap.add_argument("--json", default=None, help="write every row and the summary here")
    args = ap.parse_args(argv)
    if args.trim is not None and not args.from_json and args.adaptive != "series":
        ap.error(
            "--trim applies only where the rule is replayed: --from-json or --adaptive series"
        )
    if not args.from_json and not args.space:
        ap.error("--space is required (or --from-json FILE)")
    if args.prune_margin is not None and not args.prune:
        ap.error("--prune-margin applies only with --prune")
    if args.prune and args.prune_margin is None:
        args.prune_margin = MeasurementSpec().prune_margin
    return args


def _precision(args: argparse.Namespace, saved: dict[str, Any]) -> None:
    """The adaptive rule's settings: the command line's, else the saved run's, else the
    defaults."""
    for key, default in (("min_steps", 10), ("max_steps", 50), ("rel_halfwidth", 0.01),
                         ("confidence", 0.95)):  # fmt: skip
        if getattr(args, key) is None:
            setattr(args, key, saved.get(key, default))


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.from_json:
        return _offline(args)
    _precision(args, {})
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
        + (f"; cost-model estimate of the step loops: {est:.0f} s" if est else "")
        + _pruning_note(args),
        flush=True,
    )
    tr = Trainer(space.resources.device)
    tokens = space.semantics.global_batch_size * space.semantics.seq_length
    rows: list[dict[str, Any]] = []
    best = _Best(space, args.prune_margin)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # prime the process (CUDA context, kernels' first use): not measured
        plan, built, _ = tr.build(_spec(space, configs[0], fixed, tmp), feats)
        tr.train(plan, built, _spec(space, configs[0], MeasurementSpec(
            mode="adaptive", min_steps=5, max_steps=5), tmp))  # fmt: skip
        tr.release(built)
        for i, p in enumerate(configs):
            if i < args.start:
                continue
            if args.time_budget_s and time.monotonic() - t_start > args.time_budget_s:
                print(f"time budget of {args.time_budget_s:.0f} s spent after {i} configurations")
                break
            row: dict[str, Any] = {"params": p}
            try:
                row.update(_measure(tr, space, p, fixed, adaptive, args, i, feats, tmp, warmup,
                                    best.target()))  # fmt: skip
            except Exception as e:  # noqa: BLE001 - an OOM or a refusal is a row, not the end
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                tr.release(None)
            if "error" not in row:
                row["fixed_value"] = _objective(space, row.pop("_fixed"), tokens)
                a = row.pop("_adaptive")
                row["adaptive_value"] = _objective(space, a, tokens)
                best.update(i, row["adaptive_value"], a)
                if "_control" in row:
                    row["control_value"] = _objective(space, row.pop("_control"), tokens)
            rows.append(row)
            _print_row(i, row)
    return _finish(args, space, rows)


def _finish(args: argparse.Namespace, space: SearchSpace, rows: list[dict[str, Any]]) -> int:
    summary = _summary(space, rows)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows,
                                               "summary": summary}, indent=1))  # fmt: skip
    return 0


#: What a saved run was measured on: taken from the file by a replay, and the same in every
#: file of one replay.
_RUN_KEYS = ("space", "set", "fixed_steps", "adaptive", "rebuild")


def _offline(args: argparse.Namespace) -> int:
    """``--from-json``: the adaptive rule of this checkout on a saved run's series."""
    saved_args: dict[str, Any] = {}
    saved_rows: list[dict[str, Any]] = []
    for name in args.from_json:
        path = Path(name)
        try:
            saved = json.loads(path.read_text())
            f_args, f_rows = saved["args"], list(saved["rows"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--from-json {path}: not a JSON file of this bench ({e})") from e
        for key in (*_RUN_KEYS, "seed"):
            if saved_args and f_args.get(key) != saved_args.get(key):
                raise SystemExit(
                    f"--from-json {path}: {key} is {f_args.get(key)!r}, not "
                    f"{saved_args.get(key)!r} as in {args.from_json[0]}: not parts of one run"
                )
        saved_args = saved_args or f_args
        saved_rows += f_rows
    path = Path(" + ".join(args.from_json))
    _precision(args, saved_args)
    for key in _RUN_KEYS:
        if key == "space" and args.space:
            continue
        setattr(args, key, saved_args.get(key, getattr(args, key)))
    space = _space(args)
    warmup = space.semantics.warmup_steps
    trim = TRIM if args.trim is None else args.trim
    adaptive = MeasurementSpec(
        mode="adaptive", min_steps=args.min_steps, max_steps=args.max_steps,
        rel_halfwidth=args.rel_halfwidth, confidence=args.confidence,
    )  # fmt: skip
    fixed = MeasurementSpec(mode="fixed", confidence=args.confidence)
    tokens = space.semantics.global_batch_size * space.semantics.seq_length
    print(
        f"{path}: {len(saved_rows)} rows of {args.space}; the rule of this checkout replayed: "
        f"{args.min_steps}-{args.max_steps} steps, +-{args.rel_halfwidth:.1%} at "
        f"{args.confidence:.0%}, trim {trim:g}" + _pruning_note(args),
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    best = _Best(space, args.prune_margin)
    for i, old in enumerate(saved_rows):
        if "error" in old:
            rows.append(old)
            _print_row(i, old)
            continue
        series = old.get("series")
        if not isinstance(series, dict) or "fixed" not in series:
            raise SystemExit(
                f"--from-json {path}: row {i} ({old.get('params')}) has no per-step series "
                "(written before the bench saved them): run the bench again with --json"
            )
        row = {k: old[k] for k in ("params", "build_s", "fixed_s", "first") if k in old}
        row["series"] = series
        f_run = series["fixed"]
        f = _fixed_from_series(fixed, f_run, args.fixed_steps, warmup)
        # the steps the rule may use, each with its seconds of loop wall time per step second
        parts = [(series["adaptive"], old["adaptive_s"])] if "adaptive" in series else []
        if not parts or (not args.rebuild and old.get("first") == "adaptive"):
            parts.append((f_run, old["fixed_s"]))  # the same model, continued
        times = [t for run, _ in parts for t in run["step_time_s"]]
        tflops = [x for run, _ in parts for x in run["tflops_per_gpu"]]
        scale = [wall / sum(run["step_time_s"]) for run, wall in parts
                 for _ in run["step_time_s"]]  # fmt: skip
        n, a = _replay(adaptive, times, tflops, args.fixed_steps, warmup, trim, best.target())
        row.update(
            adaptive_s=sum(t * k for t, k in zip(times[:n], scale[:n], strict=True)),
            **_adaptive_fields(n, a, f),
            fixed_value=_objective(space, f, tokens),
            adaptive_value=_objective(space, a, tokens),
        )
        best.update(i, row["adaptive_value"], a)
        if n == len(times) and a.stop_reason == "max_steps" and n < args.max_steps:
            row["replay_exhausted"] = True
        if "control" in series:
            c = _fixed_from_series(fixed, series["control"], args.fixed_steps, warmup)
            row["control_value"] = _objective(space, c, tokens)
        rows.append(row)
        _print_row(i, row)
    return _finish(args, space, rows)


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
    prune: PruneTarget | None = None,
) -> dict[str, Any]:
    fspec, aspec = _spec(space, p, fixed, tmp), _spec(space, p, adaptive, tmp, prune)
    plan, built, build_s = tr.build(fspec, feats)
    out: dict[str, Any] = {"build_s": build_s}
    saved: dict[str, dict[str, list[float]]] = {}
    if args.adaptive == "series":
        steps, series, wall = tr.train(plan, built, fspec)
        tr.release(built)
        f = _fixed_result(steps, series, warmup)
        times = [x.step_time_s for x in steps]
        trim = TRIM if args.trim is None else args.trim
        n, a = _replay(adaptive, times, [x.tflops_per_gpu for x in steps], args.fixed_steps,
                       warmup, trim, prune)  # fmt: skip
        out.update(fixed_s=wall, adaptive_s=sum(times[:n]) * wall / sum(times))
        saved["fixed"] = _saved(steps)
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
        saved["fixed"], saved["adaptive"] = _saved(steps), _saved(a_steps)
    if args.control:
        plan, built, _ = tr.build(fspec, feats)
        c_steps, c_series, _ = tr.train(plan, built, fspec)
        tr.release(built)
        out["_control"] = _fixed_result(c_steps, c_series, warmup)
        saved["control"] = _saved(c_steps)
    out.update(**_adaptive_fields(n, a, f), series=saved, _fixed=f, _adaptive=a)
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
        f"{r['fixed_s']:>7.2f}s {r['adaptive_s']:>6.2f}s x{ratio:<5.2f} "
        f"spikes {r.get('adaptive_spikes', '-')}"
        f"{' (replay ran out of saved steps)' if r.get('replay_exhausted') else ''} | {knobs}",
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
    # the steady jitter of each fixed window (after its warm-up): 1.4826 MAD / median
    w = space.semantics.warmup_steps
    jitter = [
        1.4826 * statistics.median(abs(t - m) for t in x) / m
        for x in (r["series"]["fixed"]["step_time_s"][w:] for r in ok if "series" in r)
        if x and (m := statistics.median(x)) > 0
    ]
    at_max = [
        (r["adaptive_ci_s"][1] - r["adaptive_ci_s"][0]) / 2 / r["adaptive_step_s"]
        for r in ok
        if r["adaptive_stop"] == "max_steps" and r.get("adaptive_ci_s")
    ]
    best_f = max(range(len(ok)), key=lambda i: sign * fx[i])
    # a pruned run is never the best (as in a study)
    kept = [i for i in range(len(ok)) if ok[i]["adaptive_stop"] != "dominated"]
    best_a = max(kept or range(len(ok)), key=lambda i: sign * ad[i])
    pruning: dict[str, Any] = {}
    if len(kept) < len(ok):
        pruning = {
            "pruned": len(ok) - len(kept),
            "fixed_best_pruned": ok[best_f]["adaptive_stop"] == "dominated",
        }
        if len(kept) >= 2:
            tau_kept = kendalltau([fx[i] for i in kept], [ad[i] for i in kept])
            pruning["kendall_tau_not_pruned"] = float(tau_kept.statistic)
            pruning["median_gpu_seconds_ratio_not_pruned"] = statistics.median(
                ratios[i] for i in kept
            )
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
            k: sum(r["adaptive_stop"] == k for r in ok)
            for k in ("converged", "max_steps", "dominated")
        },  # fmt: skip
        "median_rel_halfwidth_at_max_steps": statistics.median(at_max) if at_max else None,
        "adaptive_spikes": sum(r.get("adaptive_spikes", 0) for r in ok),
        "median_fixed_window_jitter": statistics.median(jitter) if jitter else None,
        "replays_out_of_steps": sum(bool(r.get("replay_exhausted")) for r in ok),
        "kendall_tau": float(tau.statistic),
        "kendall_p": float(tau.pvalue),
        "same_best": best_f == best_a,
        "median_abs_rel_diff": statistics.median(rel),
        "max_abs_rel_diff": max(rel),
        **pruning,
        **control,
    }


if __name__ == "__main__":
    sys.exit(main())
