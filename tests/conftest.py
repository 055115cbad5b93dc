"""Shared fixtures: paths of the repository and of the measured table it ships, and the rule
for the real parts the README promises (PostgreSQL, Slurm, Ray, Chromium, Megatron-Core on
CPU): a test that needs a missing one is skipped, naming it, except under ``CI``, where it
fails naming it (:func:`require_part`)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
REPLAY_TABLE = EXAMPLES / "tables" / "h200_llama1b_unfused_1gpu.jsonl"
#: Excerpts of real training and trial logs, each naming its source in its header lines.
LOGS = REPO / "tests" / "fixtures" / "logs"
#: The measured H200 table (shipped in examples/tables/, so the tests never skip for it).
SHARED_TABLE = REPLAY_TABLE
#: The test server and role (scripts/pg_up.sh creates the role with this password; a stock
#: server refuses a passwordless ``postgres`` login over TCP). ``DSE_TEST_PG`` overrides it.
PG_SERVER = os.environ.get("DSE_TEST_PG", "postgresql+psycopg://dse_test:dse_test@127.0.0.1:5432")
PG_ADMIN_DB = "postgres"


def ci_required() -> bool:
    """Whether ``CI`` is set (to anything but empty, 0, false or no): every real part the
    README promises must then be present."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# Property-based tests (fuzz) draw the same examples on every CI run: a failure there is
# reproducible, and a passing run does not depend on luck. Locally they explore at random.
# No per-example deadline in either (Hypothesis's default 200 ms is a wall-time assert that a
# loaded machine fails; the tests assert outcomes, not speed).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if ci_required() else "local")


def require_part(part: str, problem: str) -> NoReturn:
    """A real part a test needs is missing (``problem`` says why and how to get it): skip
    the test naming the part, or, under ``CI``, fail it naming the part."""
    msg = f"{part} is not available: {problem}"
    if ci_required():
        pytest.fail(f"{msg} (CI is set: the {part} tests must run)", pytrace=False)
    pytest.skip(msg)


def megatron_problem() -> str | None:
    """Why Megatron-Core on CPU cannot run here (None: it can)."""
    missing = [m for m in ("torch", "megatron.core") if _find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (pip install -e '.[megatron]')"
    return None


def _find_spec(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:  # the parent package is missing
        return None


def require_megatron() -> None:
    """Skip (fail under ``CI``) unless Megatron-Core and torch are installed and import.
    The import is made here with its warnings silenced (no Transformer Engine or Apex on
    CPU, torch deprecations), as ``pytest.importorskip`` does, so that a test's own import
    finds it loaded."""
    problem = megatron_problem()
    if problem is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module("megatron.core")
        except ImportError as e:
            problem = f"megatron.core does not import: {e}"
    if problem is not None:
        require_part("Megatron-Core", problem)


@pytest.fixture
def megatron_core() -> None:
    """Megatron-Core on CPU is installed (skip without it; fail under ``CI``)."""
    require_megatron()


#: Marks a test that trains with Megatron-Core (skipped without it; a failure under ``CI``).
needs_megatron = pytest.mark.usefixtures("megatron_core")


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
    from dse.space.searchspace import parse_space

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


@pytest.fixture(scope="module")
def replay_study(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The storage URL of a finished replay study ``replay-llama1b``: a real study of the
    measured H200 table (examples/replay_llama1b.yaml) run once per module through ``dse
    start``, what the export and report tests read."""
    from dse.cli.main import main

    d = tmp_path_factory.mktemp("replay")
    url = f"sqlite:///{d / 'dse.db'}"
    rc = main(["start", "--space", str(EXAMPLES / "replay_llama1b.yaml"), "--storage", url,
               "--workdir", str(d / "runs")])  # fmt: skip
    assert rc == 0
    return url


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
        require_part(
            "PostgreSQL",
            f"not reachable at {_shown(PG_SERVER)}: {str(e).splitlines()[0]} "
            "(scripts/pg_up.sh installs and starts it and creates the test role; "
            "DSE_TEST_PG names another server)",
        )
    yield engine
    engine.dispose()


def _shown(url: str) -> str:
    """``url`` with its password masked."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


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


# --- parallel runs (pytest-xdist, scripts/test.sh) -------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` each test file runs on one worker (its module fixtures built
    once, its tests in order), and every test that uses the one-node Slurm or a local Ray
    instance runs on one worker for each (one job queue and one Ray at a time, as in a
    serial run). Without xdist nothing changes."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "slurm" in names or item.get_closest_marker("slurm"):
            group = "slurm"
        elif "ray_cluster" in names or item.get_closest_marker("ray"):
            group = "ray"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
