"""dse package."""

__all__ = ["DISTRIBUTION", "install_hint"]

#: The name dse is distributed under on the package index (``pip install``); the name ``dse``
#: there belongs to another project. The command (``dse``) and the import package (``dse``)
#: keep their names.
DISTRIBUTION = "dse-megatron"


def install_hint(extra: str) -> str:
    """The command that installs an optional part (``extra``) of dse."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
