"""What a study's plots and decision figures show, computed in one place for the report
(:mod:`dse.report.page`) and the dashboard: best configuration and its exports, history, TFLOP/s vs
memory with the Pareto front, knob importance and slices, failures by class, GPU-hours spent
and saved against the full grid, a projection of a full training run, the loss curves of
trials over the baseline's (:func:`loss_curves`), a timeline of trials per GPU slot
(:func:`timeline`) and the best figures of the studies of one model side by side
(:func:`compare_studies`). The colours of trial states (:data:`STATE_COLORS`) are shared too.

Measured figures come from the stored trials; everything derived from them by a formula
(full-grid GPU-hours, training-run days and cost) is labelled an estimate in ``label``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dse.core.exceptions import (
    NoCompleteTrialError,
    SpaceError,
    StudyNotFoundError,
    TrialNotFoundError,
)
from dse.core.records import StudyRecord, TrialRun, finite, sample_numbers
from dse.interop.optuna_export import distributions, inside_params
from dse.results.best_formats import _stored_space, best_payload, best_space, render_best
from dse.results.gpu_usage import study_gpu_usage_of
from dse.results.noise import exclude_changed
from dse.results.trust import trust_summary
from dse.space.searchspace import params_key
from dse.workloads.launchers.flags import export_text

if TYPE_CHECKING:  # SQLAlchemy: loaded where a command opens its database
    from dse.storage import Storage

__all__ = [
    "pareto_front",
    "study_plot_data",
    "study_insights",
    "INSIGHTS_SAMPLE",
    "knob_importance",
    "slice_label",
    "STATE_COLORS",
    "find_baseline",
    "loss_curves",
    "parse_placement",
    "timeline",
    "study_timeline",
    "model_differences",
    "comparable_studies",
    "compare_studies",
    "COMPARE_FIGURES",
    "running_best",
    "figure_source",
]

#: The colour of each trial state (and of an interrupted attempt, and of idle time) on every
#: plot that colours by state: the dashboard's timeline and the report's.
STATE_COLORS: dict[str, str] = {
    "complete": "#15803d",
    "failed": "#b91c1c",
    "infeasible": "#c2410c",
    "pruned": "#7c3aed",
    "running": "#2563eb",
    "queued": "#6b7280",
    "interrupted": "#9ca3af",
    "idle": "#e5e7eb",
}
#: The baseline's curve (drawn dashed, in this colour, under the others).
BASELINE_COLOR = "#111827"


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


#: What a study's figures are, by its workload: the cost model's estimate (``sim``), a
#: replayed measurement (``replay``), else measured by its trials.
_SOURCE_OF_WORKLOAD = {"sim": "estimate", "replay": "replay"}
SOURCE_TEXT = {
    "measured": "measured",
    "replay": "replayed from a measured table",
    "estimate": "estimate (cost model, not measured)",
}


def figure_source(workload: str | None, trial_sources: Iterable[str | None] = ()) -> str:
    """``measured``, ``replay`` or ``estimate``: what the figures of a study of ``workload``
    are (:data:`SOURCE_TEXT` says it in words); also when its trials all say the same
    (``trial_sources``: a study stored before its workload choice was)."""
    seen = {s for s in trial_sources if s}
    if len(seen) == 1 and next(iter(seen)) in SOURCE_TEXT:
        return next(iter(seen))
    return _SOURCE_OF_WORKLOAD.get(workload or "", "measured")


def _status(t: Any) -> str | None:
    n = getattr(t, "numerics", None)  # a TrialPoint's status, or a trial's verdict
    if isinstance(n, str):
        return n
    m = getattr(t, "metrics", None) or {}
    v = m.get("numerics") if isinstance(m, Mapping) else None
    return v.get("status") if isinstance(v, Mapping) else None


def running_best(
    space: Any, trials: Iterable[Any], direction: str, final: float | None = None
) -> list[dict[str, Any]]:
    """The noise-aware best so far, one ``{"number", "value"}`` per trial by number: after
    each trial, the best pooled objective (the mean over its trials, :mod:`dse.results.noise`) of
    the configurations measured so far, identical-in-effect configurations as one and
    numerics-changed trials left out where the space leaves them out of the best. A lucky
    single run lifts it only until its configuration's re-measure comes in. ``final``: the
    study's noise-aware best objective, which the last value is (None: as computed)."""

    maximize = direction == "maximize"
    skip_changed = exclude_changed(space)
    acc: dict[str, tuple[float, int]] = {}
    best_key: str | None = None
    best: float | None = None
    out: list[dict[str, Any]] = []

    def better(a: float, b: float | None) -> bool:
        return b is None or (a > b if maximize else a < b)

    for t in sorted(trials, key=lambda t: t.number):
        v = finite(t.value)
        if (
            t.state == "complete"
            and v is not None
            and not (skip_changed and _status(t) == "changed")
        ):
            key = params_key(space.canonical(t.params))
            total, n = acc.get(key, (0.0, 0))
            acc[key] = (total + v, n + 1)
            mean = (total + v) / (n + 1)
            if better(mean, best):
                best, best_key = mean, key
            elif key == best_key:  # the best configuration's mean fell: the best of all
                means = {k: a / m for k, (a, m) in acc.items()}
                best_key = (max if maximize else min)(means, key=means.__getitem__)
                best = means[best_key]
        out.append({"number": t.number, "value": best})
    if final is not None and out and out[-1]["value"] is not None:
        out[-1]["value"] = final
    return out


