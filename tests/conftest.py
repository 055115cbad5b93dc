"""Shared fixtures: paths of the repository and of the measured table it ships."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

# Property-based tests (fuzz) draw the same examples on every CI run: a failure there is
# reproducible, and a passing run does not depend on luck. Locally they explore at random.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
REPLAY_TABLE = EXAMPLES / "tables" / "h200_llama1b_unfused_1gpu.jsonl"
#: Excerpts of real training and trial logs, each naming its source in its header lines.
LOGS = REPO / "tests" / "fixtures" / "logs"
#: The measured H200 table (shipped in examples/tables/, so the tests never skip for it).
SHARED_TABLE = REPLAY_TABLE
PG_SERVER = os.environ.get("DSE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
PG_ADMIN_DB = "postgres"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def shared_table() -> Path:
    """The measured H200 table (examples/tables/); a missing file is an error, not a skip."""
    assert SHARED_TABLE.exists(), f"measured table missing: {SHARED_TABLE}"
    return SHARED_TABLE


#: A small dense model for the agent and proposer tests (no training: shapes only).
SMALL_MODEL: dict[str, Any] = {
    "num_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "ffn_hidden_size": 512,
    "vocab_size": 1024,
}


def small_space(study: str, knobs: dict[str, Any], world_size: int = 1, **extra: Any) -> Any:
    """A parsed space over :data:`SMALL_MODEL` (GBS 8, sequence 128, 80 GiB GPUs), ``extra``
    replacing top-level fields."""
    from dse.space import parse_space

    data: dict[str, Any] = {
        "study": study,
        "model": dict(SMALL_MODEL),
        "semantics": {"global_batch_size": 8, "seq_length": 128},
        "resources": {"world_size": world_size, "gpu_memory_gib": 80.0, "features": []},
        "knobs": knobs,
    }
    data.update(extra)
    return parse_space(data)


@pytest.fixture
def tiny_space_dict() -> dict:
    return {
        "study": "t",
        "model": {
            "num_layers": 4,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_query_groups": 2,
            "ffn_hidden_size": 128,
            "vocab_size": 1024,
        },
        "semantics": {"global_batch_size": 8, "seq_length": 64, "steps": 4, "warmup_steps": 1},
        "resources": {"world_size": 2, "device": "cpu", "features": []},
        "knobs": {
            "tensor_model_parallel_size": {"values": [1, 2]},
            "micro_batch_size": {"values": [1, 2, 4]},
            "use_distributed_optimizer": {"type": "bool"},
        },
    }


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


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> str:
    """A brand-new PostgreSQL database for one test (dropped at the end of the session)."""
    return pg_databases.create()
