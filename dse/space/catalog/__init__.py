"""The model catalog: named architectures a space file can use instead of spelling one out.

Entries are YAML data files in ``models/`` (one per model): a ``name``, a ``description``,
``sources`` (where every figure comes from) and ``model`` (Megatron-Core field names, as in a
space file's ``model`` section). A space names one with ``model: NAME`` or
``model: {catalog: NAME, <field overrides>}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

import yaml

__all__ = ["CatalogEntry", "catalog", "get_entry", "expand_model"]


class CatalogEntry:
    """One catalog model: its name, description, sources and ``model`` mapping."""

    def __init__(self, name: str, description: str, sources: list[str], model: dict[str, Any]):
        self.name = name
        self.description = description
        self.sources = sources
        self.model = model

    def __repr__(self) -> str:
        return f"CatalogEntry({self.name!r})"


@cache
def catalog() -> dict[str, CatalogEntry]:
    """Every catalog entry by name (read once from the package's ``models/*.yaml``)."""
    out: dict[str, CatalogEntry] = {}
    folder = resources.files(__package__).joinpath("models")
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".yaml"):
            continue
        data = yaml.safe_load(item.read_text())
        where = f"catalog file {item.name}"
        if not isinstance(data, Mapping) or set(data) != {
            "name",
            "description",
            "sources",
            "model",
        }:
            raise ValueError(f"{where}: needs exactly name, description, sources and model")
        if not data["sources"]:
            raise ValueError(f"{where}: every entry names its sources")
        name = str(data["name"])
        if item.name != f"{name}.yaml":
            raise ValueError(f"{where}: the file must be named {name}.yaml")
        out[name] = CatalogEntry(
            name, str(data["description"]), list(data["sources"]), dict(data["model"])
        )
    return out


def get_entry(name: str) -> CatalogEntry:
    """The entry ``name``; a ValueError names the known ones."""
    entries = catalog()
    if name not in entries:
        raise ValueError(f"unknown catalog model {name!r}; known: {sorted(entries)}")
    return entries[name]


def expand_model(value: Any) -> Any:
    """A space's ``model`` value with a catalog reference replaced by the entry's fields
    (``{catalog: NAME, ...}``'s other keys override the entry's). Anything else is returned
    as is, for the model's own validation."""
    if isinstance(value, str):
        return dict(get_entry(value).model)
    if isinstance(value, Mapping) and "catalog" in value:
        rest = {k: v for k, v in value.items() if k != "catalog"}
        return {**get_entry(str(value["catalog"])).model, **rest}
    return value
