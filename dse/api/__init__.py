"""dse.api: the REST API (``/api/v1``) and the dashboard (``/``) over a study database.

Example::

    import uvicorn
    from dse.api import create_app

    uvicorn.run(create_app(storage_url="sqlite:///dse.db"), port=8000)
"""

from __future__ import annotations

from dse.api.config import Settings
from dse.api.main import create_app

__all__ = ["Settings", "create_app"]
