"""Migrations: applied on open, matching the models, refusing a newer schema."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from dse.core.exceptions import SchemaVersionError, StorageError
from dse.storage import head_revision, open_storage
from dse.storage._engine import MIGRATIONS_DIR, SCHEMA_HEAD, alembic_config
from dse.storage._models import Base


def test_migrations_are_shipped_in_the_package() -> None:
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "script.py.mako").is_file()
    assert (MIGRATIONS_DIR / "alembic.ini").is_file()
    script = ScriptDirectory.from_config(alembic_config())
    assert script.get_heads() == [head_revision()]
    # the fast path of open_storage (no Alembic import) compares with this constant
    assert head_revision() == SCHEMA_HEAD
    for rev in script.walk_revisions():
        assert Path(rev.path).parent == MIGRATIONS_DIR / "versions"


def test_migrations_match_the_models(fresh_url: str) -> None:
    storage = open_storage(fresh_url)
    try:
        with storage._engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == []
    finally:
        storage.close()


def test_downgrade_to_base_then_reopen_upgrades(fresh_url: str) -> None:
    storage = open_storage(fresh_url)
    with storage._engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    with storage._engine.connect() as conn:
        assert "studies" not in inspect(conn).get_table_names()
    storage.close()
    again = open_storage(fresh_url)  # an older (here: empty) schema is upgraded
    try:
        assert again.revision == head_revision()
        assert again.list_studies() == []
    finally:
        again.close()


def test_reopen_keeps_data(fresh_url: str) -> None:
    with open_storage(fresh_url) as st:
        st.create_study(
            name="s", space_yaml="", space_hash="h", direction="maximize", metric="m",
            model={}, hardware={},
        )  # fmt: skip
    with open_storage(fresh_url) as st:
        assert [s.name for s in st.list_studies()] == ["s"]


def test_newer_schema_is_refused(fresh_url: str) -> None:
    open_storage(fresh_url).close()
    engine = create_engine(fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    engine.dispose()
    with pytest.raises(SchemaVersionError) as info:
        open_storage(fresh_url)
    msg = str(info.value)
    assert "9999_from_the_future" in msg and repr(head_revision()) in msg
    assert "newer dse" in msg


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE studies (id INTEGER PRIMARY KEY)")
    with pytest.raises(StorageError, match="not a dse database"):
        open_storage(f"sqlite:///{path}")


def test_sqlite_settings_and_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_storage("sqlite:///runs/nested/studies.db") as st:
        assert (tmp_path / "runs" / "nested" / "studies.db").is_file()
        with st._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://postgres@127.0.0.1:1/nope",  # nothing listens on port 1
        "postgresql://dse:s3cret@127.0.0.1:1/nope",  # psycopg 3 for a bare scheme
        "nosuchbackend://x/y",
        "not a url",
    ],
)
def test_unreachable_or_bad_url_is_a_storage_error(url: str) -> None:
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert not type(info.value).__module__.startswith("sqlalchemy")
    if ":1/" in url:
        assert "cannot connect to" in str(info.value)
    assert "s3cret" not in str(info.value)  # passwords never reach messages


def _dse_imports(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dse":
            out.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dse"]
    return out


def test_migrations_import_no_live_code() -> None:
    """A revision must do tomorrow what it did when it was written: it imports nothing of dse
    (what it needs is copied into it). The environment imports the live models only for
    ``alembic revision --autogenerate`` (inside ``_target_metadata``), never on dse's own
    upgrade."""
    revisions = sorted((MIGRATIONS_DIR / "versions").glob("*.py"))
    assert len(revisions) >= 6
    for path in revisions:
        assert _dse_imports(ast.parse(path.read_text())) == [], path.name
    env = ast.parse((MIGRATIONS_DIR / "env.py").read_text())
    allowed = next(
        n for n in env.body if isinstance(n, ast.FunctionDef) and n.name == "_target_metadata"
    )
    assert [m for _, m in _dse_imports(allowed)] == ["dse.storage._models"]
    assert len(_dse_imports(env)) == 1
