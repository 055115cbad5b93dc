"""What a study's plots and decision figures show, computed in one place for the report
(:mod:`dse.report`) and the dashboard: best configuration and its exports, history, TFLOP/s vs
memory with the Pareto front, knob importance and slices, failures by class, GPU-hours spent
and saved against the full grid, and a projection of a full training run.

Measured figures come from the stored trials; everything derived from them by a formula
(full-grid GPU-hours, training-run days and cost) is labelled an estimate in ``label``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["pareto_front", "study_plot_data", "knob_importance", "slice_label"]


def pareto_front(xy: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points when maximising x and minimising y.

    A point is dominated when another has x >= and y <= with one of them strict; equal
    points do not dominate each other (both stay). O(n log n). Returns indices by
    increasing x.
    """
    order = sorted(range(len(xy)), key=lambda i: (-xy[i][0], xy[i][1]))
    front: list[int] = []
    best_y = math.inf
    best_x = math.inf
    for i in order:
        x, y = xy[i]
        if y < best_y:
            front.append(i)
            best_y, best_x = y, x
        elif y == best_y and x == best_x:
            front.append(i)
    front.sort(key=lambda i: (xy[i][0], -xy[i][1]))
    return front


def slice_label(v: Any) -> str:
    """A knob value as a slice plot's category (as JavaScript's ``String`` writes it)."""
    return v if isinstance(v, str) else json.dumps(v)


