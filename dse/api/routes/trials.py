"""Trials: a study's pages, one trial with its per-step metrics."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from dse.api.deps import Reads, ReadsDep, StorageDep, StudyDep, StudyName, TrustedDep
from dse.api.errors import error_responses
from dse.api.schemas import (
    TrialDetailPublic,
    TrialOrder,
    TrialPublic,
    TrialsPublic,
)
from dse.api.views import (
    json_bytes,
    page_bytes,
    page_intervals,
    study_space,
    trial_detail,
    trial_row,
)
from dse.core.records import StudyRecord, TrialState
from dse.space.searchspace import SearchSpace
from dse.storage import Storage, StoredTrialRow, trial_from_stored

__all__ = ["router", "trial_page_answer"]

router = APIRouter(tags=["trials"])

#: Ids and numbers are 32-bit integers in every backend.
MAX_INT = 2**31 - 1
#: The largest trial page (``limit``); the fast path of :mod:`dse.api.fastreads` keeps to it.
PAGE_LIMIT_MAX = 1000
#: Where a trial ran: shown only to readers with the token (docs/SECURITY.md).
_WHERE = ("host", "runner", "log_path", "metrics_path")
#: Metrics that say where a trial ran (the GPU slots name the host): hidden likewise.
_WHERE_METRICS = ("gpu_slots",)
_WHERE_IN_PAGES = tuple(k for k in _WHERE if k in TrialPublic.model_fields)


_T = TypeVar("_T", bound=TrialPublic)


def _redact(trial: _T, trusted: bool) -> _T:
    if trusted:
        return trial
    hidden: dict[str, Any] = {k: None for k in _WHERE if k in type(trial).model_fields}
    hidden["metrics"] = {k: v for k, v in trial.metrics.items() if k not in _WHERE_METRICS}
    return trial.model_copy(update=hidden)


def _row(stored: StoredTrialRow, trusted: bool, space: SearchSpace | None = None) -> bytes:
    """A trial's row of a page (:func:`trial_row`: its knobs that do nothing left out),
    serialized; where it ran left out for a reader without the token."""
    row = trial_row(trial_from_stored(stored), space)
    if not trusted:
        row.update(dict.fromkeys(_WHERE_IN_PAGES, None))
        row["metrics"] = {k: v for k, v in row["metrics"].items() if k not in _WHERE_METRICS}
    return json_bytes(row)


@router.get(
    "/studies/{name}/trials",
    response_model=TrialsPublic,
    responses=error_responses(404, 422, 503),
)
async def list_trials(
    storage: StorageDep,
    reads: ReadsDep,
    trusted: TrustedDep,
    name: StudyName,
    state: Annotated[TrialState | None, Query(description="Only this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT_MAX, description="Page size.")] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_INT, description="Trials to skip.")] = 0,
    order: Annotated[
        TrialOrder,
        Query(description="number, -number, value or -value (no value last)."),
    ] = "number",
) -> Response:
    """A page of a study's trials (``count``: how many match in all pages). Pages are
    reused until the study changes (every trial write moves its version)."""
    body = await trial_page_answer(
        reads, storage, name, state=state, limit=limit, offset=offset, order=order,
        trusted=trusted,
    )  # fmt: skip
    return Response(body, media_type="application/json")


async def trial_page_answer(
    reads: Reads,
    storage: Storage,
    name: str,
    *,
    state: str | None,
    limit: int,
    offset: int,
    order: str,
    trusted: bool,
) -> bytes:
    """The body of ``GET /studies/{name}/trials`` for validated parameters (also answered by
    :mod:`dse.api.fastreads`).

    Raises:
        StudyNotFoundError: no such study (404).
        StorageError: the database cannot be read (503).
    """

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        study = study_of()
        counts = reads.counts(study)
        stored = storage.trial_page(study.id, state=state, limit=limit, offset=offset, order=order)
        # each row serialized once while its trial does not change (most rows of a page)
        keyed = [(("trial", row[0], trusted), row) for row in stored]
        space = study_space(study)
        rows = reads.fragments.get_many(keyed, partial(_row, trusted=trusted, space=space))
        count = counts.get(state, 0) if state is not None else counts.get("total", 0)
        intervals = page_intervals(storage, study, [trial_from_stored(r) for r in stored])
        return page_bytes(rows, count, intervals)

    key = ("trials", name, state, limit, offset, order, trusted)
    return await reads.study(name, key, build)


@router.get(
    "/studies/{name}/trials/{number}",
    response_model=TrialDetailPublic,
    responses=error_responses(404, 422, 503),
)
def get_trial_by_number(
    storage: StorageDep,
    study: StudyDep,
    trusted: TrustedDep,
    number: Annotated[int, Path(ge=0, le=MAX_INT, description="Trial number in the study.")],
) -> TrialDetailPublic:
    """One trial of a study by its number, with per-step metrics and failure reason."""
    detail = trial_detail(storage.get_trial_by_number(study.id, number), study)
    return _redact(detail, trusted)


@router.get(
    "/trials/{trial_id}",
    response_model=TrialDetailPublic,
    responses=error_responses(404, 422, 503),
)
def get_trial(
    storage: StorageDep,
    trusted: TrustedDep,
    trial_id: Annotated[int, Path(ge=1, le=MAX_INT, description="Trial id.")],
) -> TrialDetailPublic:
    """One trial by id: configuration, state, metrics, per-step curves (loss, step time,
    TFLOP/s, memory), failure class and reason, where it ran."""
    t = storage.get_trial(trial_id, with_steps=True)
    return _redact(trial_detail(t, storage.get_study_by_id(t.study_id)), trusted)
