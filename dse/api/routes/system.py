"""``/health``: liveness and whether the study database answers."""

from __future__ import annotations

from fastapi import APIRouter

from dse import version
from dse.api.deps import ReadsDep, SettingsDep, StorageDep, TrustedDep
from dse.api.errors import error_responses
from dse.api.schemas import HealthPublic

__all__ = ["router"]

router = APIRouter(tags=["system"])


@router.get("/health", response_model=HealthPublic, responses=error_responses(503))
async def health(
    storage: StorageDep, reads: ReadsDep, settings: SettingsDep, trusted: TrustedDep
) -> HealthPublic:
    """200 when the study database answers (503 when it cannot be reached).

    ``storage`` is the database URL (password hidden) for a request with the token, only the
    backend (``sqlite``, ``postgresql``) for others.
    """
    # a round trip that started after this request came (raises StorageError, 503, when the
    # database is down); its worker thread is never taken by other reads, however slow
    await reads.versions.get()
    return HealthPublic(
        status="ok",
        version=version(),
        storage=storage.display_url if trusted else storage.dialect,
        schema_revision=storage.revision,
        writes_enabled=settings.writes_enabled,
        poll_interval_s=settings.poll_interval_s,
    )
