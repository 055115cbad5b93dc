"""``/studies/{name}/insights``: knob importance, slices per knob, GPU-hours and the training
projection of a study, computed by :func:`dse.studyplots.study_plot_data` (the same data the
``dse report`` page draws)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from dse.api.deps import ReadsDep, StorageDep, StudyName
from dse.api.errors import error_responses
from dse.api.views import json_bytes
from dse.records import StudyRecord

__all__ = ["router"]

router = APIRouter(prefix="/studies", tags=["studies"])


@router.get("/{name}/insights", responses=error_responses(404, 422, 503))
async def get_insights(
    storage: StorageDep,
    reads: ReadsDep,
    name: StudyName,
    cost_per_gpu_hour: Annotated[float | None, Query(gt=0, le=1e6)] = None,
    tokens: Annotated[float, Query(gt=0, le=1e16)] = 1e12,
) -> Response:
    """Knob importance (Optuna PED-ANOVA on the complete trials), the objective per knob
    value (slices), GPU-hours spent and saved against the full grid, and a projection of a
    full training run from the best step time (estimates are labelled). Reused until the
    study changes."""

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        from dse.studyplots import study_plot_data

        study = study_of()
        data = study_plot_data(storage, study, cost_per_gpu_hour=cost_per_gpu_hour, tokens=tokens)
        keys = ("study", "metric", "direction", "importance", "importance_how", "slices",
                "slice_values", "gpu", "projection")  # fmt: skip
        body: dict[str, Any] = {k: data[k] for k in keys}
        return json_bytes(body)

    key = ("insights", name, cost_per_gpu_hour, tokens)
    return Response(await reads.study(name, key, build), media_type="application/json")
