"""``/health``: liveness and whether the study database answers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter
from sqlalchemy.engine import make_url

from dse import DISTRIBUTION
from dse.api.deps import SettingsDep, StorageDep, TrustedDep
from dse.api.errors import error_responses
from dse.api.schemas import HealthPublic

__all__ = ["router"]

router = APIRouter(tags=["system"])


def _version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


@router.get("/health", response_model=HealthPublic, responses=error_responses(503))
def health(storage: StorageDep, settings: SettingsDep, trusted: TrustedDep) -> HealthPublic:
    """200 when the study database answers (503 when it cannot be reached).

    ``storage`` is the database URL (password hidden) for a request with the token, only the
    backend (``sqlite``, ``postgresql``) for others.
    """
    storage.list_studies()  # a round trip: raises StorageError (503) when down
    url = make_url(storage.url)
    return HealthPublic(
        status="ok",
        version=_version(),
        storage=url.render_as_string(hide_password=True) if trusted else url.get_backend_name(),
        schema_revision=storage.revision,
        writes_enabled=settings.writes_enabled,
        poll_interval_s=settings.poll_interval_s,
    )
