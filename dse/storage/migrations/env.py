"""Alembic environment of the dse schema.

dse runs the migrations itself (:func:`dse.storage.open_storage` upgrades to head on a
connection it passes in ``config.attributes["connection"]``). For development, the
shipped ``alembic.ini`` also works from the command line::

    DSE_STORAGE_URL=sqlite:///dev.db alembic -c dse/storage/migrations/alembic.ini revision \
        --autogenerate -m "what changed"
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import MetaData, create_engine, pool
from sqlalchemy.engine import Connection

config = context.config


def _target_metadata() -> MetaData | None:
    """The live models, which ``--autogenerate`` compares the database with: only for the
    command line. dse's own upgrade (a connection passed in) runs the frozen revisions alone,
    importing no live code of dse."""
    if "connection" in config.attributes:
        return None
    from dse.storage._models import Base

    return Base.metadata


if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = _target_metadata()


def _url() -> str:
    url = os.environ.get("DSE_STORAGE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set DSE_STORAGE_URL (or sqlalchemy.url) to run dse migrations")
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    """Emit the SQL of the migrations (``alembic upgrade head --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the caller's connection, or on one made from the URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        # dse's own call: the caller holds the transaction (and the migration lock).
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
