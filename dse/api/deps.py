"""Dependencies of the routes, as ``Annotated`` aliases (routes list only the aliases)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Hashable
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from dse.api.config import Settings
from dse.api.readcache import ReadCache, RowFragments, StudyVersions, VersionMemo, Versions
from dse.api.spawn import Spawner
from dse.core.exceptions import StudyNotFoundError
from dse.core.records import StudyRecord
from dse.model.space_check import CheckedSpace, check_space_text
from dse.storage import Storage, open_storage

__all__ = [
    "StorageHolder",
    "SettingsDep",
    "StorageDep",
    "StudyDep",
    "SpawnerDep",
    "Reads",
    "ReadsDep",
    "StudyName",
    "SpaceChecker",
    "SpaceCheckerDep",
    "WriteAccess",
    "ReadAccess",
    "TrustedDep",
    "read_access",
    "is_trusted",
    "request_is_trusted",
    "get_settings",
    "get_storage",
    "get_study",
    "get_spawner",
    "require_token",
]


class StorageHolder:
    """Opens the study database on first use (so the app starts while it is down) and
    closes it at shutdown. Thread-safe: sync routes run in a thread pool."""

    def __init__(self, url: str, *, pool_size: int | None = None) -> None:
        self.url = url
        self.pool_size = pool_size
        self._storage: Storage | None = None
        self._lock = threading.Lock()

    def get(self) -> Storage:
        """The open storage.

        Raises:
            StorageError: the database cannot be reached or migrated (answered with 503).
        """
        storage = self._storage
        if storage is not None:
            return storage
        with self._lock:
            if self._storage is None:
                self._storage = open_storage(self.url, pool_size=self.pool_size)
            return self._storage

    def peek(self) -> Storage | None:
        """The storage if it is open (never blocks)."""
        return self._storage

    def close(self) -> None:
        with self._lock:
            if self._storage is not None:
                self._storage.close()
                self._storage = None


# Dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency in
# the thread pool, a hop per request that costs more than the work under load.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_storage(request: Request) -> Storage:
    holder: StorageHolder = request.app.state.storage
    storage = holder.peek()
    if storage is not None:
        return storage
    return await run_in_threadpool(holder.get)  # opening it may wait on the network


StorageDep = Annotated[Storage, Depends(get_storage)]


#: The ``{name}`` path parameter of a study.
StudyName = Annotated[str, Path(min_length=1, max_length=255, description="Study name.")]


def get_study(storage: StorageDep, name: StudyName) -> StudyRecord:
    """The study named in the path (404 when there is none)."""
    if any(ord(c) < 32 for c in name):  # never a stored name; PostgreSQL refuses NUL
        raise StudyNotFoundError(f"no study named {name!r}")
    return storage.get_study(name)


StudyDep = Annotated[StudyRecord, Depends(get_study)]


async def get_spawner(request: Request) -> Spawner:
    spawner: Spawner = request.app.state.spawner
    return spawner


SpawnerDep = Annotated[Spawner, Depends(get_spawner)]


class Reads:
    """The reads of an app (:mod:`dse.api.readcache`): every study's version, read fresh for
    each request, and the answers kept per version. Database work runs in worker threads
    (``threads`` builds at once); answers are kept up to ``cache_mib`` MiB, and the rows of
    trial pages (serialized, while the trial does not change) up to as much again (0: none
    kept, concurrent requests for one answer still share its build)."""

    def __init__(self, holder: StorageHolder, *, threads: int, cache_mib: int) -> None:
        self._holder = holder
        self.versions = StudyVersions(lambda: holder.get().study_change_counters())
        self.shared = VersionMemo()
        self.answers = ReadCache(builders=threads, max_bytes=cache_mib * 1024 * 1024)
        self.fragments = RowFragments(max_bytes=cache_mib * 1024 * 1024)

    async def study(
        self,
        name: str,
        key: Hashable,
        build: Callable[[Callable[[], StudyRecord]], bytes],
        *,
        best: bool = False,
        heavy: bool = False,
    ) -> bytes:
        """An answer about study ``name``, reused while its version does not move (built,
        and not kept, when there is no such study: the build raises the 404). ``best``: an
        answer that only the study's best can change (its best trial and figures), reused
        while ``best_version`` does not move (writes that queue or start trials leave it).
        ``heavy``: an answer that reads a whole study (insights, timeline), built in the
        heavy builds' own thread (:class:`dse.api.readcache.ReadCache`).

        ``build(study)`` gets a function that returns the study's record (shared by the
        builds of one version; raises the 404).
        """
        versions = await self.versions.get()
        counters = versions.get(name)
        version = None if counters is None else (counters[0], counters[1])
        answer: Hashable = version
        if best and counters is not None:
            answer = (counters[0], "best", counters[2])

        def study() -> StudyRecord:
            return self.shared.get(
                ("study", name), version, lambda: get_study(self._holder.get(), name)
            )

        return await self.answers.get(key, answer, lambda: build(study), heavy=heavy)

    def counts(self, study: StudyRecord) -> dict[str, int]:
        """The study's trial counts per state (shared by the pages of one version)."""
        storage = self._holder.get()
        return self.shared.get(
            ("counts", study.id), study.version, lambda: storage.count_trials(study.id)
        )

    async def every_study(
        self, key: Hashable, build: Callable[[], bytes], *, best: bool = False
    ) -> bytes:
        """An answer about every study (the list, the best across studies), reused while no
        study is added, removed or changed (``best``: while no study is added or removed
        and no study's best can have changed, see :meth:`study`)."""
        versions = await self.versions.get()
        return await self.answers.get(key, _snapshot(versions, best), build)


