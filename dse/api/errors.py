"""Exception handlers: every error leaves as JSON ``{"detail": message}``.

dse's own errors map to 4xx/503 here (the only place where they become HTTP statuses);
anything else is a bug: logged once with its traceback, answered with a bare JSON 500 on a
connection that stays open (:class:`CatchBugs`).
"""

from __future__ import annotations

import logging
import re
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dse.api.deps import request_is_trusted
from dse.api.schemas import ErrorPublic
from dse.core.exceptions import (
    DSEError,
    DuplicatedStudyError,
    NoCompleteTrialError,
    NoEquivalentError,
    SchemaVersionError,
    SpaceError,
    StorageError,
    StudyFormatError,
    StudyNotFoundError,
    TrialLaunchError,
    TrialNotFoundError,
    WorkloadError,
)

__all__ = [
    "CatchBugs",
    "install_error_handlers",
    "status_of",
    "ERROR_RESPONSES",
    "error_responses",
]

log = logging.getLogger("dse.api")

#: dse errors and their status, narrowest first.
_STATUS: tuple[tuple[type[DSEError], int], ...] = (
    (StudyNotFoundError, 404),
    (NoCompleteTrialError, 404),
    (TrialNotFoundError, 404),
    (DuplicatedStudyError, 409),
    (SchemaVersionError, 503),
    (StorageError, 503),
    (SpaceError, 422),
    (NoEquivalentError, 422),  # ?format= a target that cannot express the best
    (StudyFormatError, 422),
    (WorkloadError, 422),
    (TrialLaunchError, 503),
)

_DESCRIPTIONS = {
    400: "The body cannot be parsed (e.g. bytes that are not JSON text).",
    401: "Missing or wrong bearer token.",
    403: "Write endpoints are disabled (no DSE_API_TOKEN on the server).",
    404: "No such study or trial (or nothing to answer yet).",
    409: "Conflicts with the current state (a study of that name exists, ...).",
    413: "The body is larger than a space file may be.",
    422: "Invalid parameters or body; the message names the field.",
    503: "The study database cannot be reached.",
}

#: OpenAPI ``responses`` for each documented error status.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorPublic, "description": text} for code, text in _DESCRIPTIONS.items()
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of these error statuses."""
    return {c: ERROR_RESPONSES[c] for c in codes}


def status_of(exc: DSEError) -> int:
    """The HTTP status of a dse error (400 for one without a narrower mapping)."""
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            return code
    return 400


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


async def _dse_error(request: Request, exc: Exception) -> JSONResponse:
    code = status_of(cast(DSEError, exc))  # registered for DSEError only
    detail = _message(exc)
    if code >= 500:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        if not request_is_trusted(request):  # the message names the database's host or file
            kind = next((k for k in _UNTRUSTED_503 if isinstance(exc, k)), StorageError)
            detail = _UNTRUSTED_503[kind]
    return JSONResponse({"detail": detail}, status_code=code)


#: What a reader without the token is told of a 5xx dse error (the server log has the rest).
_UNTRUSTED_503: dict[type[DSEError], str] = {
    StorageError: "the study database cannot be reached (the server log says why)",
    SchemaVersionError: "the study database was written by a newer dse (the server log "
    "says which revision)",
    TrialLaunchError: "the study controller cannot be started (the server log says why)",
}


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    # a field name is the client's text: control characters are shown escaped, never echoed
    text = ".".join(str(p) for p in loc) or "request"
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    parts = []
    for err in cast(RequestValidationError, exc).errors():
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{_loc(err.get('loc', ()))}: {msg}")
    return JSONResponse({"detail": "; ".join(parts) or "invalid request"}, status_code=422)


#: FastAPI's answer to a JSON body that its parser gives up on with something other than a
#: syntax error (an integer of more digits than Python converts, nesting past the recursion
#: limit): a bare 400 that says neither what nor where.
_BODY_PARSE_DETAIL = "There was an error parsing the body"


def _body_problem(cause: BaseException | None) -> str:
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "an integer has too many digits"
    return type(cause).__name__ if cause is not None else "cannot be parsed"


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """HTTP errors as FastAPI answers them, except that a 405 lists in ``Allow`` the methods
    of *every* operation on that path (the router lists only those of the first route), and
    a JSON body that cannot be read is a 422 naming the body and why (as a syntax error is)."""
    http = cast(StarletteHTTPException, exc)
    if http.status_code == 400 and http.detail == _BODY_PARSE_DETAIL:
        problem = _body_problem(http.__cause__)
        return JSONResponse({"detail": f"body: not valid JSON ({problem})"}, status_code=422)
    headers = dict(http.headers or {})
    if http.status_code == 405:
        allowed = _allowed_methods(request.app, request.url.path)
        if allowed:
            headers["Allow"] = ", ".join(sorted(allowed))
    return JSONResponse({"detail": http.detail}, status_code=http.status_code, headers=headers)


def _allowed_methods(app: FastAPI, path: str) -> set[str]:
    """The documented methods of ``path`` (from the OpenAPI paths, built once per app)."""
    table: list[tuple[re.Pattern[str], set[str]]] | None = getattr(app.state, "allow_table", None)
    if table is None:
        table = []
        for template, ops in app.openapi().get("paths", {}).items():
            parts = re.split(r"(\{[^}]+\})", template)
            pattern = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
            methods = {m.upper() for m in ops}
            if "GET" in methods:
                methods.add("HEAD")
            table.append((re.compile(f"^{pattern}$"), methods))
        app.state.allow_table = table
    out: set[str] = set()
    for regex, methods in table:
        if regex.match(path):
            out |= methods
    return out


class CatchBugs:
    """ASGI middleware: an unhandled exception (a bug) becomes a JSON 500, logged once.

    Starlette's ``add_exception_handler(Exception, ...)`` answers through its outermost
    middleware and then re-raises, so the server logs the traceback a second time and closes
    the keep-alive connection (the next request a client pools on it gets a reset). Caught
    here, inside that middleware, the 500 is an ordinary response on a connection that stays
    open. An exception after the response has started is re-raised (nothing else can be done).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            log.error(
                "unhandled error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc
            )
            response = JSONResponse({"detail": "internal server error (logged)"}, status_code=500)
            await response(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(DSEError, _dse_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(CatchBugs)
