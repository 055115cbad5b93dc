"""Fixtures of the storage contract suite: one ``storage`` per backend.

Backends: a SQLite file under ``tmp_path``, SQLite in memory, and PostgreSQL on
127.0.0.1:5432 (a database created for this test session and dropped at its end; tests
marked ``postgres``). Without a reachable server the PostgreSQL cases are skipped, except
in CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from dse.storage import Storage, open_storage

PG_SERVER = os.environ.get("DSE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
PG_ADMIN_DB = "postgres"
TABLES = ("trial_steps", "trial_params", "trials", "study_attrs", "rejections", "studies")

BACKENDS = [
    "sqlite-file",
    "sqlite-memory",
    pytest.param("postgresql", marks=pytest.mark.postgres),
]
FILE_BACKENDS = ["sqlite-file", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _admin_engine() -> Engine:
    return create_engine(
        f"{PG_SERVER}/{PG_ADMIN_DB}",
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": 5},
    )


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An AUTOCOMMIT engine on the server's ``postgres`` database (skip/fail if down)."""
    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        engine.dispose()
        msg = f"PostgreSQL is not reachable at {PG_SERVER}: {str(e).splitlines()[0]}"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{msg} (CI is set: the PostgreSQL tests must run)")
        pytest.skip(msg)
    yield engine
    engine.dispose()


class PgDatabases:
    """Creates uniquely named databases and drops them all at the end."""

    def __init__(self, admin: Engine) -> None:
        self.admin = admin
        self.names: list[str] = []

    def create(self) -> str:
        name = f"dse_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self.names.append(name)
        return f"{PG_SERVER}/{name}"

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.names:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_databases(pg_admin: Engine) -> Iterator[PgDatabases]:
    dbs = PgDatabases(pg_admin)
    yield dbs
    dbs.drop_all()


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
