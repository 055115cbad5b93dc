"""Best configurations: of one study (in every export format) and across studies."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from pydantic import Field

from dse.api.deps import Reads, ReadsDep, StorageDep, StudyName
from dse.api.errors import error_responses
from dse.api.schemas import BestPublic, BestQuery, CrossBestPublic
from dse.api.views import best_public, best_text, cross_best, json_bytes
from dse.core.exceptions import SpaceError
from dse.core.records import BestFormat, Metric, StudyRecord
from dse.storage import Storage

__all__ = ["router", "best_answer"]

router = APIRouter(tags=["best"])

_INT = {"ge": 1, "le": 2**31 - 1}
#: A model family field's value in a query (0: absent, as left out).
_FamilyInt = Annotated[int, Field(ge=0, le=2**63 - 1)]


@router.get(
    "/studies/{name}/best",
    response_model=BestPublic,
    responses={
        200: {
            "description": "JSON for format=json; the text `dse best --format FORMAT` prints "
            "(YAML, Megatron-LM arguments, Megatron-Bridge or NeMo-Run overrides) as "
            "text/plain for the other formats.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **error_responses(404, 409, 422, 503),
    },
)
async def get_best(
    storage: StorageDep,
    reads: ReadsDep,
    name: StudyName,
    fmt: Annotated[
        BestFormat,
        Query(
            alias="format",
            description="json (an object with every export) or yaml|megatron|bridge|nemo.",
        ),
    ] = "json",
) -> Response:
    """The best feasible (complete) trial of a study and its configuration.

    ``format=json`` answers a JSON object whose ``exports`` hold the Megatron-LM arguments
    and the Megatron-Bridge / NeMo-Run overrides; ``yaml``, ``megatron``, ``bridge`` and
    ``nemo`` answer exactly what ``dse best --format ...`` prints, as text/plain. 404 while
    the study has no complete trial. (Answers are reused until the study changes.)
    """
    body = await best_answer(reads, storage, name, fmt)
    if fmt == "json":
        return Response(body, media_type="application/json")
    return PlainTextResponse(body)


async def best_answer(reads: Reads, storage: Storage, name: str, fmt: BestFormat) -> bytes:
    """The body of ``GET /studies/{name}/best`` (also answered by :mod:`dse.api.fastreads`).

    Raises:
        StudyNotFoundError, NoCompleteTrialError: no such study, no best yet (404).
        HTTPException: 409, the stored space no longer loads.
        StorageError: the database cannot be read (503).
    """

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        study = study_of()
        try:
            if fmt == "json":
                return json_bytes(best_public(storage, study).model_dump(mode="json"))
            text = best_text(storage, study, fmt)
        except SpaceError as e:  # the stored space, not the request, is at fault
            raise HTTPException(status_code=409, detail=f"the stored space no longer loads: {e}")
        return (text if text.endswith("\n") else text + "\n").encode()

    # only writes that can change the best rebuild it (not a controller's claims and starts)
    return await reads.study(name, ("best", name, fmt), build, best=True)


@router.get(
    "/best",
    response_model=CrossBestPublic,
    responses=error_responses(404, 422, 503),
)
async def get_best_across(
    request: Request,
    storage: StorageDep,
    reads: ReadsDep,
    num_layers: Annotated[int | None, Query(**_INT)] = None,
    hidden_size: Annotated[int | None, Query(**_INT)] = None,
    num_attention_heads: Annotated[int | None, Query(**_INT)] = None,
    num_query_groups: Annotated[int | None, Query(**_INT)] = None,
    ffn_hidden_size: Annotated[int | None, Query(**_INT)] = None,
    vocab_size: Annotated[int | None, Query(**_INT)] = None,
    num_moe_experts: Annotated[
        _FamilyInt | Literal["any"] | None,
        Query(description="Routed experts; left out or 0: dense studies only; 'any': both."),
    ] = None,
    hybrid_layer_pattern: Annotated[
        Annotated[str, Field(min_length=1, max_length=4096)] | None,
        Query(description="Hybrid layer pattern; left out: GPT studies only; 'any': both."),
    ] = None,
    frozen_params: Annotated[
        _FamilyInt | Literal["any"] | None,
        Query(description="Frozen encoder parameters; left out or 0: none; 'any': any."),
    ] = None,
    seq_length: Annotated[
        int | None, Query(**_INT, description="Sequence length (semantics.seq_length).")
    ] = None,
    global_batch_size: Annotated[
        int | None,
        Query(**_INT, description="Global batch size in sequences (semantics)."),
    ] = None,
    gpu: Annotated[
        str | None, Query(max_length=128, description="GPU name (any case), e.g. 'NVIDIA H200'.")
    ] = None,
    world_size: Annotated[int | None, Query(**_INT, description="GPUs per trial.")] = None,
    device: Annotated[Literal["cuda", "cpu"] | None, Query()] = None,
    metric: Annotated[Metric, Query(description="Objective the studies optimise.")] = (
        "tflops_per_gpu"
    ),
) -> Response:
    """The best configuration for this model on this hardware over every matching study.

    Every given field must equal the study's (model fields, ``seq_length`` and
    ``global_batch_size`` from its space file; ``gpu``, ``world_size`` and ``device`` from
    its resources). Left out, ``num_moe_experts``, ``hybrid_layer_pattern`` and
    ``frozen_params`` mean absent: only dense GPT studies without frozen encoders match
    unless the query gives a value or ``any``. At least one field is needed; an unknown
    parameter is a 422 naming it. 404
    when no study matches or none has a complete trial yet. ``POST /best/query`` takes any
    field.
    """
    unknown = sorted(set(request.query_params) - _GET_PARAMS)
    if unknown:
        raise RequestValidationError(
            [
                {
                    "type": "extra_forbidden",
                    "loc": ("query", k),
                    "msg": f"unknown parameter (known: {', '.join(sorted(_GET_PARAMS))})",
                    "input": request.query_params[k],
                }
                for k in unknown
            ]
        )
    model = {
        k: v
        for k, v in {
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "num_attention_heads": num_attention_heads,
            "num_query_groups": num_query_groups,
            "ffn_hidden_size": ffn_hidden_size,
            "vocab_size": vocab_size,
            "num_moe_experts": num_moe_experts,
            "hybrid_layer_pattern": hybrid_layer_pattern,
            "frozen_params": frozen_params,
        }.items()
        if v is not None
    }
    semantics = {
        k: v
        for k, v in {"seq_length": seq_length, "global_batch_size": global_batch_size}.items()
        if v is not None
    }
    hardware = {
        k: v
        for k, v in {"gpu": gpu, "world_size": world_size, "device": device}.items()
        if v is not None
    }
    query = BestQuery(model=model, semantics=semantics, hardware=hardware, metric=metric)
    return await _cross(storage, reads, query)


#: The query parameters of ``GET /best`` (anything else is a misspelling: 422).
_GET_PARAMS = frozenset(inspect.signature(get_best_across).parameters) - {
    "request",
    "storage",
    "reads",
}


@router.post(
    "/best/query",
    response_model=CrossBestPublic,
    responses=error_responses(404, 422, 503),
)
async def query_best(storage: StorageDep, reads: ReadsDep, query: BestQuery) -> Response:
    """Like ``GET /best`` with any model / semantics / hardware field in a JSON body
    (read-only). A field the space file does not have is a 422 naming it."""
    return await _cross(storage, reads, query)


async def _cross(storage: Storage, reads: Reads, query: BestQuery) -> Response:
    """The best across studies, reused until a study is added or removed or a study's best
    can have changed."""
    if not query.model and not query.semantics and not query.hardware:
        raise HTTPException(
            status_code=422,
            detail="give at least one model, semantics or hardware field to match by",
        )

    def build() -> bytes:
        return json_bytes(cross_best(storage, query).model_dump(mode="json"))

    body = await reads.every_study(("cross-best", query.model_dump_json()), build, best=True)
    return Response(body, media_type="application/json")
