"""Fixtures of the storage contract suite: one ``storage`` per backend.

Backends: a SQLite file under ``tmp_path``, SQLite in memory, and PostgreSQL on
127.0.0.1:5432 (a database created for this test session and dropped at its end; tests
marked ``postgres``). Without a reachable server the PostgreSQL cases are skipped, except
in CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from dse.storage import Storage, open_storage
from tests.conftest import PgDatabases  # noqa: F401 - shared PostgreSQL fixtures

TABLES = ("trial_steps", "trial_params", "trials", "study_attrs", "rejections", "studies")

BACKENDS = [
    "sqlite-file",
    "sqlite-memory",
    pytest.param("postgresql", marks=pytest.mark.postgres),
]
FILE_BACKENDS = ["sqlite-file", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def pg_session_url(pg_databases: PgDatabases) -> str:
    """One PostgreSQL database for the contract suite (emptied between tests)."""
    return pg_databases.create()


@pytest.fixture(params=BACKENDS)
def storage_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A URL of an empty study database of each backend."""
    if request.param == "sqlite-file":
        return f"sqlite:///{tmp_path_factory.mktemp('db') / 'studies.db'}"
    if request.param == "sqlite-memory":
        return "sqlite:///:memory:"
    url: str = request.getfixturevalue("pg_session_url")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            exists = conn.execute(text("SELECT to_regclass('public.studies')")).scalar()
            if exists:
                conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()
    return url


@pytest.fixture
def storage(storage_url: str) -> Iterator[Storage]:
    """An open storage on an empty database of each backend."""
    st = open_storage(storage_url)
    yield st
    st.close()


@pytest.fixture(scope="session")
def pg_scratch_url(pg_databases: PgDatabases) -> str:
    """One PostgreSQL database for tests that need an empty one (reset before each)."""
    return pg_databases.create()


def reset_pg_database(url: str) -> None:
    """Make ``url``'s database empty again (cheaper than a new database per test)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


@pytest.fixture
def fresh_pg_url(pg_scratch_url: str) -> str:
    """An empty PostgreSQL database (nothing else uses it during the test)."""
    reset_pg_database(pg_scratch_url)
    return pg_scratch_url


@pytest.fixture(params=FILE_BACKENDS)
def fresh_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """A URL of a brand-new database that outlives one ``Storage`` (not in memory)."""
    if request.param == "sqlite-file":
        return f"sqlite:///{os.path.join(tmp_path, 'fresh.db')}"
    url: str = request.getfixturevalue("fresh_pg_url")
    return url
