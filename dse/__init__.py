"""dse package."""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

__all__ = ["DISTRIBUTION", "install_hint", "version"]

#: The name dse is distributed under on the package index (``pip install``); the name ``dse``
#: there belongs to another project. The command (``dse``) and the import package (``dse``)
#: keep their names.
DISTRIBUTION = "dse-megatron"


def install_hint(extra: str) -> str:
    """The command that installs an optional part (``extra``) of dse."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


@lru_cache(maxsize=1)
def version() -> str:
    """The installed dse's version (``unknown`` when dse runs from a source tree)."""
    try:
        return _dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