def slice_label(v: Any) -> str:
    """A knob value as a slice plot's category (as JavaScript's ``String`` writes it)."""
    return v if isinstance(v, str) else json.dumps(v)


#: The most complete trials that knob importance and the slices are computed from: a
#: uniform sample (:meth:`dse.storage.Storage.sample_complete`) above it, so that the
#: insights of a 50,000-trial study cost what those of a 2,000-trial one do (PED-ANOVA
#: compares the top 10% of the trials with all of them: a uniform sample estimates both).
INSIGHTS_SAMPLE = 1000


def insight_sample(
    storage: Storage, study: StudyRecord, limit: int | None = None
) -> tuple[int, list[tuple[int, dict[str, Any], float]]]:
    """How many complete trials with a value the study has, and at most ``limit`` of them
    (``INSIGHTS_SAMPLE`` when None) as ``(number, params, value)`` (all, or a uniform
    sample)."""
    total, rows = storage.sample_complete(study.id, limit or INSIGHTS_SAMPLE)
    return total, rows


def _sample_of_records(
    records: Sequence[Any], limit: int | None = None
) -> tuple[int, list[tuple[int, dict[str, Any], float]]]:
    """:func:`insight_sample` of trial records already listed (the same trials)."""

    done = {t.number: t for t in records if t.state == "complete" and t.value is not None}
    chosen = sample_numbers(done, limit or INSIGHTS_SAMPLE)
    return len(done), [(n, dict(done[n].params), float(done[n].value)) for n in chosen]


def knob_importance(
    storage: Storage,
    study: StudyRecord,
    sample: tuple[int, list[tuple[int, dict[str, Any], float]]] | None = None,
) -> tuple[dict[str, float] | None, str]:
    """Optuna's PED-ANOVA importance of each knob on the study's complete trials (a uniform
    sample of at most ``INSIGHTS_SAMPLE`` of them), and how it was computed (or why it could
    not be). ``sample``: :func:`insight_sample`'s answer where the caller has it already."""
    import warnings

    import optuna

    total, rows = insight_sample(storage, study) if sample is None else sample
    if len(rows) < 3:
        return None, f"needs 3 complete trials ({len(rows)} so far)"
    dists = distributions(_stored_space(study.space_yaml, study.name))
    done = []
    for _, params, value in rows:
        kept, used = inside_params(params, dists)
        done.append(optuna.trial.create_trial(params=kept, distributions=used, value=value))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ost = optuna.create_study(direction=study.direction)
    ost.add_trials(done)  # PED-ANOVA reads the complete trials only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            imp = optuna.importance.get_param_importances(
                ost, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
            )
        except (ValueError, RuntimeError) as e:
            return None, f"Optuna could not compute it: {e}"
    on = (
        f"{total} complete trials"
        if len(rows) == total
        else f"a uniform sample of {len(rows)} of the {total} complete trials"
    )
    return {k: float(v) for k, v in imp.items()}, (
        f"Optuna PED-ANOVA on {on} (top 10% quantile vs all)"
    )


