"""Service settings: one pydantic-settings class, read from ``DSE_*`` environment variables."""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dse.storage import backend_name

__all__ = ["Settings", "is_loopback", "bind_warnings", "MAX_SERVE_WORKERS"]

#: The most server processes ``dse serve --workers`` starts.
MAX_SERVE_WORKERS = 64
#: Read threads when ``DSE_READ_THREADS`` is unset, on SQLite and on a database server
#: (docs/BENCHMARKS.md, section 20).
SQLITE_READ_THREADS = 2
SERVER_READ_THREADS = 8


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
    protect_reads: bool = Field(
        False,
        description="Reads need the token too (DSE_PROTECT_READS); needs DSE_API_TOKEN.",
    )
    public_reads: bool = Field(
        False,
        description="`dse serve` off the loopback interface without a token: reads are "
        "public on purpose (DSE_PUBLIC_READS).",
    )
    read_cache_mib: int = Field(
        64,
        ge=0,
        le=65536,
        description="Memory for answers of the read endpoints kept until their study changes "
        "(DSE_READ_CACHE_MIB; every write moves the study's version, so a kept answer is "
        "never older than the last write; 0: none kept).",
    )
    read_threads: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Worker threads that build read answers at once (DSE_READ_THREADS; more "
        "requests wait on the event loop, not in threads). Unset: "
        f"{SQLITE_READ_THREADS} on SQLite, whose reads are CPU work in the server's own "
        "process (more threads only pass the interpreter lock between cores), "
        f"{SERVER_READ_THREADS} on a database server, whose reads wait on it.",
    )
    serve_workers: int = Field(
        1,
        ge=1,
        le=MAX_SERVE_WORKERS,
        description="Server processes of `dse serve` answering on its port "
        "(DSE_SERVE_WORKERS; `--workers` wins): more use more CPU cores under many readers.",
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

    @model_validator(mode="after")
    def _reads_need_a_token(self) -> Settings:
        if self.protect_reads and not self.writes_enabled:
            raise ValueError("DSE_PROTECT_READS needs a token: set DSE_API_TOKEN as well")
        return self

    @property
    def writes_enabled(self) -> bool:
        """Whether the write endpoints accept requests (a non-empty token is configured)."""
        return self.api_token is not None and bool(self.api_token.get_secret_value())

    @property
    def effective_read_threads(self) -> int:
        """``read_threads``, or where unset the default of the storage's database kind."""
        if self.read_threads is not None:
            return self.read_threads
        return (
            SQLITE_READ_THREADS if backend_name(self.storage) == "sqlite" else SERVER_READ_THREADS
        )


#: The shortest API token ``dse serve`` accepts off the loopback interface (a guessable token
#: there hands out code execution: a write starts trial processes).
MIN_PUBLIC_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def bind_warnings(host: str, settings: Settings, *, public_reads: bool) -> list[str]:
    """What ``dse serve --host HOST`` must warn about; raises when it must not start.

    Off the loopback interface, a token shorter than :data:`MIN_PUBLIC_TOKEN_CHARS` is
    refused; a server without a token (every read open, writes disabled)
    starts only when ``public_reads`` says so; one with a token but open reads warns that
    anyone who reaches the port reads every study.

    Raises:
        ValueError: a non-loopback bind without a token and without ``public_reads``, or
            with a short token.
    """
    if is_loopback(host):
        return []
    if settings.api_token is not None and settings.writes_enabled:
        n = len(settings.api_token.get_secret_value().strip())
        if n < MIN_PUBLIC_TOKEN_CHARS:
            raise ValueError(
                f"refusing to serve on {host}: DSE_API_TOKEN has {n} characters; a token "
                f"that anyone who reaches the port may write with (a write runs code) needs "
                f'at least {MIN_PUBLIC_TOKEN_CHARS}: generate one with python -c "import '
                'secrets; print(secrets.token_urlsafe(32))"'
            )
    if not settings.writes_enabled and not public_reads:
        raise ValueError(
            f"refusing to serve on {host}: without DSE_API_TOKEN every study is readable by "
            "anyone who reaches the port; set DSE_API_TOKEN (and DSE_PROTECT_READS=1 to "
            "protect reads), or pass --public-reads to serve reads to everyone on purpose"
        )
    if settings.protect_reads:
        return [
            f"serving on {host}: reads and writes need the token; the token travels in "
            "clear text unless a TLS proxy is in front"
        ]
    return [
        f"serving on {host}: reads are public (anyone who reaches the port sees every study, "
        "trial and space file); set DSE_PROTECT_READS=1 to require the token for reads, and "
        "put a TLS proxy in front"
    ]
