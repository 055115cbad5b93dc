"""Service settings: one pydantic-settings class, read from ``DSE_*`` environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Settings of the REST API and dashboard.

    Every field can be set from the environment with the ``DSE_`` prefix, e.g.
    ``DSE_STORAGE=postgresql+psycopg://dse@db/dse`` and ``DSE_API_TOKEN=...``.
    """

    model_config = SettingsConfigDict(env_prefix="DSE_", env_ignore_empty=True, extra="ignore")

    storage: str = Field(
        "sqlite:///dse.db", description="SQLAlchemy URL of the study database (DSE_STORAGE)."
    )
    api_token: SecretStr | None = Field(
        None,
        description="Bearer token of the write endpoints (DSE_API_TOKEN); unset: writes are "
        "disabled.",
    )
    poll_interval_s: float = Field(
        3.0, gt=0, le=3600, description="How often the dashboard polls a running study."
    )
    validate_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Longest a space file of POST /studies may take to validate (then 422).",
    )
    validate_memory_mib: int = Field(
        1024, ge=128, le=65536, description="Memory limit of the space validation process."
    )

    @property
    def writes_enabled(self) -> bool:
        """Whether the write endpoints accept requests (a non-empty token is configured)."""
        return self.api_token is not None and bool(self.api_token.get_secret_value())