def slices_of(
    space: Any, rows: Sequence[tuple[int, dict[str, Any], float]]
) -> dict[str, list[dict[str, Any]]]:
    """The objective per knob value: for each knob, a point per trial of ``rows``
    (:func:`insight_sample`'s)."""
    slices: dict[str, list[dict[str, Any]]] = {k: [] for k in space.knobs}
    for number, params, value in rows:
        for k, pts in slices.items():
            pts.append({"number": number, "x": params.get(k), "value": value})
    return slices


def gpu_view(
    storage: Storage, study: StudyRecord, space: Any, cost_per_gpu_hour: float | None
) -> dict[str, Any]:
    """GPU-hours: spent (recorded by the runner), held and busy, and the full grid
    (estimate: the mean GPU time of a trial that ran, times the valid configurations of the
    space), computed where status and the API compute them (dse.results.gpu_usage); with
    their cost at ``cost_per_gpu_hour``."""

    usage = study_gpu_usage_of(storage, study)  # the storage's totals, as the API's
    gpu = {
        **usage,
        "spent_gpu_hours": usage["gpu_hours"],
        "full_grid_gpu_hours": usage["grid_gpu_hours"],
        "cost_per_gpu_hour": cost_per_gpu_hour,
        "label": usage["label"]
        if usage.get("estimate_trials")
        else "spent: GPU time recorded by the runner; full grid and saved: estimates "
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
    return gpu


def projection(
    space: Any,
    source: str,
    best: dict[str, Any] | None,
    base_t: Any,
    tokens: float,
    cost_per_gpu_hour: float | None,
) -> dict[str, Any]:
    """A full training run of ``tokens`` projected from the best's step time and the
    baseline trial's (``base_t``, None or unfinished: none), labelled an estimate."""
    if base_t is not None and base_t.state != "complete":
        base_t = None
    sem, world = space.semantics, space.resources.world_size
    tokens_per_step = sem.global_batch_size * sem.seq_length

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
        f"{sem.seq_length} tokens per step) x the "
        + {
            "measured": "measured step time",
            "replay": "replayed measured step time",
            "estimate": "cost model's estimated step time (sim: nothing measured)",
        }[source]
        + f" on {world} GPUs; excludes checkpointing, evaluation and restarts",
    }
    if proj["best"] and proj["baseline"]:
        proj["days_saved"] = proj["baseline"]["days"] - proj["best"]["days"]
        if cost_per_gpu_hour is not None:
            proj["cost_saved"] = proj["baseline"]["cost"] - proj["best"]["cost"]

    return proj


def study_insights(
    storage: Storage,
    study: StudyRecord,
    *,
    cost_per_gpu_hour: float | None = None,
    tokens: float = 1e12,
) -> dict[str, Any]:
    """The decision views of ``GET /studies/{name}/insights``: knob importance and slices
    (from :func:`insight_sample`: at most ``INSIGHTS_SAMPLE`` complete trials), GPU-hours
    (the storage's aggregates) and the projection from the best and the baseline: a cost
    bounded by the sample, not by the study's size (the parts :func:`study_plot_data` also
    returns, the same functions)."""

    space = _stored_space(study.space_yaml, study.name)
    sample = insight_sample(storage, study)
    best = None
    if sample[0]:
        try:
            best = best_payload(storage, study)
        except NoCompleteTrialError:  # e.g. every complete trial's numerics changed
            best = None
    source = figure_source(space.workload.name, storage.trial_sources(study.id))
    importance, how = knob_importance(storage, study, sample)
    base_t = find_baseline(storage, study, space)
    return {
        "study": study.name,
        "metric": study.metric,
        "direction": study.direction,
        "importance": importance,
        "importance_how": how,
        "slices": slices_of(space, sample[1]),
        "slice_values": {
            k: [slice_label(v) for v in spec.values()] for k, spec in space.knobs.items()
        },
        "gpu": gpu_view(storage, study, space, cost_per_gpu_hour),
        "projection": projection(space, source, best, base_t, tokens, cost_per_gpu_hour),
    }


