"""Engines, the session boundary (error translation, retries) and schema migrations.

SQLite: WAL journal, a busy timeout and foreign keys on every connection; pysqlite's own
transaction handling is switched off so that dse emits ``BEGIN`` itself: ``BEGIN IMMEDIATE``
for write transactions (writers queue on the database lock at the start instead of failing
half-way), a plain deferred ``BEGIN`` for reads (WAL readers never block).

PostgreSQL (``postgresql+psycopg://``; a bare ``postgresql://`` gets the psycopg 3 driver):
READ COMMITTED; writers that must see one another (claiming trial numbers) lock the study
row with ``SELECT ... FOR UPDATE``. Migrations run under a transaction-scoped advisory lock
so that several processes opening a fresh database at once do not race.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import (
    DBAPIError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from dse.core.exceptions import SchemaVersionError, StorageError, StorageURLError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "MIGRATIONS_DIR",
    "SCHEMA_HEAD",
    "SQLITE_BUSY_TIMEOUT_MS",
    "make_engine",
    "normalize_url",
    "alembic_config",
    "head_revision",
    "current_revision",
    "migrate",
    "SessionScope",
    "is_transient",
    "safe_url",
    "sqlite_file",
    "is_ephemeral",
    "has_password",
]

log = logging.getLogger("dse.storage")

#: The newest schema revision (a test checks it is the head of the shipped migrations).
SCHEMA_HEAD = "0006"
#: The Alembic script directory shipped inside the package.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
#: How long a SQLite writer waits for the database lock before giving up (then retried).
SQLITE_BUSY_TIMEOUT_MS = 15_000
#: PostgreSQL advisory-lock key held while migrating ("dse" + "mig" in ASCII).
_PG_MIGRATION_LOCK = 0x6473656D6967
#: Execution option read by the SQLite ``begin`` hook.
_SQLITE_BEGIN = "dse_sqlite_begin"
#: Transient-error retries at the session boundary, with jittered exponential backoff.
MAX_ATTEMPTS = 5
_BACKOFF_S = 0.02

T = TypeVar("T")


def normalize_url(url: str) -> str:
    """The SQLAlchemy URL dse uses: ``postgresql://`` and ``postgres://`` get psycopg 3."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def is_ephemeral(url: str) -> bool:
    """True for an in-memory SQLite URL: that database lives and dies with one process (a
    second process, such as a launched controller, cannot see it). False for a malformed
    URL (it fails when a storage opens it)."""
    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - a malformed URL fails when the storage opens
        return False
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


