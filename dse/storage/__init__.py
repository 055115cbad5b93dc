"""dse.storage: the study database (SQLite embedded, PostgreSQL for several writers).

One database holds everything a study has: the space file as given (and its hash), trials
with their state, parameters, objective value, per-step metrics, classified failures, log
locations, owner/host, timings and GPU-seconds, plus the proposals rejected before launch.
The schema is created and upgraded by the Alembic migrations shipped in
``dse/storage/migrations`` whenever a database is opened; a database from a newer dse is
refused (:class:`~dse.core.exceptions.SchemaVersionError`).

Owns: ``_repository`` (``Storage``: every write), ``_reads`` (``StorageReads``: every read),
``_study_file`` (a whole study as one JSON document and back: ``dse export`` / ``dse
import``), ``_rows`` (frozen records from rows), ``_models`` (the ORM tables), ``_engine``
(URLs, engines, the schema head), ``locate`` (which database a command reads),
``migrations/`` (the Alembic revisions, frozen: they import no live code).

Everything read comes back as frozen records (:mod:`dse.core.records`), never ORM rows; every
database error as :class:`~dse.core.exceptions.StorageError`.

Example::

    from dse.storage import open_storage

    with open_storage("sqlite:///dse_runs/studies.db") as storage:
        study, created = storage.get_or_create_study(
            name="llama-8b", space_yaml=text, space_hash=digest, direction="maximize",
            metric="tflops_per_gpu", model={}, hardware={},
        )
        trial = storage.claim_trial(
            study_id=study.id, params=p, params_key=key, budget=40, runner="me"
        )
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dse.storage._engine import (
        backend_name,
        has_password,
        head_revision,
        is_ephemeral,
        safe_url,
        sqlite_file,
    )
    from dse.storage._reads import StorageReads, StudyCounters
    from dse.storage._repository import Storage, open_storage
    from dse.storage._rows import StoredTrialRow, trial_from_stored
    from dse.storage._study_file import FORMAT, FORMAT_VERSION, StudyExport, read_export_text

#: Public name -> the module that defines it. Loaded when first asked for, so that a command
#: that only locates its database (:mod:`dse.storage.locate`) starts without SQLAlchemy.
_LAZY = {
    **dict.fromkeys(
        ("backend_name", "has_password", "head_revision", "is_ephemeral", "safe_url",
         "sqlite_file"),
        "dse.storage._engine",
    ),
    **dict.fromkeys(("FORMAT", "FORMAT_VERSION", "StudyExport", "read_export_text"),
                    "dse.storage._study_file"),
    **dict.fromkeys(("StorageReads", "StudyCounters"), "dse.storage._reads"),
    **dict.fromkeys(("Storage", "open_storage"), "dse.storage._repository"),
    **dict.fromkeys(("StoredTrialRow", "trial_from_stored"), "dse.storage._rows"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dse.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Storage",
    "StorageReads",
    "StudyCounters",
    "open_storage",
    "head_revision",
    "safe_url",
    "is_ephemeral",
    "has_password",
    "sqlite_file",
    "backend_name",
    "FORMAT",
    "FORMAT_VERSION",
    "StudyExport",
    "read_export_text",
    "StoredTrialRow",
    "trial_from_stored",
]