def study_plot_data(
    storage: Storage,
    study: StudyRecord,
    *,
    cost_per_gpu_hour: float | None = None,
    tokens: float = 1e12,
) -> dict[str, Any]:
    """Everything the report and the dashboard draw for one study, as plain data."""

    space = _stored_space(study.space_yaml, study.name)
    trials = storage.list_trials(study.id)
    counts = storage.count_trials(study.id)
    rejections = storage.count_rejections(study.id)
    maximize = study.direction == "maximize"

    best = None
    exports: dict[str, str | None] = {}
    if any(t.state == "complete" and t.value is not None for t in trials):
        best = best_payload(storage, study)
        ran = best_space(storage, study)
        for fmt in ("megatron", "bridge", "nemo"):
            try:
                exports[fmt] = render_best(best, fmt, ran, export_text)
            except (ValueError, KeyError) as e:
                exports[fmt] = None
                exports[f"{fmt}_why"] = str(e)

    final = None if best is None else best["objective"]["value"]
    run = running_best(space, trials, study.direction, final)
    history = [
        {"number": t.number, "state": t.state, "value": t.value,
         "best_so_far": r["value"], "remeasure_of": t.remeasure_of}
        for t, r in zip(sorted(trials, key=lambda t: t.number), run, strict=True)
    ]  # fmt: skip
    source = figure_source(space.workload.name, (t.source for t in trials))

    pts: list[dict[str, Any]] = [
        {"number": t.number, "tflops_per_gpu": t.metrics.get("tflops_per_gpu"),
         "peak_mem_gib": t.metrics.get("peak_mem_gib")}
        for t in trials
        if t.state == "complete" and t.metrics.get("tflops_per_gpu") is not None
        and t.metrics.get("peak_mem_gib") is not None
    ]  # fmt: skip
    front = [pts[i]["number"] for i in pareto_front(
        [(p["tflops_per_gpu"], p["peak_mem_gib"]) for p in pts])]  # fmt: skip

    sample = _sample_of_records(trials)
    slices = slices_of(space, sample[1])

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

    gpu = gpu_view(storage, study, space, cost_per_gpu_hour)
    base_t = find_baseline(storage, study, space)
    proj = projection(space, source, best, base_t, tokens, cost_per_gpu_hour)
    importance, how = knob_importance(storage, study, sample)
    best_n = None if best is None else best["trial"]
    complete = [(t.value, t) for t in trials if t.state == "complete" and t.value is not None]
    ranked = [t for _, t in sorted(complete, key=lambda vt: -vt[0] if maximize else vt[0])]
    shown = [n for n in [best_n, *(t.number for t in ranked)] if n is not None]
    shown = list(dict.fromkeys(shown))[:LOSS_REPORT_TRIALS]
    others = comparable_studies(storage, study)
    return {
        "study": study.name,
        "metric": study.metric,
        "direction": study.direction,
        "recipe": space.recipe,
        "workload": space.workload.name,
        "source": source,
        "source_text": SOURCE_TEXT[source],
        "hardware": study.hardware,
        "counts": counts,
        "rejections": rejections,
        "best": best,
        "trust": trust_summary(
            [
                {"number": t.number, "state": t.state, "params": t.params, "metrics": t.metrics}
                for t in trials
            ],
            study.metric,
            study.direction,
        ),
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
        "timeline": timeline(trials),
        "losses": loss_curves(storage, study, shown, space=space),
        "compare": (
            compare_studies(storage, [study.name, *(o["study"] for o in others)])
            if others
            else None
        ),
    }


# --- the baseline and loss curves ---------------------------------------------------------

#: Trials whose losses the report draws over the baseline's: the best and the next ones.
LOSS_REPORT_TRIALS = 4
#: Most trials one loss plot draws besides the baseline (the dashboard's selection).
LOSS_MAX_TRIALS = 20


def _numerics(t: Any) -> dict[str, Any]:
    n = t.metrics.get("numerics") if t is not None else None
    return n if isinstance(n, dict) else {}


def find_baseline(
    storage: Storage, study: StudyRecord, space: Any = None, hints: Iterable[Any] = ()
) -> Any | None:
    """The trial of the study's baseline configuration (the recipe's own values,
    :meth:`dse.space.searchspace.SearchSpace.baseline`), or None while it has not run.

    The numerics check names the trial it compared against (``metrics.numerics.baseline_trial``
    of the ``hints``, trial records); without one, the first finished trial (complete or
    infeasible) of the baseline configuration.
    """

    for t in hints:
        n = _numerics(t).get("baseline_trial")
        if isinstance(n, int) and not isinstance(n, bool):
            try:
                return storage.get_trial_by_number(study.id, n, with_steps=False)
            except TrialNotFoundError:
                pass
    if space is None:
        space = _stored_space(study.space_yaml, study.name)
    return storage.find_trial(study.id, params_key(space.baseline()))