def backend_name(url: str) -> str | None:
    """The database kind of ``url`` (``sqlite``, ``postgresql``, ...), None for a malformed
    URL (it fails when a storage opens it)."""
    try:
        return str(make_url(url).get_backend_name())
    except Exception:  # noqa: BLE001 - a malformed URL fails when the storage opens
        return None


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL that names one (not in memory, not a ``file:`` URI), else
    None (another backend, or a malformed URL: it fails when a storage opens it)."""
    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - a malformed URL fails when the storage opens
        return None
    db = u.database
    if u.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:"):
        return None
    return db


#: ``scheme://user:password@``: the credentials part of a URL anywhere in a text.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s@/]+@")


def redact_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (``scheme://user:
    ***@host``). A study keeps its space file's text, which every API reader sees and every
    export carries; a ``storage:`` URL in it may name the database password."""
    if "://" not in text:
        return text
    return _URL_PASSWORD.sub(r"\g<head>***@", text)


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password (then it must not travel on a command line)."""
    try:
        return make_url(url).password is not None
    except Exception:  # noqa: BLE001 - an unparsable URL is passed on as given
        return False


def make_engine(url: str, *, pool_size: int | None = None) -> Engine:
    """An engine for ``url`` with dse's connection settings (see the module docstring).

    ``pool_size``: connections kept open (default: SQLAlchemy's 5, plus 10 opened and
    closed again as needed); a server with more worker threads than that keeps one per
    thread instead of opening a connection per request.

    Raises:
        StorageURLError: the URL is malformed or names a driver that is not installed.
    """
    pool: dict[str, Any] = {} if pool_size is None else {"pool_size": pool_size}
    try:
        u = make_url(url)
        backend = u.get_backend_name()
        if backend == "sqlite":
            if is_ephemeral(url):
                engine = create_engine(
                    url,
                    connect_args={"check_same_thread": False},
                    poolclass=StaticPool,
                )
            else:
                engine = create_engine(
                    url,
                    connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
                    **pool,
                )
            _install_sqlite_hooks(engine)
        elif backend == "postgresql":
            engine = create_engine(
                url,
                pool_pre_ping=True,
                connect_args={"connect_timeout": 10},
                **pool,
            )
        else:
            engine = create_engine(url, pool_pre_ping=True)
    except (SQLAlchemyError, ImportError, ValueError) as e:
        raise StorageURLError(f"cannot create a database engine for {safe_url(url)}: {e}") from e
    return engine


def _install_sqlite_hooks(engine: Engine) -> None:
    memory = is_ephemeral(str(engine.url))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # dse emits BEGIN itself (see _on_begin); pysqlite must not.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys = ON")
            if not memory:
                _enable_wal(cur)
                cur.execute("PRAGMA synchronous = NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_SQLITE_BEGIN, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _enable_wal(cur: Any) -> None:
    """Switch the database file to WAL (persistent; a no-op once done).

    SQLite answers "database is locked" at once, without its busy handler, when the journal
    mode is changed while another connection holds a lock (several processes opening a fresh
    database together), so the switch is retried here for up to the busy timeout.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            busy = "locked" in str(e) or "busy" in str(e)
            if not busy or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.25)


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages and display (a malformed URL is shown
    as given)."""
    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - a malformed URL is shown as given
        return url
    return url if u.password is None else u.render_as_string(hide_password=True)


# --- the session boundary ------------------------------------------------------------------


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the whole transaction may succeed.

    SQLite ``database is locked`` / ``busy``; PostgreSQL serialization failures (40001) and
    deadlocks (40P01).
    """
    if isinstance(exc, OperationalError):
        msg = str(exc.orig).lower() if exc.orig is not None else str(exc).lower()
        if (
            "database is locked" in msg
            or "database is busy" in msg
            or "database table is locked" in msg
        ):
            return True
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        if code in ("40001", "40P01"):
            return True
    return False


class SessionScope:
    """Runs units of work in sessions: commit or roll back, translate, retry.

    Every database call of :class:`dse.storage.Storage` goes through :meth:`run`, the one
    place where SQLAlchemy's exceptions become :class:`~dse.core.exceptions.StorageError`.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._factory = sessionmaker(bind=engine, expire_on_commit=False, autoflush=True)

    @contextlib.contextmanager
    def session(self, *, write: bool) -> Iterator[Session]:
        """One transaction; ``write`` takes SQLite's write lock at ``BEGIN``.

        Raises:
            StorageError: any SQLAlchemy error (``from`` the original).
        """
        try:
            with self._factory() as session:
                if self._sqlite and write:
                    session.connection(execution_options={_SQLITE_BEGIN: "IMMEDIATE"})
                yield session
                session.commit()
        except SQLAlchemyError as e:
            raise _Translated(e) from e

    def run(
        self,
        fn: Callable[[Session], T],
        *,
        write: bool,
        retry_integrity: bool = False,
        what: str = "database operation",
    ) -> T:
        """``fn(session)`` in one transaction, retried on transient errors.

        Args:
            fn: the unit of work; it must be safe to run again after a rollback.
            write: whether it writes (SQLite: ``BEGIN IMMEDIATE``).
            retry_integrity: also retry on integrity errors (a racing writer inserted first;
                ``fn`` re-reads and decides again).
            what: what is being done, for the error message.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.session(write=write) as session:
                    return fn(session)
            except _Translated as t:
                e = t.original
                retry = is_transient(e) or (retry_integrity and isinstance(e, IntegrityError))
                if retry and attempt < MAX_ATTEMPTS:
                    delay = _BACKOFF_S * (2 ** (attempt - 1)) * (0.5 + random.random())
                    log.debug(
                        "%s: transient error, retry %d in %.3fs: %s", what, attempt, delay, e
                    )
                    time.sleep(delay)
                    continue
                raise StorageError(f"{what} failed: {_first_line(e)}") from e

    def read(self, fn: Callable[[Connection], T], *, what: str = "database read") -> T:
        """``fn(connection)`` in one read transaction on a plain connection (no ORM session:
        for hot reads of plain rows), retried on transient errors like :meth:`run`."""
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.engine.connect() as conn:
                    return fn(conn)  # leaving rolls the read transaction back
            except SQLAlchemyError as e:
                if is_transient(e) and attempt < MAX_ATTEMPTS:
                    time.sleep(_BACKOFF_S * (2 ** (attempt - 1)) * (0.5 + random.random()))
                    continue
                raise StorageError(f"{what} failed: {_first_line(e)}") from e


