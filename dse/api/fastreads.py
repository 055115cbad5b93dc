"""The two reads a dashboard polls most, answered without FastAPI's routing.

``GET /api/v1/studies/{name}/best`` (JSON) and ``GET /api/v1/studies/{name}/trials`` are
what every open dashboard polls, and a request that finds its answer kept
(:mod:`dse.api.readcache`) spent most of its time in FastAPI: matching the path against
every route, solving the dependencies, validating the query parameters. :class:`FastReads`,
an ASGI middleware, answers those requests itself when they are plain: no
``Authorization`` header (the answer of a reader without the token), reads not protected
(``DSE_PROTECT_READS``), only known query parameters, each once, with values the route
accepts, written without escapes. It calls the same answer functions as the routes
(:func:`dse.api.routes.best.best_answer`, :func:`dse.api.routes.trials.trial_page_answer`)
and sends the same status, headers and bytes.

Anything else, and any request whose answer fails (no such study, no best yet, the
database down), goes on to the app, which validates, answers or explains as always (an
error is never kept, so the app builds it again).
"""

from __future__ import annotations

from typing import Any, get_args

from starlette.types import ASGIApp, Receive, Scope, Send

from dse.api.deps import Reads, StorageHolder
from dse.api.routes.best import best_answer
from dse.api.routes.trials import MAX_INT, PAGE_LIMIT_MAX, trial_page_answer
from dse.api.schemas import TrialOrder
from dse.core.records import TRIAL_STATES

__all__ = ["FastReads"]

_ORDERS = frozenset(get_args(TrialOrder))
_STATES = frozenset(TRIAL_STATES)
_JSON_HEADERS = b"application/json"


class FastReads:
    """ASGI middleware (see the module doc). ``owner``: the app whose ``state`` holds the
    settings, the storage and the reads; ``prefix``: where the API is mounted."""

    def __init__(self, app: ASGIApp, *, owner: Any, prefix: str) -> None:
        self.app = app
        self.owner = owner
        self._studies = prefix + "/studies/"
        self.answered = 0  # requests answered here (for tests and benchmarks)
        owner.state.fast_reads = self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            body = await self._answer(scope)
            if body is not None:
                self.answered += 1
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            (b"content-length", str(len(body)).encode()),
                            (b"content-type", _JSON_HEADERS),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope: Scope) -> bytes | None:
        """The body for a plain request of the two reads, or None (the app answers)."""
        path: str = scope["path"]
        if not path.startswith(self._studies) or scope.get("root_path"):
            return None
        name, _, what = path[len(self._studies) :].rpartition("/")
        if not name or len(name) > 255 or "/" in name or what not in ("best", "trials"):
            return None
        state = self.owner.state
        if state.settings.protect_reads:
            return None
        for key, _ in scope["headers"]:
            if key == b"authorization":
                return None
        storage = state.storage.peek() if isinstance(state.storage, StorageHolder) else None
        if storage is None:  # not open yet: the app opens it (or answers 503)
            return None
        reads: Reads = state.reads
        query: bytes = scope["query_string"]
        try:
            if what == "best":
                if query not in (b"", b"format=json"):
                    return None
                return await best_answer(reads, storage, name, "json")
            params = _page_params(query)
            if params is None:
                return None
            return await trial_page_answer(reads, storage, name, trusted=False, **params)
        except Exception:  # noqa: BLE001 - the app answers it (404, 409, 503, ...)
            return None


def _page_params(query: bytes) -> dict[str, Any] | None:
    """``state``, ``limit``, ``offset`` and ``order`` of a trial page's query string, with
    the route's defaults, or None unless every parameter is known, given once, written
    plainly (no escapes) and valid."""
    out: dict[str, Any] = {"state": None, "limit": 100, "offset": 0, "order": "number"}
    if not query:
        return out
    seen: set[str] = set()
    for part in query.split(b"&"):
        key_b, eq, value_b = part.partition(b"=")
        if not eq or b"%" in part or b"+" in part:
            return None
        key, value = key_b.decode("latin-1"), value_b.decode("latin-1")
        if key in seen:
            return None
        seen.add(key)
        if key in ("limit", "offset"):
            if not value.isdigit() or not value.isascii() or len(value) > 10:
                return None
            n = int(value)
            if not (1 <= n <= PAGE_LIMIT_MAX if key == "limit" else n <= MAX_INT):
                return None
            out[key] = n
        elif key == "order" and value in _ORDERS:
            out[key] = value
        elif key == "state" and value in _STATES:
            out[key] = value
        else:
            return None
    return out
