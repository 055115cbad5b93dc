"""The session boundary: transient errors are retried, the rest translated."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from dse.core.exceptions import StorageError
from dse.storage import open_storage
from dse.storage._engine import SessionScope, is_transient, make_engine


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"pg error {sqlstate}")
        self.sqlstate = sqlstate


def test_is_transient() -> None:
    locked = OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    assert is_transient(locked)
    assert is_transient(OperationalError("UPDATE", {}, _PgError("40001")))
    assert is_transient(OperationalError("UPDATE", {}, _PgError("40P01")))
    assert not is_transient(OperationalError("SELECT", {}, _PgError("42P01")))
    assert not is_transient(IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE")))
    assert not is_transient(ValueError("database is locked"))


def test_transient_errors_are_retried() -> None:
    scope = SessionScope(make_engine("sqlite:///:memory:"))
    calls = []

    def flaky(s: Session) -> int:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
        return int(s.execute(text("SELECT 42")).scalar_one())

    assert scope.run(flaky, write=True) == 42
    assert len(calls) == 3


def test_persistent_errors_become_storage_errors() -> None:
    scope = SessionScope(make_engine("sqlite:///:memory:"))
    calls = []

    def broken(s: Session) -> None:
        calls.append(1)
        s.execute(text("SELECT * FROM no_such_table"))

    with pytest.raises(StorageError, match="no such table") as info:
        scope.run(broken, write=False, what="read nothing")
    assert isinstance(info.value.__cause__, OperationalError)
    assert len(calls) == 1
    assert str(info.value).startswith("read nothing failed")


def test_writer_waits_for_a_held_sqlite_lock(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    st = open_storage(f"sqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, other.execute, args=("COMMIT",)).start()
    t0 = time.monotonic()
    s = st.create_study(
        name="s", space_yaml="", space_hash="h", direction="maximize", metric="m",
        model={}, hardware={},
    )  # fmt: skip
    assert time.monotonic() - t0 >= 0.25
    assert st.get_study("s") == s
    other.close()
    st.close()


def test_opening_waits_for_a_lock_held_while_switching_to_wal(tmp_path: Path) -> None:
    # SQLite refuses a journal-mode change at once (no busy handler) while another connection
    # holds a lock: what several processes opening one fresh database together run into
    path = tmp_path / "fresh.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE other_writer (x INTEGER)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO other_writer VALUES (1)")
    threading.Timer(0.3, other.execute, args=("COMMIT",)).start()
    t0 = time.monotonic()
    st = open_storage(f"sqlite:///{path}")
    assert time.monotonic() - t0 >= 0.25  # it waited for the lock instead of failing
    assert st.list_studies() == []
    st.close()
    other.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    check.close()