class _Translated(Exception):
    """Carries a SQLAlchemy error from :meth:`SessionScope.session` to :meth:`run`."""

    def __init__(self, original: SQLAlchemyError) -> None:
        super().__init__(str(original))
        self.original = original


def _first_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# --- migrations ----------------------------------------------------------------------------
# Alembic is imported only when a database must be migrated (or inspected by tests/tools):
# opening an up-to-date database compares the stamped revision with SCHEMA_HEAD and is done.


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the shipped migrations (no ini file needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest schema revision this dse ships (read from the migration scripts)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"dse migrations must have exactly one head, found {heads}")
    return heads[0]


def current_revision(connection: Connection) -> str | None:
    """The revision stamped in the database (None: never migrated)."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    rows = connection.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    if len(rows) > 1:
        raise StorageError(f"the database has several schema revisions: {[r[0] for r in rows]}")
    return str(rows[0][0]) if rows else None


def migrate(engine: Engine, url: str) -> str:
    """Bring the database to the head revision; returns it.

    A fresh database is created, an older one upgraded. Several processes may call this at
    once: PostgreSQL serializes them on an advisory lock, SQLite on ``BEGIN IMMEDIATE``.

    Raises:
        SchemaVersionError: the database carries a revision this dse does not know (written
            by a newer dse).
        StorageError: the database cannot be reached, is not a dse database (tables but no
            dse revision), or the migration failed.
    """
    try:
        with engine.connect() as conn:
            if current_revision(conn) == SCHEMA_HEAD:
                return SCHEMA_HEAD
    except SQLAlchemyError as e:
        raise StorageError(f"cannot connect to {safe_url(url)}: {_first_line(e)}") from e
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            return _migrate_locked(engine, url)
        except SQLAlchemyError as e:
            if is_transient(e) and attempt < MAX_ATTEMPTS:
                time.sleep(_BACKOFF_S * 2**attempt)
                continue
            raise StorageError(f"migrating {safe_url(url)} failed: {_first_line(e)}") from e
    raise AssertionError("unreachable")  # pragma: no cover


def _migrate_locked(engine: Engine, url: str) -> str:
    from alembic import command
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    head = head_revision()
    with begin_write(engine.connect()) as conn, conn.begin():
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        current = current_revision(conn)
        if current == head:
            return head
        if current is not None and _unknown(script, current):
            raise SchemaVersionError(
                f"the database at {safe_url(url)} has schema revision {current!r}, which this "
                f"dse does not know (its newest is {head!r}): it was written by a newer dse; "
                "upgrade dse to open it"
            )
        if current is None and inspect(conn).has_table("studies"):
            raise StorageError(
                f"the database at {safe_url(url)} has a 'studies' table but no dse schema "
                f"revision (expected {head!r}): not a dse database?"
            )
        log.info("migrating %s: %s -> %s", safe_url(url), current or "empty", head)
        command.upgrade(alembic_config(conn), "head")
    return head


def _unknown(script: ScriptDirectory, revision: str) -> bool:
    try:
        return script.get_revision(revision) is None
    except Exception:  # noqa: BLE001 - alembic raises several kinds for an unknown id
        return True


def begin_write(conn: Connection) -> Connection:
    """``conn`` with SQLite's write lock taken at ``BEGIN`` (other backends: unchanged)."""
    if conn.dialect.name == "sqlite":
        return conn.execution_options(**{_SQLITE_BEGIN: "IMMEDIATE"})
    return conn