def _curve(t: Any, *, baseline: bool) -> dict[str, Any]:
    steps = [s for s in t.steps if s.step is not None]
    return {
        "number": t.number,
        "state": t.state,
        "baseline": baseline,
        "params": t.params,
        "value": finite(t.value),
        "numerics": _numerics(t).get("status"),
        "drift": finite(_numerics(t).get("drift")),
        "source": t.source,
        "steps": [s.step for s in steps],
        "loss": [finite(s.loss) for s in steps],
    }


def loss_curves(
    storage: Storage, study: StudyRecord, numbers: Sequence[int] = (), *, space: Any = None
) -> dict[str, Any]:
    """The per-step losses of the trials ``numbers`` (at most :data:`LOSS_MAX_TRIALS`) and of
    the baseline trial, the baseline's curve first and flagged.

    Raises:
        ValueError: too many numbers, or a number with no trial in the study (the message
            starts with ``trials``).
    """

    wanted = list(dict.fromkeys(numbers))
    if len(wanted) > LOSS_MAX_TRIALS:
        raise ValueError(f"trials: at most {LOSS_MAX_TRIALS} trials per plot, got {len(wanted)}")
    picked = []
    for n in wanted:
        try:
            picked.append(storage.get_trial_by_number(study.id, n, with_steps=True))
        except TrialNotFoundError:
            raise ValueError(f"trials: study {study.name!r} has no trial {n}") from None
    if space is None:
        space = _stored_space(study.space_yaml, study.name)
    base = find_baseline(storage, study, space, picked)
    how = (
        "the trial the numerics check compared against"
        if any(_numerics(t).get("baseline_trial") is not None for t in picked)
        else "the first finished trial of the baseline configuration (the recipe's own values)"
    )
    curves = []
    if base is not None:
        base = storage.get_trial_by_number(study.id, base.number, with_steps=True)
        curves.append(_curve(base, baseline=True))
    curves += [
        _curve(t, baseline=False) for t in picked if base is None or t.number != base.number
    ]
    return {
        "study": study.name,
        "baseline": None if base is None else base.number,
        "baseline_params": space.baseline(),
        "baseline_how": how if base is not None else "the baseline configuration has not run",
        "curves": curves,
        "colors": {"baseline": BASELINE_COLOR},
    }


# --- timeline of trials per GPU slot -------------------------------------------------------

#: A cluster runner's placement item: ``node:gpu0`` (further GPUs of the node follow as
#: bare indices: ``node:gpu0,1``) or a node without GPUs.
_PLACED = re.compile(r"^(?P<node>[^:,\s]+):gpu(?P<gpu>\d+)$")


def parse_placement(host: str | None) -> list[tuple[str, str]] | None:
    """``(node, gpu index)`` of each GPU in a cluster runner's placement
    (``node1:gpu0,1,node2:gpu0,1``, :func:`dse.runners._cluster.read_placement`);
    None when ``host`` is not one (a plain host name: the local runner)."""
    if not host or ":gpu" not in host:
        return None
    out: list[tuple[str, str]] = []
    node: str | None = None
    for tok in host.split(","):
        m = _PLACED.match(tok)
        if m:
            node = m["node"]
            out.append((node, m["gpu"]))
        elif tok.isdigit() and node is not None:
            out.append((node, tok))
        elif tok and ":" not in tok:
            node = None
            out.append((tok, ""))
        else:
            return None
    return out or None


def _slots(t: Any) -> tuple[list[tuple[str, str]] | None, str]:
    """The GPU slots a run held (``(host, gpu index)`` each) and where that came from."""
    if t.gpu_slots:
        out = []
        for x in t.gpu_slots:
            host, sep, gpu = x.rpartition(":")
            out.append((host, gpu) if sep and host else (x, ""))
        return out, "gpu_slots"
    placed = parse_placement(t.host)
    return (placed, "placement") if placed else (None, "overlap")


