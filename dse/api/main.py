"""The app factory: REST API under ``/api/v1``, dashboard at ``/``, assets under ``/static``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from dse import version
from dse.api.config import Settings
from dse.api.deps import Reads, SpaceChecker, StorageHolder
from dse.api.errors import install_error_handlers
from dse.api.fastreads import FastReads
from dse.api.routes import api_router
from dse.api.security import SecurityHeaders
from dse.api.spawn import SubprocessSpawner
from dse.core.exceptions import StorageError

__all__ = ["create_app", "API_PREFIX", "STATIC_DIR"]

log = logging.getLogger("dse.api")

API_PREFIX = "/api/v1"
#: Dashboard assets shipped with the package (HTML, JS, CSS; no build step).
STATIC_DIR = Path(__file__).resolve().parent / "static"


def _import_heavy_reads() -> None:
    """Import what the heavy reads (insights: Optuna's importance) use."""
    import optuna.importance  # noqa: F401


def create_app(storage_url: str | None = None, settings: Settings | None = None) -> FastAPI:
    """Build the app.

    Args:
        storage_url: the study database (overrides ``settings.storage`` / ``DSE_STORAGE``).
        settings: service settings (default: read from ``DSE_*`` environment variables).

    The database is opened on first use and closed at shutdown; while it cannot be reached
    the API answers 503 and ``/api/v1/health`` says why.
    """
    settings = settings or Settings()
    if storage_url:
        settings = settings.model_copy(update={"storage": storage_url})
    # a connection per read thread, the version reads' and a few for the other routes
    holder = StorageHolder(settings.storage, pool_size=settings.effective_read_threads + 4)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            holder.get()
        except StorageError as e:  # keep serving: requests answer 503 until it is back
            log.warning("the study database is not available yet: %s", e)
        app.state.reads.answers.warm_heavy(_import_heavy_reads)
        yield
        holder.close()

    app = FastAPI(
        title="dse",
        summary="Design-space exploration of Megatron-Core training recipes",
        description="Studies, trials, best configurations (Megatron-LM, Megatron-Bridge, "
        "NeMo-Run), Pareto fronts and pre-launch rejections. Errors are "
        '`{"detail": message}`. Write endpoints need `Authorization: Bearer <DSE_API_TOKEN>` '
        "and are disabled (403) when the server has no token.",
        version=version(),
        lifespan=lifespan,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.storage = holder
    app.state.spawner = SubprocessSpawner()
    app.state.reads = Reads(
        holder, threads=settings.effective_read_threads, cache_mib=settings.read_cache_mib
    )
    app.state.space_checker = SpaceChecker(
        settings.validate_timeout_s, settings.validate_memory_mib
    )
    install_error_handlers(app)
    # outermost: the plain polls of a best or a trial page skip FastAPI's routing
    app.add_middleware(FastReads, owner=app, prefix=API_PREFIX)
    # outermost of all: every answer (fast reads and errors included) carries the headers
    app.add_middleware(SecurityHeaders, api_prefix=API_PREFIX, docs_prefix=f"{API_PREFIX}/docs")
    app.include_router(api_router, prefix=API_PREFIX)

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
