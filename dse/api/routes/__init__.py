"""One router per resource; :data:`api_router` aggregates those under ``/api/v1``."""

from __future__ import annotations

from fastapi import APIRouter

from dse.api.deps import ReadAccess
from dse.api.routes import best, compare, insights, studies, system, trials

__all__ = ["api_router"]

api_router = APIRouter()
api_router.include_router(system.router)  # /health: open (liveness), details for the token
api_router.include_router(studies.router, dependencies=[ReadAccess])
api_router.include_router(trials.router, dependencies=[ReadAccess])
api_router.include_router(best.router, dependencies=[ReadAccess])
api_router.include_router(insights.router, dependencies=[ReadAccess])
api_router.include_router(compare.router, dependencies=[ReadAccess])
