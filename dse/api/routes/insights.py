"""Decision views of a study, computed by :mod:`dse.report.plots` (the same data the
``dse report`` page draws): ``/insights`` (knob importance, slices per knob, GPU-hours and
the training projection), ``/timeline`` (trials per GPU slot), ``/losses`` (loss curves over
the baseline's) and ``/comparable`` (the other studies of the model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response

from dse.api.deps import ReadsDep, StorageDep, StudyDep, StudyName, TrustedDep
from dse.api.errors import error_responses
from dse.api.routes.trials import MAX_INT
from dse.api.schemas import ComparablePublic, LossCurvesPublic, TimelinePublic
from dse.api.views import json_bytes
from dse.core.records import StudyRecord
from dse.report.plots import comparable_studies, loss_curves, study_insights, study_timeline

__all__ = ["router"]

router = APIRouter(prefix="/studies", tags=["studies"])

#: Trial numbers are 32-bit integers in every backend.


@router.get("/{name}/insights", responses=error_responses(404, 422, 503))
async def get_insights(
    storage: StorageDep,
    reads: ReadsDep,
    name: StudyName,
    cost_per_gpu_hour: Annotated[float | None, Query(gt=0, le=1e6)] = None,
    tokens: Annotated[float, Query(gt=0, le=1e16)] = 1e12,
) -> Response:
    """Knob importance (Optuna PED-ANOVA on the complete trials, a uniform sample of at most
    2,000 of them in a larger study: ``importance_how`` says which), the objective per knob
    value (slices, of the same trials), GPU-hours spent and saved against the full grid, and
    a projection of a full training run from the best step time (estimates are labelled).
    Reused until the study changes; built in the heavy reads' own thread."""

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        study = study_of()
        body = study_insights(storage, study, cost_per_gpu_hour=cost_per_gpu_hour, tokens=tokens)
        return json_bytes(body)

    key = ("insights", name, cost_per_gpu_hour, tokens)
    return Response(await reads.study(name, key, build, heavy=True), media_type="application/json")


@router.get(
    "/{name}/timeline", response_model=TimelinePublic, responses=error_responses(404, 422, 503)
)
async def get_timeline(
    reads: ReadsDep,
    storage: StorageDep,
    name: StudyName,
    trusted: TrustedDep,
    last: Annotated[
        int,
        Query(
            ge=1,
            le=5000,
            description="At most this many trials: the latest starts.",
        ),
    ] = 1000,
) -> Response:
    """What ran where and when: one lane per GPU slot (recorded ``gpu_slots``, else a
    cluster runner's nodes and GPU indices, else one lane per concurrent trial inferred from
    overlapping run times), a bar per trial and per interrupted attempt, coloured by state,
    and the idle gaps. Readers without the token see host names as ``node N``. Reused until
    the study changes."""

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        study = study_of()
        return json_bytes(study_timeline(storage, study, redact_hosts=not trusted, last=last))

    key = ("timeline", name, trusted, last)
    return Response(await reads.study(name, key, build, heavy=True), media_type="application/json")


@router.get(
    "/{name}/losses", response_model=LossCurvesPublic, responses=error_responses(404, 422, 503)
)
def get_losses(
    storage: StorageDep,
    study: StudyDep,
    trials: Annotated[
        list[int],
        Query(
            max_length=20,
            description="Trial numbers (repeat the parameter: ?trials=3&trials=7), at most 20.",
        ),
    ] = [],  # noqa: B006 - FastAPI copies a default list per request
) -> Response:
    """Per-step losses of the trials ``trials`` over those of the baseline trial (the
    study's baseline configuration, the recipe's own values; listed first with
    ``baseline: true``). A number with no trial is a 422 naming it."""

    if any(n < 0 or n > MAX_INT for n in trials):
        raise HTTPException(422, detail=f"query.trials: trial numbers are 0..{MAX_INT}")
    try:
        data = loss_curves(storage, study, trials)
    except ValueError as e:
        raise HTTPException(422, detail=f"query.{e}") from None
    return Response(json_bytes(data), media_type="application/json")


@router.get(
    "/{name}/comparable",
    response_model=ComparablePublic,
    responses=error_responses(404, 422, 503),
)
def get_comparable(storage: StorageDep, study: StudyDep) -> Response:
    """The other studies of the same model (the sequence length aside) with their hardware,
    recipe and best figures: what ``GET /compare`` can put beside this study."""

    data = comparable_studies(storage, study)
    return Response(
        json_bytes({"study": study.name, "data": data, "count": len(data)}),
        media_type="application/json",
    )