def knob_importance(storage: Any, study: Any) -> tuple[dict[str, float] | None, str]:
    """Optuna's PED-ANOVA importance of each knob on the study's complete trials, and how it
    was computed (or why it could not be)."""
    import warnings

    import optuna

    from dse.optuna_export import frozen_trials

    _, trials = frozen_trials(storage, study)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < 3:
        return None, f"needs 3 complete trials ({len(done)} so far)"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ost = optuna.create_study(direction=study.direction)
    ost.add_trials(trials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            imp = optuna.importance.get_param_importances(
                ost, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
            )
        except (ValueError, RuntimeError) as e:
            return None, f"Optuna could not compute it: {e}"
    return {k: float(v) for k, v in imp.items()}, (
        f"Optuna PED-ANOVA on {len(done)} complete trials (top 10% quantile vs all)"
    )


def study_plot_data(
    storage: Any,
    study: Any,
    *,
    cost_per_gpu_hour: float | None = None,
    tokens: float = 1e12,
) -> dict[str, Any]:
    """Everything the report and the dashboard draw for one study, as plain data."""
    from dse.export import _stored_space, best_payload, render_best

    space = _stored_space(study.space_yaml, study.name)
    trials = storage.list_trials(study.id)
    counts = storage.count_trials(study.id)
    rejections = storage.count_rejections(study.id)
    maximize = study.direction == "maximize"

    best = None
    exports: dict[str, str | None] = {}
    if any(t.state == "complete" and t.value is not None for t in trials):
        best = best_payload(storage, study)
        for fmt in ("megatron", "bridge", "nemo"):
            try:
                exports[fmt] = render_best(best, fmt, space.model.num_layers)
            except (ValueError, KeyError) as e:
                exports[fmt] = None
                exports[f"{fmt}_why"] = str(e)

    history = []
    run_best: float | None = None
    for t in trials:
        if t.state == "complete" and t.value is not None:
            if run_best is None or (t.value > run_best if maximize else t.value < run_best):
                run_best = t.value
        history.append({"number": t.number, "state": t.state, "value": t.value,
                        "best_so_far": run_best})  # fmt: skip

    pts = [
        {"number": t.number, "tflops_per_gpu": t.metrics.get("tflops_per_gpu"),
         "peak_mem_gib": t.metrics.get("peak_mem_gib")}
        for t in trials
        if t.state == "complete" and t.metrics.get("tflops_per_gpu") is not None
        and t.metrics.get("peak_mem_gib") is not None
    ]  # fmt: skip
    front = [pts[i]["number"] for i in pareto_front(
        [(p["tflops_per_gpu"], p["peak_mem_gib"]) for p in pts])]  # fmt: skip

    slices: dict[str, list[dict[str, Any]]] = {k: [] for k in space.knobs}
    for t in trials:
        if t.state == "complete" and t.value is not None:
            for k in space.knobs:
                slices[k].append({"number": t.number, "x": t.params.get(k), "value": t.value})

    failures: dict[str, list[dict[str, Any]]] = {}
    for t in trials:
        if t.state in ("failed", "infeasible", "pruned"):
            failures.setdefault(t.failure_class or t.state, []).append(
                {"number": t.number, "reason": t.reason, "params": t.params}
            )
    rejected = [
        {"kind": r.kind, "rule": r.rule, "reason": r.reason, "params": r.params}
        for r in storage.list_rejections(study.id)
    ]

    # GPU-hours: spent (recorded by the runner), held and busy, and the full grid (estimate:
    # the mean GPU time of a trial that ran, times the valid configurations of the space),
    # computed where status and the API compute them (dse.gpu_usage)
    from dse.gpu_usage import study_gpu_usage_of

    usage = study_gpu_usage_of(storage, study)
    gpu = {
        **usage,
        "spent_gpu_hours": usage["gpu_hours"],
        "full_grid_gpu_hours": usage["grid_gpu_hours"],
        "cost_per_gpu_hour": cost_per_gpu_hour,
        "label": "spent: GPU time recorded by the runner; full grid and saved: estimates "
        "(mean GPU time of a trial that ran x valid configurations of the space)"
        + (
            "; a replay study's GPU time is the replay's own, not the measured runs'"
            if space.workload.name == "replay"
            else ""
        ),
    }
    if cost_per_gpu_hour is not None:
        gpu["spent_cost"] = gpu["spent_gpu_hours"] * cost_per_gpu_hour
        if gpu["saved_gpu_hours"] is not None:
            gpu["saved_cost"] = gpu["saved_gpu_hours"] * cost_per_gpu_hour

    # projection of a full training run from the measured step time
    sem, world = space.semantics, space.resources.world_size
    tokens_per_step = sem.global_batch_size * sem.seq_length
    baseline = space.baseline()
    base_t = next((t for t in trials if t.state == "complete" and t.params == baseline), None)

    def project(step_s: float | None) -> dict[str, Any] | None:
        if not step_s:
            return None
        steps = tokens / tokens_per_step
        days = steps * step_s / 86400
        out: dict[str, Any] = {"step_time_s": step_s, "days": days,
                               "gpu_hours": days * 24 * world}  # fmt: skip
        if cost_per_gpu_hour is not None:
            out["cost"] = out["gpu_hours"] * cost_per_gpu_hour
        return out

    best_step = best["metrics"]["step_time_s"] if best else None
    base_step = base_t.metrics.get("step_time_s") if base_t else None
    proj: dict[str, Any] = {
        "tokens": tokens,
        "tokens_per_step": tokens_per_step,
        "world_size": world,
        "best": project(best_step),
        "baseline": project(base_step),
        "baseline_trial": None if base_t is None else base_t.number,
        "speedup_over_baseline": (base_step / best_step) if base_step and best_step else None,
        "label": f"estimate: {tokens:.3g} tokens / ({sem.global_batch_size} x "
        f"{sem.seq_length} tokens per step) x the measured step time on {world} GPUs; "
        "excludes checkpointing, evaluation and restarts",
    }
    if proj["best"] and proj["baseline"]:
        proj["days_saved"] = proj["baseline"]["days"] - proj["best"]["days"]
        if cost_per_gpu_hour is not None:
            proj["cost_saved"] = proj["baseline"]["cost"] - proj["best"]["cost"]

    importance, how = knob_importance(storage, study)
    return {
        "study": study.name,
        "metric": study.metric,
        "direction": study.direction,
        "recipe": space.recipe,
        "hardware": study.hardware,
        "counts": counts,
        "rejections": rejections,
        "best": best,
        "exports": exports,
        "history": history,
        "pareto": {
            "points": pts,
            "front": front,
            "gpu_memory_gib": study.hardware.get("gpu_memory_gib"),
        },  # fmt: skip
        "slices": slices,
        "slice_values": {
            k: [slice_label(v) for v in spec.values()] for k, spec in space.knobs.items()
        },
        "importance": importance,
        "importance_how": how,
        "failures": failures,
        "rejected": rejected,
        "gpu": gpu,
        "projection": proj,
    }
