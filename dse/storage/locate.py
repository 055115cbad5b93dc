"""Which database and which study a command reads: shared by ``dse`` (:mod:`dse.cli.main`), the
interop commands (:mod:`dse.cli.interop`) and ``dse report`` (:mod:`dse.report.page`), so that
none of them imports another's private helpers.

``--storage URL``, else ``$DSE_STORAGE``, else the space file's ``storage``, else
:data:`DEFAULT_STORAGE`. A read-only command never creates a database.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from dse.core.exceptions import StudyNotFoundError
from dse.core.names import display_name
from dse.core.records import StudyRecord

if TYPE_CHECKING:  # SQLAlchemy: imported when a command opens its database
    from dse.storage._repository import Storage

__all__ = ["DEFAULT_STORAGE", "STUDIES_SHOWN", "open_existing", "pick_study", "storage_url"]

DEFAULT_STORAGE = "sqlite:///dse.db"

#: Study names listed when ``--study`` names none of the stored ones.
STUDIES_SHOWN = 20


def storage_url(args: argparse.Namespace, space_url: str | None = None) -> str:
    """The storage URL of a command: ``--storage``, ``$DSE_STORAGE``, the space's, the default."""
    if getattr(args, "storage", None):
        return str(args.storage)
    if os.environ.get("DSE_STORAGE"):
        return os.environ["DSE_STORAGE"]
    return space_url or DEFAULT_STORAGE


def open_existing(args: argparse.Namespace) -> Storage:
    """The storage of a read-only command; a SQLite file that does not exist is an error
    (exit 2), never created."""
    from dse.storage import open_storage, sqlite_file

    url = storage_url(args)
    db = sqlite_file(url)
    if db is not None and not Path(db).is_file():
        raise StudyNotFoundError(f"no study database at {db} (storage {url}); check --storage")
    return open_storage(url)


def pick_study(storage: Storage, name: str | None) -> StudyRecord:
    """The study ``name`` of ``storage`` (the only one when ``name`` is None).

    Raises:
        StudyNotFoundError: naming the stored studies.
    """
    if name:
        try:
            return storage.get_study(name)
        except StudyNotFoundError as e:
            names = [display_name(s.name) for s in storage.list_studies()]
            if not names:
                raise StudyNotFoundError(f"{e}: {storage.display_url} holds no study") from None
            more = f" and {len(names) - STUDIES_SHOWN} more" if len(names) > STUDIES_SHOWN else ""
            raise StudyNotFoundError(
                f"{e} in {storage.display_url}; its studies: "
                f"{', '.join(names[:STUDIES_SHOWN])}{more}"
            ) from None
    studies = storage.list_studies()
    if not studies:
        raise StudyNotFoundError(f"no study in {storage.url}")
    if len(studies) > 1:
        listed = ", ".join(display_name(s.name) for s in studies)
        raise StudyNotFoundError(f"several studies in {storage.url} ({listed}): give --study")
    return studies[0]