def _snapshot(versions: Versions, best: bool) -> tuple[tuple[str, int, int], ...]:
    """Every study's name, id and version (``best``: its best_version)."""
    return tuple(sorted((name, c[0], c[2] if best else c[1]) for name, c in versions.items()))


async def get_reads(request: Request) -> Reads:
    reads: Reads = request.app.state.reads
    return reads


ReadsDep = Annotated[Reads, Depends(get_reads)]


class SpaceChecker:
    """Validates space files of ``POST /studies`` in child processes (at most ``parallel``
    at once; more wait), each bounded by ``timeout_s`` and ``memory_mib``
    (:func:`dse.model.space_check.check_space_text`). Called from worker threads."""

    def __init__(
        self,
        timeout_s: float,
        memory_mib: int,
        *,
        parallel: int = 2,
        target: str = "dse.model.space_check:validate",
    ) -> None:
        self.timeout_s = timeout_s
        self.memory_mib = memory_mib
        self.target = target
        self._slots = threading.BoundedSemaphore(parallel)

    def __call__(self, text: str, source: str) -> CheckedSpace:
        with self._slots:
            return check_space_text(
                text,
                source,
                timeout_s=self.timeout_s,
                memory_mib=self.memory_mib,
                target=self.target,
            )


async def get_space_checker(request: Request) -> SpaceChecker:
    checker: SpaceChecker = request.app.state.space_checker
    return checker


SpaceCheckerDep = Annotated[SpaceChecker, Depends(get_space_checker)]

_bearer = HTTPBearer(auto_error=False, description="DSE_API_TOKEN of the server.")


def _token_ok(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> bool:
    if not settings.writes_enabled or settings.api_token is None or credentials is None:
        return False
    if credentials.scheme.lower() != "bearer":
        return False
    expected = settings.api_token.get_secret_value().encode()
    return secrets.compare_digest(credentials.credentials.encode(), expected)


async def is_trusted(request: Request) -> bool:
    """Whether the request carries the server's token: a trusted reader also sees where
    trials ran (hosts, log and metrics paths) and the database URL. (The header is read
    directly: for reads the token is optional, which OpenAPI's security schemes cannot say.)"""
    return request_is_trusted(request)


def request_is_trusted(request: Request) -> bool:
    """:func:`is_trusted` outside dependency injection (exception handlers)."""
    settings: Settings = request.app.state.settings
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    creds = (
        HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip()) if token else None
    )
    return _token_ok(settings, creds)


TrustedDep = Annotated[bool, Depends(is_trusted)]


async def read_access(settings: SettingsDep, trusted: TrustedDep) -> None:
    """Read access: 401 when the server protects reads (``DSE_PROTECT_READS``) and the token
    is missing or wrong; open otherwise."""
    if settings.protect_reads and not trusted:
        raise HTTPException(
            status_code=401,
            detail="this server protects reads: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


ReadAccess = Depends(read_access)


def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Write access: ``Authorization: Bearer <DSE_API_TOKEN>``.

    403 when the server has no token (writes disabled), 401 when the header is missing or
    the token is wrong.
    """
    if not settings.writes_enabled or settings.api_token is None:
        raise HTTPException(
            status_code=403,
            detail="write endpoints are disabled: the server has no API token "
            "(set DSE_API_TOKEN and restart it)",
        )
    expected = settings.api_token.get_secret_value().encode()
    given = (credentials.credentials if credentials is not None else "").encode()
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            status_code=401,
            detail="this endpoint needs 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(given, expected):
        raise HTTPException(
            status_code=401,
            detail="invalid API token",
            headers={"WWW-Authenticate": "Bearer"},
        )


WriteAccess = Depends(require_token)