def _natural(s: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


def _union_s(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


_SLOTS_FROM = {
    "gpu_slots": "the GPU slots the runner recorded for each trial",
    "placement": "the node names and GPU indices the cluster runner recorded",
    "overlap": "overlapping run times (the runner recorded no GPU indices: one lane per "
    "trial running at once on a host, inferred)",
}

#: Most trials a study's timeline carries by default (the latest starts); the answer says how
#: many ran in all.
TIMELINE_TRIALS = 1000


def timeline(
    trials: Iterable[Any],
    *,
    redact_hosts: bool = False,
    now: float | None = None,
    trials_ran: int | None = None,
) -> dict[str, Any]:
    """What ran where and when: one lane per GPU slot, one bar per trial (and per interrupted
    attempt of it) in each slot it held, coloured by state; the idle gaps between bars.
    ``trials``: :class:`dse.core.records.TrialRun` (or full trial records).

    Slots come from ``metrics.gpu_slots`` when recorded, else from a cluster runner's
    placement (``host``), else one lane per concurrent trial on a host, assigned greedily
    (as few lanes as the overlaps need). Times are seconds since the first start; a running
    trial ends ``now``. ``redact_hosts``: host names become ``node 1``, ``node 2``, ...
    (for readers who may not see where trials ran). ``trials_ran``: how many trials of the
    study ran in all, when ``trials`` are only the latest of them.
    """

    now = time.time() if now is None else now
    runs = [t if isinstance(t, TrialRun) else TrialRun.of(t) for t in trials]
    raw: list[dict[str, Any]] = []  # bars with absolute times and (host, gpu | None)
    sources: set[str] = set()
    for t in runs:
        for h in t.history:  # interrupted attempts: where they ran until re-queued
            a, b = h.get("started_at"), h.get("at")
            if isinstance(a, int | float) and isinstance(b, int | float) and b >= a:
                raw.append({"trial": t.number, "state": "interrupted", "a": a, "b": b,
                            "host": h.get("host"), "slots": None,
                            "reason": h.get("reason")})  # fmt: skip
                sources.add("overlap")
        if t.started_at is None:
            continue
        end = t.finished_at
        if end is None:
            if t.state != "running":
                continue
            end = max(now, t.started_at)
        slots, src = _slots(t)
        sources.add(src)
        raw.append({"trial": t.number, "state": t.state, "a": t.started_at, "b": end,
                    "host": t.host, "slots": slots, "reason": t.reason,
                    "failure_class": t.failure_class, "value": t.value,
                    "open": t.finished_at is None})  # fmt: skip
    shown = len({r["trial"] for r in raw})
    raw.sort(key=lambda r: (r["a"], r["b"], r["trial"]))

    # lanes: recorded GPU slots, then per-host lanes assigned by overlap (greedy)
    free: dict[str | None, list[float]] = {}
    placed: list[tuple[dict[str, Any], tuple[str, str, str]]] = []
    for r in raw:
        if r["slots"]:
            for host, gpu in r["slots"]:
                placed.append((r, ("gpu", host, gpu)))
            continue
        ends = free.setdefault(r["host"], [])
        free_lane = next((i for i, e in enumerate(ends) if e <= r["a"]), None)
        if free_lane is None:
            ends.append(r["b"])
            free_lane = len(ends) - 1
        else:
            ends[free_lane] = r["b"]
        placed.append((r, ("slot", r["host"] or "", str(free_lane + 1))))

    hosts: dict[str, str] = {}
    keys = sorted({key for _, key in placed}, key=lambda k: (k[0] != "gpu", _natural(k[1]),
                                                              _natural(k[2])))  # fmt: skip
    for _, host, _ in keys:
        if host and host not in hosts:
            hosts[host] = f"node {len(hosts) + 1}"

    def label(key: tuple[str, str, str]) -> str:
        kind, host, idx = key
        shown = hosts.get(host, host) if redact_hosts else host
        if kind == "gpu":
            return f"{shown}:{idx}" if idx else shown
        return f"{shown} · slot {idx}" if shown else f"slot {idx}"

    t0 = min((r["a"] for r in raw), default=now)
    t1 = max((r["b"] for r in raw), default=now)
    span = max(t1 - t0, 0.0)
    unit, scale = ("s", 1.0) if span <= 900 else ("min", 60.0) if span <= 48 * 3600 else (
        "h", 3600.0)  # fmt: skip
    bars = []
    per_lane: dict[str, list[tuple[float, float]]] = {label(k): [] for k in keys}
    for r, key in placed:
        lane = label(key)
        a, b = r["a"] - t0, r["b"] - t0
        per_lane[lane].append((a, b))
        bar = {"trial": r["trial"], "state": r["state"], "lane": lane, "start": a, "end": b,
               "duration_s": b - a, "reason": r.get("reason"),
               "failure_class": r.get("failure_class"), "value": r.get("value"),
               "open": bool(r.get("open"))}  # fmt: skip
        bars.append(bar)
    lanes: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []
    for k in keys:
        name = label(k)
        spans = sorted(per_lane[name])
        busy = _union_s(spans)
        lanes.append({"label": name, "busy_s": busy,
                      "busy_fraction": busy / span if span > 0 else None})  # fmt: skip
        end = -math.inf
        for a, b in spans:
            if end != -math.inf and a > end:
                gaps.append({"lane": name, "start": end, "end": a, "duration_s": a - end})
            end = max(end, b)
    busy_all = sum(x["busy_s"] for x in lanes)
    order = [s for s in ("gpu_slots", "placement", "overlap") if s in sources]
    return {
        "t0": t0,
        "span_s": span,
        "unit": unit,
        "scale": scale,
        "lanes": lanes,
        "bars": bars,
        "gaps": gaps,
        "busy_fraction": busy_all / (span * len(lanes)) if span > 0 and lanes else None,
        "slots_from": order,
        "trials_shown": shown,
        "trials_ran": shown if trials_ran is None else max(trials_ran, shown),
        "runs": len(raw),
        "colors": STATE_COLORS,
        "label": "lanes from " + "; ".join(_SLOTS_FROM[s] for s in order)
        + (". Host names hidden (node N): readers without the token do not see where trials"
           " ran" if redact_hosts and hosts else "")
        if order else "no trial has started yet",
    }  # fmt: skip


def study_timeline(
    storage: Storage,
    study: StudyRecord,
    *,
    redact_hosts: bool = False,
    last: int = TIMELINE_TRIALS,
) -> dict[str, Any]:
    """:func:`timeline` of the latest ``last`` trials of a study that ran."""
    runs = storage.list_trial_runs(study.id, last=last)
    ran = len(runs) if len(runs) < last else storage.count_trial_runs(study.id)
    data = timeline(runs, redact_hosts=redact_hosts, trials_ran=ran)
    return {"study": study.name, **data}


# --- the studies of one model side by side -------------------------------------------------

#: Model fields that do not make a different model (the sequence length is a training
#: setting: it is shown next to each study instead).
_NOT_IDENTITY = frozenset({"seq_length"})
#: Most studies one comparison shows.
COMPARE_MAX = 12
#: The figures of each study's best trial that the comparison shows, with their labels.
COMPARE_FIGURES: dict[str, str] = {
    "tflops_per_gpu": "TFLOP/s per GPU",
    "step_time_s": "step time (s)",
    "peak_mem_gib": "peak memory (GiB)",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
}
_CI_OF = {"tflops_per_gpu": "tflops_per_gpu_ci", "step_time_s": "step_time_ci_s"}


def model_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """How two studies' models differ (``field a vs b`` each); empty when it is the same
    model (the sequence length aside)."""
    keys = sorted((set(a) | set(b)) - _NOT_IDENTITY)
    return [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]


def _noisy_best_row(storage: Storage, st: StudyRecord) -> dict[str, Any] | None:
    """A study's noise-aware best (:func:`dse.results.best_formats.best_payload`: pooled figures
    with their intervals, the tie) as a comparison row's ``best``; None while it has none. A stored
    space that no longer loads: its best trial as stored, flagged ``pooled: False``."""

    try:
        p = best_payload(storage, st)
    except NoCompleteTrialError:
        return None
    except SpaceError:
        b = storage.best_trial(st.id, st.direction, exclude_changed=True)
        if b is None:
            return None
        p = {"trial": b.number, "objective": {"value": b.value}, "params": b.params,
             "source": b.source, "metrics": b.metrics, "noise": None}  # fmt: skip
    m = p["metrics"]
    noise = p.get("noise") or {}
    best: dict[str, Any] = {
        "trial": p["trial"], "value": finite(p["objective"]["value"]), "params": p["params"],
        "source": p["source"], "numerics": (m.get("numerics") or {}).get("status"),
        "pooled": bool(noise), "trials": noise.get("trials", [p["trial"]]),
        "tied": [c["trial"] for c in noise.get("tied", [])], "tie": noise.get("message", ""),
    }  # fmt: skip
    for k in COMPARE_FIGURES:
        best[k] = finite(m.get(k))
    for ci in _CI_OF.values():
        v = m.get(ci)
        ok = isinstance(v, list) and len(v) == 2
        best[ci] = [finite(v[0]), finite(v[1])] if ok else None
    # measurement.clock cpu (the CPU demo): its step time is CPU time, the wall time beside it
    cpu = m.get("step_clock") == "cpu"
    best["step_clock"] = "cpu" if cpu else "wall"
    best["step_wall_time_s"] = finite(m.get("step_wall_time_s")) if cpu else None
    return best


def _study_row(storage: Storage, st: StudyRecord) -> dict[str, Any]:
    try:
        space = _stored_space(st.space_yaml, st.name)
        recipe, workload = space.recipe, space.workload.name
        sem: dict[str, int | None] = {
            "seq_length": space.semantics.seq_length,
            "global_batch_size": space.semantics.global_batch_size,
        }
    except (ValueError, KeyError):  # a stored space that no longer validates
        recipe, workload, sem = None, None, {"seq_length": st.model.get("seq_length"),
                                             "global_batch_size": None}  # fmt: skip
    hw = st.hardware
    best = _noisy_best_row(storage, st)
    return {
        "study": st.name,
        "state": st.state,
        "metric": st.metric,
        "direction": st.direction,
        "recipe": recipe,
        "workload": workload,
        "gpu": hw.get("gpu"),
        "gpu_memory_gib": hw.get("gpu_memory_gib"),
        "world_size": hw.get("world_size"),
        "device": hw.get("device"),
        **sem,
        "counts": storage.count_trials(st.id),
        "gpu_hours": storage.gpu_seconds(st.id) / 3600.0,
        "best": best,
    }


def comparable_studies(storage: Storage, study: StudyRecord) -> list[dict[str, Any]]:
    """The other studies of the same model (the sequence length aside), oldest first, with
    their hardware and best figures (what :func:`compare_studies` shows for each)."""
    others = [s for s in storage.list_studies()
              if s.id != study.id and not model_differences(study.model, s.model)]  # fmt: skip
    return [_study_row(storage, s) for s in others[: COMPARE_MAX - 1]]


def compare_studies(
    storage: Storage, names: Sequence[str], *, where: str = "studies"
) -> dict[str, Any]:
    """The studies ``names`` (the same model, on other hardware or recipes) side by side:
    for each its hardware, recipe, training settings and its best trial's figures.

    Raises:
        ValueError: fewer than two or more than :data:`COMPARE_MAX` studies, an unknown one,
            or one of another model (the message starts with ``where`` and says which).
    """

    wanted = list(dict.fromkeys(names))
    if len(wanted) < 2:
        raise ValueError(f"{where}: name at least two studies to compare, got {len(wanted)}")
    if len(wanted) > COMPARE_MAX:
        raise ValueError(f"{where}: at most {COMPARE_MAX} studies, got {len(wanted)}")
    studies = []
    for n in wanted:
        try:
            studies.append(storage.get_study(n))
        except StudyNotFoundError:
            raise ValueError(f"{where}: no study named {n!r}") from None
    first = studies[0]
    for st in studies[1:]:
        diff = model_differences(first.model, st.model)
        if diff:
            raise ValueError(
                f"{where}: {st.name!r} trains another model than {first.name!r} "
                f"({'; '.join(diff[:4])}); compare studies of one model"
            )
    model = {k: v for k, v in first.model.items() if k not in _NOT_IDENTITY}
    return {
        "model": model,
        "figures": COMPARE_FIGURES,
        "studies": [_study_row(storage, st) for st in studies],
        "label": "each study's noise-aware best on its own hardware (its configuration's "
        "figures pooled over its runs, with their 95% intervals where known; a tie within "
        "noise is named); an estimate (sim) is marked so; studies that optimise another "
        "metric show their best for that metric",
    }
