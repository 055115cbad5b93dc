"""What the routes answer, built from storage records: summaries, pages, the Pareto front,
best configurations (one study or across studies). No HTTP here: errors are
:mod:`dse.core.exceptions`, translated by the app's exception handlers."""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from fastapi import Response
from pydantic import ValidationError

try:  # optional (the api extra; the answers are the same without it, only slower)
    import orjson
except ImportError:  # pragma: no cover
    orjson = None  # type: ignore[assignment]

from dse.api.plausible import value_range
from dse.api.schemas import (
    ANY,
    BestPublic,
    BestQuery,
    CrossBestPublic,
    NumericsPublic,
    PointPublic,
    RejectionPublic,
    StepPublic,
    StudyPublic,
    StudySummaryPublic,
    TrialDetailPublic,
    TrialPublic,
)
from dse.core.exceptions import SpaceError, StudyNotFoundError
from dse.core.records import (
    METRIC_DIRECTION,
    BestFormat,
    RejectionRecord,
    StepMetrics,
    StudyRecord,
    TrialPoint,
    TrialRecord,
    finite,
)
from dse.report.plots import pareto_front, running_best
from dse.results.best_formats import best_payload, best_space, render_best
from dse.results.gpu_usage import GRID_ATTR, HELD_ATTR_PREFIX, grid_of_study, usage_of_totals
from dse.results.noise import (
    NoisyBest,
    configuration_intervals,
    estimate_public,
    pooled_best,
    study_best,
)
from dse.results.run_settings import effective_space
from dse.space.searchspace import MODEL_FAMILY_FIELDS, SearchSpace, Semantics, family_value
from dse.storage import Storage
from dse.workloads.launchers.flags import export_text

__all__ = [
    "clean",
    "pareto_front",
    "study_summary",
    "study_public",
    "trial_public",
    "trial_row",
    "shown_params",
    "study_space",
    "trial_detail",
    "rejection_public",
    "points_of",
    "pareto_public",
    "json_response",
    "json_bytes",
    "best_public",
    "noisy_best",
    "cross_best",
    "study_matches",
    "study_semantics",
]


def clean(obj: Any) -> Any:
    """A JSON-safe copy: non-finite floats become None (JSON has no NaN)."""
    if isinstance(obj, float):
        return finite(obj)
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return obj


