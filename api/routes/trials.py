"""Trials: a study's pages, one trial with its per-step metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from dse.api.deps import StorageDep, StudyDep
from dse.api.errors import error_responses
from dse.api.schemas import TrialDetailPublic, TrialOrder, TrialsPublic
from dse.api.views import trial_detail, trial_public
from dse.records import TrialState

__all__ = ["router"]

router = APIRouter(tags=["trials"])

#: Ids and numbers are 32-bit integers in every backend.
_MAX_INT = 2**31 - 1


@router.get(
    "/studies/{name}/trials",
    response_model=TrialsPublic,
    responses=error_responses(404, 422, 503),
)
def list_trials(
    storage: StorageDep,
    study: StudyDep,
    state: Annotated[TrialState | None, Query(description="Only this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size.")] = 100,
    offset: Annotated[int, Query(ge=0, le=_MAX_INT, description="Trials to skip.")] = 0,
    order: Annotated[
        TrialOrder,
        Query(description="number, -number, value or -value (no value last)."),
    ] = "number",
) -> TrialsPublic:
    """A page of a study's trials (``count``: how many match in all pages)."""
    counts = storage.count_trials(study.id)
    rows = storage.list_trials(study.id, state=state, limit=limit, offset=offset, order=order)
    return TrialsPublic(
        data=[trial_public(t) for t in rows],
        count=counts.get(state, 0) if state is not None else counts.get("total", 0),
    )


@router.get(
    "/studies/{name}/trials/{number}",
    response_model=TrialDetailPublic,
    responses=error_responses(404, 422, 503),
)
def get_trial_by_number(
    storage: StorageDep,
    study: StudyDep,
    number: Annotated[int, Path(ge=0, le=_MAX_INT, description="Trial number in the study.")],
) -> TrialDetailPublic:
    """One trial of a study by its number, with per-step metrics and failure reason."""
    return trial_detail(storage.get_trial_by_number(study.id, number), study)


@router.get(
    "/trials/{trial_id}",
    response_model=TrialDetailPublic,
    responses=error_responses(404, 422, 503),
)
def get_trial(
    storage: StorageDep,
    trial_id: Annotated[int, Path(ge=1, le=_MAX_INT, description="Trial id.")],
) -> TrialDetailPublic:
    """One trial by id: configuration, state, metrics, per-step curves (loss, step time,
    TFLOP/s, memory), failure class and reason, where it ran."""
    t = storage.get_trial(trial_id, with_steps=True)
    return trial_detail(t, storage.get_study_by_id(t.study_id))
