"""``/studies``: list, create (optionally start), read, stop; the Pareto view and rejections."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from dse.api.deps import (
    ReadsDep,
    SettingsDep,
    SpaceChecker,
    SpaceCheckerDep,
    SpawnerDep,
    StorageDep,
    StudyDep,
    StudyName,
    WriteAccess,
)
from dse.api.errors import error_responses
from dse.api.schemas import (
    LaunchPublic,
    ParetoPublic,
    RejectionsPublic,
    StudiesPublic,
    StudyCreatedPublic,
    StudyPublic,
    VerifyPublic,
)
from dse.api.views import (
    json_bytes,
    pareto_public,
    rejection_public,
    study_public,
    study_summary,
)
from dse.core.bounds import MAX_SPACE_BYTES
from dse.core.exceptions import SpaceError
from dse.core.names import study_name_problem
from dse.core.records import VERIFY_ATTR, StudyRecord
from dse.model.space_check import CheckedSpace
from dse.storage import is_ephemeral

__all__ = ["router"]

log = logging.getLogger("dse.api")

router = APIRouter(prefix="/studies", tags=["studies"])

_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/plain")
_SPACE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A space file (YAML; JSON is YAML too), as `dse start --space` reads.",
        "content": {t: {"schema": {"type": "string"}} for t in _YAML_TYPES},
    }
}
#: Study states in which a stop request makes sense.
_STOPPABLE = ("running", "stopping")


@router.get("", response_model=StudiesPublic, responses=error_responses(503))
async def list_studies(storage: StorageDep, reads: ReadsDep) -> Response:
    """Every study, oldest first: state, trial counts, best value, GPU-hours (reused until a
    study is added, removed or changed)."""

    def build() -> bytes:
        data = [study_summary(storage, s) for s in storage.list_studies()]
        return json_bytes(StudiesPublic(data=data, count=len(data)).model_dump(mode="json"))

    return _json(await reads.every_study(("studies",), build))


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")


async def _read_body(request: Request) -> bytes:
    """The body, refused with 413 past :data:`~dse.core.bounds.MAX_SPACE_BYTES` (a space
    file's bound) before it is read in full.

    A client that disconnects before its body is complete gets a 400 (which it no longer
    reads) and one log line, not a traceback: nothing was created.
    """
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_SPACE_BYTES:
        raise _too_large()
    chunks, total = [], 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > MAX_SPACE_BYTES:
                raise _too_large()
            chunks.append(chunk)
    except ClientDisconnect:
        said = f" of {size}" if size is not None and size.isdigit() else ""
        log.info(
            "%s %s: the client disconnected after %d%s bytes of its body; nothing created",
            request.method,
            request.url.path,
            total,
            said,
        )
        raise HTTPException(
            status_code=400,
            detail=f"request body: the client disconnected after {total}{said} bytes",
        ) from None
    return b"".join(chunks)


def _too_large() -> HTTPException:
    return HTTPException(
        status_code=413,
        detail=f"request body: a space file is at most {MAX_SPACE_BYTES // 1024} KiB",
    )


def _space_from_body(body: bytes, checker: SpaceChecker) -> tuple[CheckedSpace, str]:
    """Validate a space file from a request body (SpaceError -> 422 names the field).

    Runs in a worker thread; the parsing and checking itself runs in a child process bounded
    in time and memory (:mod:`dse.model.space_check`), so a slow or explosive space neither stalls
    the event loop nor kills the server.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpaceError(f"request body: the space file is not UTF-8 text ({e.reason})") from e
    if not text.strip():
        raise SpaceError("request body: empty; send a space file (YAML)")
    checked = checker(text, "request body")
    why = study_name_problem(checked.name)  # the space check refuses it already: kept as a guard
    if why is not None:
        raise SpaceError(f"request body: study: {why} (study={checked.name!r})")
    return checked, text


@router.post(
    "",
    response_model=StudyCreatedPublic,
    status_code=status.HTTP_201_CREATED,
    dependencies=[WriteAccess],
    openapi_extra=_SPACE_BODY,
    responses=error_responses(401, 403, 409, 413, 422, 503),
)
async def create_study(
    request: Request,
    storage: StorageDep,
    settings: SettingsDep,
    spawner: SpawnerDep,
    checker: SpaceCheckerDep,
    start: Annotated[
        bool, Query(description="Also start the study: `dse resume` as a detached process.")
    ] = False,
) -> StudyCreatedPublic:
    """Create a study (state ``created``) from a space file in the body.

    The space is validated like ``dse validate`` does: an error answers 422 with a message
    naming the field. A study of that name answers 409. ``?start=true`` launches
    ``dse resume --study=NAME --storage URL`` in its own session (output in
    ``<runner.workdir>/<study>/controller.log``).
    """
    body = await _read_body(request)
    checked, text = await run_in_threadpool(_space_from_body, body, checker)
    if start and is_ephemeral(settings.storage):
        raise HTTPException(
            status_code=409,
            detail="cannot start a study controller on an in-memory database "
            f"({settings.storage}); serve a file or server database",
        )
    rec = await run_in_threadpool(lambda: storage.create_study(space_yaml=text, **checked.fields))
    launch = None
    if start:
        spawned = await run_in_threadpool(
            lambda: spawner(study=rec.name, storage_url=settings.storage, workdir=checked.workdir)
        )
        launch = LaunchPublic(pid=spawned.pid, command=spawned.command, log_path=spawned.log_path)
    public = await run_in_threadpool(study_public, storage, rec)
    return StudyCreatedPublic(**public.model_dump(), launch=launch)


@router.get("/{name}", response_model=StudyPublic, responses=error_responses(404, 422, 503))
async def get_study(storage: StorageDep, reads: ReadsDep, name: StudyName) -> Response:
    """One study: summary, the space file as given, rejections per kind."""

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        public = study_public(storage, study_of())
        return json_bytes(public.model_dump(mode="json"))

    return _json(await reads.study(name, ("study", name), build))


@router.post(
    "/{name}/stop",
    response_model=StudyPublic,
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=[WriteAccess],
    responses=error_responses(401, 403, 404, 409, 422, 503),
)
def stop_study(storage: StorageDep, study: StudyDep) -> StudyPublic:
    """Ask a running study to stop: its state becomes ``stopping``; the study loop sees it
    within seconds, kills and re-queues its running trials and sets ``stopped``."""
    if study.state not in _STOPPABLE:
        raise HTTPException(
            status_code=409,
            detail=f"study {study.name!r} is not running (state {study.state!r})",
        )
    storage.set_study_state(study.name, "stopping")
    return study_public(storage, storage.get_study(study.name))


@router.get(
    "/{name}/pareto", response_model=ParetoPublic, responses=error_responses(404, 422, 503)
)
async def get_pareto(storage: StorageDep, reads: ReadsDep, name: StudyName) -> Response:
    """TFLOP/s per GPU vs peak memory: every trial (and pre-launch rejection) as a point
    with its kind (``complete``, ``oom``, ``invalid``, ``predicted_oom``, ``error``, ...),
    the non-dominated complete trials flagged ``on_front`` and listed in ``front``."""

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        return json_bytes(pareto_public(storage, study_of()))

    return _json(await reads.study(name, ("pareto", name), build))


@router.get(
    "/{name}/rejections",
    response_model=RejectionsPublic,
    responses=error_responses(404, 422, 503),
)
async def list_rejections(
    storage: StorageDep,
    reads: ReadsDep,
    name: StudyName,
    kind: Annotated[
        str | None,
        Query(max_length=64, description="Only this kind ('invalid', 'predicted_oom')."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Response:
    """Proposals rejected before launch, oldest first: the rule and its reason."""

    def build(study_of: Callable[[], StudyRecord]) -> bytes:
        study = study_of()
        counts = storage.count_rejections(study.id)
        page = storage.list_rejections(study.id, kind=kind, limit=limit, offset=offset)
        total = counts.get(kind, 0) if kind is not None else sum(counts.values())
        public = RejectionsPublic(
            data=[rejection_public(r) for r in page], count=total, counts=counts
        )
        return json_bytes(public.model_dump(mode="json"))

    return _json(await reads.study(name, ("rejections", name, kind, limit, offset), build))


@router.get(
    "/{name}/verify", response_model=VerifyPublic, responses=error_responses(404, 422, 503)
)
def get_verify(storage: StorageDep, study: StudyDep) -> VerifyPublic:
    """The study's last ``dse verify``: the best and the baseline trained longer, a
    checkpoint saved midway and reloaded, the loss drift and the verdict. 404 until
    ``dse verify`` has run for the study."""
    stored = storage.get_study_attrs(study.id).get(VERIFY_ATTR)
    if not stored:
        raise HTTPException(
            status_code=404,
            detail=f"study {study.name!r} has not been verified: run dse verify --study "
            f"{study.name}",
        )
    return VerifyPublic.model_validate(stored)