def json_bytes(data: Any) -> bytes:
    """``data`` (JSON values) serialized once, compactly; non-finite floats become null."""
    if orjson is not None:  # several times faster; writes non-finite floats as null too
        try:
            return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:  # e.g. an integer beyond 64 bits: json writes it
            pass
    try:
        return json.dumps(data, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:  # a NaN somewhere: clean the whole answer (rare)
        return json.dumps(clean(data), separators=(",", ":")).encode()


def page_bytes(rows: list[bytes], count: int, intervals: Mapping[int, Any] | None = None) -> bytes:
    """``json_bytes({"data": [rows...], "count": count, "intervals": ...})`` from rows
    serialized one by one (each by :func:`json_bytes`): the same bytes, without serializing
    the rows again."""
    body = b'{"data":[' + b",".join(rows) + b'],"count":' + str(int(count)).encode()
    if intervals is not None:
        body += b',"intervals":' + json_bytes({str(k): v for k, v in intervals.items()})
    return body + b"}"


def page_intervals(
    storage: Storage, study: StudyRecord, trials: list[TrialRecord]
) -> dict[int, Any]:
    """Each complete trial's configuration with its pooled figures and THE intervals
    (:func:`dse.results.noise.configuration_intervals`, as the best panel, the comparison
    view, the report and the CLI show them), by trial number; {} when the stored space no
    longer loads."""
    try:
        space = effective_space(study.space_yaml, study.name, storage.get_study_attrs(study.id))
        est = configuration_intervals(storage, study, space, trials)
    except SpaceError:
        return {}
    return {n: clean(estimate_public(c)) for n, c in est.items()}


def json_response(data: Any) -> Response:
    """``data`` (JSON values) as a response, serialized once without model validation (for
    large answers; the route's ``response_model`` still documents it). Non-finite floats
    become null."""
    return Response(json_bytes(data), media_type="application/json")


# --- studies ------------------------------------------------------------------------------


def study_summary(storage: Storage, study: StudyRecord) -> StudySummaryPublic:
    """A study's state, trial counts, best value and GPU-hours."""
    fields, _ = _summary_fields(storage, study)
    return StudySummaryPublic(**fields)


def study_public(storage: Storage, study: StudyRecord) -> StudyPublic:
    """A study's summary plus its space file and rejections per kind."""
    fields, rejections = _summary_fields(storage, study)
    return StudyPublic(
        **fields,
        space_hash=study.space_hash,
        space_yaml=study.space_yaml,
        rejection_counts=rejections,
    )


def _summary_fields(storage: Storage, study: StudyRecord) -> tuple[dict[str, Any], dict[str, int]]:
    counts = storage.count_trials(study.id)
    numerics = storage.count_numerics(study.id)
    remeasure = numerics.pop("remeasure")
    try:
        nb = noisy_best(storage, study)
    except SpaceError:  # a stored space that no longer loads: the plain best, flagged left out
        nb = None
        plain = storage.best_trial(study.id, study.direction, exclude_changed=True)
        best_value = None if plain is None else finite(plain.value)
        best_trial = None if plain is None else plain.number
    else:
        best_value = None if nb is None else finite(nb.best.objective.value)
        best_trial = None if nb is None else nb.best.number
    rejections = storage.count_rejections(study.id)
    fields = {
        "name": study.name,
        "state": study.state,
        "direction": study.direction,
        "metric": study.metric,
        "created_at": study.created_at,
        "counts": counts,
        "rejections": sum(rejections.values()),
        "best_value": best_value,
        "best_trial": best_trial,
        "best_ci": None if nb is None else _ci(nb.best.objective.ci),
        "best_tied": [] if nb is None else [c.number for c in nb.tied],
        "numerics_counts": numerics,
        "remeasure_trials": remeasure,
        "gpu_hours": storage.gpu_seconds(study.id) / 3600.0,
        "gpu": gpu_usage(storage, study, counts),
        "model": clean(study.model),
        "hardware": clean(study.hardware),
    }
    return fields, rejections


_GPU_CACHE: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
_GPU_CACHE_LOCK = threading.Lock()


def gpu_usage(storage: Storage, study: StudyRecord, counts: dict[str, int]) -> dict[str, Any]:
    """A study's GPU time (:func:`dse.results.gpu_usage.usage_of_totals` of the storage's
    :meth:`~dse.storage.Storage.gpu_totals`: one aggregate query, not a read of every
    trial), reused while its trial counts and held-time records are unchanged (a study list
    reads every study's)."""

    attrs = storage.get_study_attrs(study.id)
    held = {k: v for k, v in attrs.items() if k.startswith(HELD_ATTR_PREFIX) or k == GRID_ATTR}
    key = (storage.url, study.id, study.space_hash, json.dumps([counts, held], sort_keys=True))
    with _GPU_CACHE_LOCK:
        hit = _GPU_CACHE.get(key)
        if hit is not None:
            _GPU_CACHE.move_to_end(key)
            return hit
    device = str(study.hardware.get("device") or "cpu")
    totals = storage.gpu_totals(study.id)
    out = clean(usage_of_totals(totals, attrs, device=device, grid=grid_of_study(study, attrs)))
    with _GPU_CACHE_LOCK:
        _GPU_CACHE[key] = out
        while len(_GPU_CACHE) > 256:
            _GPU_CACHE.popitem(last=False)
    return out  # type: ignore[no-any-return]


def numerics_public(v: Any) -> dict[str, Any] | None:
    """A trial's ``metrics["numerics"]`` as :class:`NumericsPublic` data, or None when it
    holds none or not that shape (an imported study's metrics are not trusted)."""
    if v is None:
        return None
    try:
        return NumericsPublic.model_validate(clean(v)).model_dump()
    except ValidationError:
        return None


def _ci(ci: tuple[float, float] | None) -> list[float | None] | None:
    return None if ci is None else [finite(ci[0]), finite(ci[1])]


def noisy_best(
    storage: Storage, study: StudyRecord, value_range: tuple[float, float] | None = None
) -> NoisyBest | None:
    """The noise-aware best of a study under its effective settings (:mod:`dse.results.noise`).

    Raises:
        SpaceError: the stored space no longer validates.
    """
    space = effective_space(study.space_yaml, study.name, storage.get_study_attrs(study.id))
    return study_best(storage, study, space, value_range=value_range)


# --- trials -------------------------------------------------------------------------------


def study_space(study: StudyRecord) -> SearchSpace | None:
    """The stored space of a study (cached), or None where it no longer validates."""
    try:
        return effective_space(study.space_yaml, study.name, {})
    except SpaceError:
        return None


def shown_params(space: SearchSpace | None, params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's knob values as the dashboard shows them: without the knobs that do nothing
    in that configuration (:meth:`dse.space.searchspace.SearchSpace.active_config`); as
    stored where the study's space is unknown or the configuration no longer resolves."""
    if space is None:
        return dict(params)
    try:
        return space.active_config(params, fixed=False)
    except (ValueError, KeyError, TypeError):  # a stored configuration the space now refuses
        return dict(params)


def _trial_fields(
    t: TrialRecord, metrics: Mapping[str, Any], space: SearchSpace | None = None
) -> dict[str, Any]:
    """The public fields of a trial (:class:`TrialPublic`), as stored (its knob values without
    those that do nothing there, where ``space`` is given: :func:`shown_params`): the one
    list of them (pages, :func:`trial_public` and :func:`trial_detail` derive from it). In
    the order of a page's JSON rows, ``metrics`` last."""
    return {
        "id": t.id,
        "number": t.number,
        "state": t.state,
        "params": shown_params(space, t.params),
        "value": t.value,
        "failure_class": t.failure_class,
        "reason": t.reason,
        "source": t.source,
        "host": t.host,
        "queued_at": t.queued_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "gpu_seconds": t.gpu_seconds,
        "attempts": t.attempts,
        "numerics": numerics_public(t.metrics.get("numerics")),
        "remeasure_of": t.remeasure_of,
        "metrics": metrics,
    }


def trial_row(t: TrialRecord, space: SearchSpace | None = None) -> dict[str, Any]:
    """A trial for a page (metrics without the per-step ``losses`` list) as a plain dict, for
    :func:`json_bytes` (a page of them is serialized once, without building and validating a
    model per trial; a non-finite number becomes null there)."""
    metrics = t.metrics
    if "losses" in metrics:
        metrics = {k: v for k, v in metrics.items() if k != "losses"}
    return _trial_fields(t, metrics, space)


def trial_public(t: TrialRecord) -> TrialPublic:
    """:func:`trial_row` as a model (non-finite numbers become None)."""
    return TrialPublic(**clean(trial_row(t)))


def _step_public(s: StepMetrics) -> StepPublic:
    return StepPublic(
        step=s.step,
        step_time_s=finite(s.step_time_s),
        tflops_per_gpu=finite(s.tflops_per_gpu),
        peak_mem_gib=finite(s.peak_mem_gib),
        peak_reserved_gib=finite(s.peak_reserved_gib),
        loss=finite(s.loss),
        grad_norm=finite(s.grad_norm),
    )


def trial_detail(t: TrialRecord, study: StudyRecord) -> TrialDetailPublic:
    """A trial with everything: metrics, per-step curves, where it ran, re-queue history."""
    return TrialDetailPublic(
        **clean(_trial_fields(t, t.metrics, study_space(study))),
        study=study.name,
        runner=t.runner,
        log_path=t.log_path,
        metrics_path=t.metrics_path,
        heartbeat_at=t.heartbeat_at,
        history=clean(list(t.history)),
        steps=[_step_public(s) for s in t.steps],
    )


def rejection_public(r: RejectionRecord) -> RejectionPublic:
    return RejectionPublic(
        id=r.id,
        params=clean(r.params),
        kind=r.kind,
        rule=r.rule,
        reason=r.reason,
        values=clean(r.values),
        created_at=r.created_at,
    )


# --- Pareto front ---------------------------------------------------------------------------


def _kind(state: str, failure_class: str | None) -> str:
    if state in ("failed", "infeasible"):
        return failure_class or state
    return state


#: A point with every field of :class:`PointPublic` empty (null, off the front), in the
#: schema's order: a rejection leaves the fields of a trial so.
_EMPTY_POINT: dict[str, Any] = {**dict.fromkeys(PointPublic.model_fields), "on_front": False}


def _trial_point(t: TrialPoint) -> dict[str, Any]:
    """Every field of :class:`PointPublic` (a literal: 10,000 points per answer)."""
    return {
        "trial_id": t.id,
        "number": t.number,
        "state": t.state,
        "kind": _kind(t.state, t.failure_class),
        "source": "trial",
        "value": finite(t.value),
        "tflops_per_gpu": finite(t.tflops_per_gpu),
        "peak_mem_gib": finite(t.peak_mem_gib),
        "step_time_s": finite(t.step_time_s),
        "gpu_seconds": finite(t.gpu_seconds),
        "on_front": False,
        "reason": t.reason,
        "params": t.params,
        "numerics": t.numerics,
        "remeasure_of": t.remeasure_of,
    }


def _rejection_point(r: RejectionRecord) -> dict[str, Any]:
    return {
        **_EMPTY_POINT,
        "state": "rejected",
        "kind": r.kind,
        "source": "rejection",
        "peak_mem_gib": finite(r.values.get("predicted_peak_mem_gib")),
        "reason": f"{r.rule}: {r.reason}",
        "params": r.params,
    }


def points_of(
    trials: Iterable[TrialPoint], rejections: Iterable[RejectionRecord]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every trial and rejection as a point (a :class:`PointPublic` as a dict), the front
    flagged; returns (points, front)."""
    points = [_trial_point(t) for t in trials]
    candidates = [
        p
        for p in points
        if p["state"] == "complete"
        and p["tflops_per_gpu"] is not None
        and p["peak_mem_gib"] is not None
    ]
    xy = [(p["tflops_per_gpu"], p["peak_mem_gib"]) for p in candidates]
    front = []
    for j in pareto_front(xy):
        candidates[j]["on_front"] = True
        front.append(candidates[j])
    points += [_rejection_point(r) for r in rejections]
    return points, front


def pareto_public(storage: Storage, study: StudyRecord) -> dict[str, Any]:
    """TFLOP/s vs peak memory of a study: every point, the front flagged and listed.

    A :class:`ParetoPublic` as a plain dict: a 10,000-trial study makes 10,000 points, and
    building them as dicts (serialized once) is several times cheaper than as models.
    """
    trials = storage.list_trial_points(study.id)
    points, front = points_of(trials, storage.list_rejections(study.id))
    try:
        space = effective_space(study.space_yaml, study.name, storage.get_study_attrs(study.id))
        nb = study_best(storage, study, space)
    except SpaceError:  # a stored space that no longer loads: no noise-aware line
        run: list[dict[str, Any]] = []
    else:
        final = None if nb is None else finite(nb.best.objective.value)
        run = running_best(space, trials, study.direction, final)
    return {
        "study": study.name,
        "x_metric": "tflops_per_gpu",
        "y_metric": "peak_mem_gib",
        "direction": study.direction,
        "metric": study.metric,
        "gpu_memory_gib": finite(study.hardware.get("gpu_memory_gib")),
        "front": front,
        "points": points,
        "best_so_far": run,
    }


# --- best ----------------------------------------------------------------------------------


def _exports(payload: dict[str, Any], space: SearchSpace) -> dict[str, str | None]:
    """Each launcher format's text; null and ``<format>_why`` (the knob value the target
    cannot express, and the nearest upstream setting) where it has none."""

    out: dict[str, str | None] = {}
    for fmt in ("megatron", "bridge", "nemo"):
        try:
            out[fmt] = render_best(payload, fmt, space, export_text)
        except (ValueError, KeyError) as e:
            out[fmt] = None
            out[f"{fmt}_why"] = str(e)
    return out


def best_public(storage: Storage, study: StudyRecord, best: NoisyBest | None = None) -> BestPublic:
    """The best configuration of a study (or ``best``, found already) with its figures'
    intervals and its configuration in every export format.

    Raises:
        StudyNotFoundError: the study has no complete trial yet (404).
        SpaceError: the stored space no longer validates.
    """
    payload = clean(best_payload(storage, study, best))
    payload["numerics"] = numerics_public(payload.get("numerics"))
    exports = _exports(payload, best_space(storage, study))
    return BestPublic(**payload, exports=exports)


def best_text(storage: Storage, study: StudyRecord, fmt: BestFormat) -> str:
    """What ``dse best --format fmt`` prints for the study."""

    payload = best_payload(storage, study)
    return render_best(clean(payload), fmt, best_space(storage, study), export_text)


@functools.lru_cache(maxsize=256)
def _stored_semantics(space_yaml: str) -> dict[str, Any]:
    """The ``semantics`` of a stored space file, defaults filled in ({} when unreadable)."""
    try:
        raw = yaml.safe_load(space_yaml)
        sem = raw.get("semantics") if isinstance(raw, dict) else None
        if not isinstance(sem, dict):
            return {}
        try:
            return Semantics.model_validate(sem).model_dump()
        except ValueError:
            return dict(sem)
    except yaml.YAMLError:
        return {}


def study_semantics(study: StudyRecord) -> dict[str, Any]:
    """The training semantics of a study (sequence length, global batch size, ...), from
    its stored space file."""
    return _stored_semantics(study.space_yaml)


def study_matches(study: StudyRecord, query: BestQuery) -> bool:
    """Whether a study optimises the query's metric on that model, semantics and hardware."""
    if study.metric != query.metric:
        return False
    if study.direction != METRIC_DIRECTION.get(query.metric, study.direction):
        return False
    semantics = study_semantics(study) if query.semantics or query.model else {}
    for key in MODEL_FAMILY_FIELDS:  # left out: absent (a dense GPT, no frozen encoders)
        want = query.model.get(key)
        if want != ANY and family_value(key, study.model.get(key)) != family_value(key, want):
            return False
    for key, want in query.model.items():
        if key in MODEL_FAMILY_FIELDS:
            continue
        have = study.model.get(key)
        if key == "seq_length" and have is None:  # a record stored before it kept it
            have = semantics.get("seq_length")
        if have != want:
            return False
    for key, sem_want in query.semantics.items():
        if semantics.get(key) != sem_want:
            return False
    for key, hw_want in query.hardware.items():
        have = study.hardware.get(key)
        if key == "gpu" and isinstance(hw_want, str) and isinstance(have, str):
            if have.casefold() != hw_want.casefold():
                return False
        elif have != hw_want:
            return False
    return True


def cross_best(storage: Storage, query: BestQuery) -> CrossBestPublic:
    """The best configuration over every study that matches ``query``, their evidence
    pooled (:func:`dse.results.noise.pooled_best`: runs of one configuration under the same
    model, semantics and hardware are one body of evidence; an imported copy of a run counts
    once; ties follow the one rule).

    Raises:
        StudyNotFoundError: no study matches, or none has a complete trial (404).
    """
    matched = [s for s in storage.list_studies() if study_matches(s, query)]
    if not matched:
        raise StudyNotFoundError(f"no study matches {_describe(query)}")
    usable: list[tuple[StudyRecord, SearchSpace, tuple[float, float] | None]] = []
    for study in matched:
        try:
            space = effective_space(
                study.space_yaml, study.name, storage.get_study_attrs(study.id)
            )
        except SpaceError:
            continue  # its best cannot be shown (GET .../best answers 409 for it)
        # only finite values possible on the study's hardware count (dse/api/plausible.py)
        usable.append((study, space, value_range(query.metric, study.hardware)))
    direction = METRIC_DIRECTION.get(query.metric, "maximize")
    nb = pooled_best(storage, usable, metric=query.metric, direction=direction)
    if nb is None or finite(nb.best.objective.value) is None:
        names = ", ".join(s.name for s in matched)
        raise StudyNotFoundError(
            f"no complete trial yet in the studies that match {_describe(query)} ({names})"
        )
    home = next(s for s, _, _ in usable if s.name == nb.best.study)
    chosen = best_public(storage, home, nb)
    return CrossBestPublic(matched=[s.name for s in matched], best=chosen)


def _describe(query: BestQuery) -> str:
    parts = [f"model.{k}={v!r}" for k, v in query.model.items()]
    parts += [f"semantics.{k}={v!r}" for k, v in query.semantics.items()]
    parts += [f"hardware.{k}={v!r}" for k, v in query.hardware.items()]
    parts.append(f"metric={query.metric!r}")
    implied = [k for k in MODEL_FAMILY_FIELDS if k not in query.model]
    if implied:
        parts.append(
            f"and no {', '.join(implied)} (left out, they mean absent; give a value, or "
            f"{ANY!r} for any)"
        )
    return ", ".join(parts)
