"""dse: design-space exploration of Megatron-Core / Megatron-Bridge / NeMo training recipes.

The folders, bottom up (docs/ARCHITECTURE.md has the map): ``core`` the vocabulary, ``space``
the space file and the knob catalog, ``model`` the validity rules, FLOPs and the cost model,
``results`` what stored trials say (the noise-aware best, exports), ``agents``, ``workloads``
(runners, launchers, trial processes) and ``storage`` (SQL), ``interop`` (CloudAI, Optuna),
``loop`` (the controller), ``report``, ``api`` and ``cli``. :mod:`dse.plugins`, the composition
root, names every plugin; importing this package registers them.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

from dse.plugins import register as _register_plugins

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


_register_plugins()
