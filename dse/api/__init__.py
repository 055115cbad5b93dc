"""dse.api: the REST API (``/api/v1``) and the dashboard (``/``) over a study database.

Owns: ``main`` (``create_app``), ``config`` (the ``DSE_*`` settings), ``routes/`` (one router
per resource), ``schemas`` (request and response models), ``views`` (what the routes answer,
built from storage records), ``readcache`` (answers kept per study version), ``fastreads``
(the two reads a dashboard polls most), ``plausible`` (which values count in the cross-study
best), ``deps``, ``errors``, ``security`` (headers), ``spawn`` (a study controller started as
a detached process for ``?start=true``), ``static/`` (the dashboard's assets).

Example::

    import uvicorn
    from dse.api import create_app

    uvicorn.run(create_app(storage_url="sqlite:///dse.db"), port=8000)"""

from __future__ import annotations

from dse.api.config import Settings
from dse.api.main import create_app

__all__ = ["Settings", "create_app"]
