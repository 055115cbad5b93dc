"""Fixtures of the API tests: seeded study databases on every backend, clients of the real app.

Backends: a SQLite file and a PostgreSQL database on 127.0.0.1:5432 (one uniquely named
database per session, dropped at its end; tests marked ``postgres``). Without a reachable
server the PostgreSQL cases are skipped, except in CI (``CI`` set), where that is a failure.

Browser tests: ``browser`` (headless Chromium, one per module) and ``page`` (a fresh page per test
in a context made with ``context_args``, which a module overrides for another viewport or
permissions).
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dse.api import Settings, create_app
from tests.api.live import TIMEOUT_MS, chromium
from tests.api.seed import Seeded, seed_all, seed_database
from tests.conftest import PgDatabases

with warnings.catch_warnings():
    # starlette prefers httpx2; with plain httpx its TestClient only warns
    warnings.filterwarnings("ignore", message=r".*httpx2.*")
    from starlette.testclient import TestClient

__all__ = ["TestClient", "TOKEN", "make_client"]

TOKEN = "test-token-" + uuid.uuid4().hex[:8]
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def new_url(backend: str, request: pytest.FixtureRequest, folder: Path) -> str:
    """An empty database of that backend."""
    if backend == "postgresql":
        dbs: PgDatabases = request.getfixturevalue("pg_databases")
        return dbs.create()
    return f"sqlite:///{folder / ('dse-' + uuid.uuid4().hex[:8] + '.db')}"


def make_client(url: str, *, token: str | None = TOKEN, **kw: Any) -> TestClient:
    """A client of the real app on ``url`` (enter it with ``with``)."""
    settings = Settings(storage=url, api_token=token, poll_interval_s=1.0)
    return TestClient(create_app(settings=settings), **kw)


@pytest.fixture(scope="module", params=BACKENDS)
def seeded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Seeded]]:
    """A database seeded through the storage API (read-only for the tests): its URL and
    what is in it."""
    url = new_url(request.param, request, tmp_path_factory.mktemp("seeded"))
    return url, seed_database(url, seed_all)


@pytest.fixture(scope="module")
def client(seeded: tuple[str, dict[str, Seeded]]) -> Iterator[TestClient]:
    """A client of the app on the seeded database (write endpoints enabled)."""
    with make_client(seeded[0]) as c:
        yield c


@pytest.fixture(scope="module")
def seeds(seeded: tuple[str, dict[str, Seeded]]) -> dict[str, Seeded]:
    return seeded[1]


@pytest.fixture(params=BACKENDS)
def writable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database per test, for the write endpoints."""
    return new_url(request.param, request, tmp_path)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for the module's tests."""
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def context_args() -> dict[str, Any]:
    """Options of the browser context of ``page`` (override in a module)."""
    return {"viewport": {"width": 1280, "height": 900}}


@pytest.fixture
def page(browser: Any, context_args: dict[str, Any]) -> Iterator[Any]:
    """A page in a new context that keeps console and page errors in ``page.errors`` and the
    URL of every request in ``page.urls``. Playwright evaluates a string predicate
    (``wait_for_function``) with ``eval`` in the page, which the dashboard's content security
    policy forbids: these contexts bypass the policy (``bypass_csp``) unless ``context_args``
    says otherwise; tests/api/test_security_headers.py draws the dashboard under it."""
    context = browser.new_context(**{"bypass_csp": True, **context_args})
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.errors = []
    pg.urls = []
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("request", lambda r: pg.urls.append(r.url))
    try:
        yield pg
    finally:
        context.close()
