"""``/compare``: the studies of one model side by side (across hardware or recipes), from
:func:`dse.report.plots.compare_studies`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response

from dse.api.deps import StorageDep
from dse.api.errors import error_responses
from dse.api.schemas import ComparePublic
from dse.api.views import json_bytes
from dse.report.plots import compare_studies

__all__ = ["router"]

router = APIRouter(tags=["studies"])


def _names(storage: StorageDep, values: list[str]) -> list[str]:
    """Study names: each value as given; a value that names no study but whose
    comma-separated parts all do stands for those (``?studies=a,b``)."""
    known = {s.name for s in storage.list_studies()}
    out: list[str] = []
    for v in values:
        parts = v.split(",")
        if v not in known and len(parts) > 1 and all(p in known for p in parts):
            out += parts
        else:
            out.append(v)
    return out


@router.get("/compare", response_model=ComparePublic, responses=error_responses(422, 503))
def compare(
    storage: StorageDep,
    studies: Annotated[
        list[str],
        Query(
            min_length=1,
            max_length=12,
            description="Study names: ?studies=a&studies=b (or ?studies=a,b), 2 to 12, all "
            "of one model.",
        ),
    ],
) -> Response:
    """The studies' hardware (GPU, world size), recipe, sequence length and batch, GPU-hours
    and their best trial's figures (TFLOP/s per GPU, step time, peak memory, tokens/s per
    GPU, with intervals when measured) side by side. Fewer than two studies, an unknown
    one, or one of another model is a 422 naming ``query.studies``."""

    for v in studies:
        if len(v) > 255 * 12 or any(ord(c) < 32 for c in v):  # never a stored name
            raise HTTPException(422, detail=f"query.studies: no study named {v[:255]!r}")
    try:
        data = compare_studies(storage, _names(storage, studies), where="query.studies")
    except ValueError as e:
        raise HTTPException(422, detail=str(e)) from None
    return Response(json_bytes(data), media_type="application/json")
