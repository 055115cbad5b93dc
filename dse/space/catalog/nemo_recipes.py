"""NeMo 2.0 recipes' default global batch size, sequence length and layout.

``nemo_recipe_defaults.yaml`` (next to this module, written by
``scripts/extract_nemo_recipe_defaults.py`` from NeMo's source at a pinned commit) holds, for
each recipe module of ``nemo/collections/llm/recipes`` with a ``pretrain_recipe``, the
``MockDataModule`` sequence length and global batch size it configures and the parallel
sizes and micro-batch size its trainer gets. A CloudAI NeMoRun test that leaves them to its
recipe (``recipe_name``) runs with these (:func:`nemo_recipe_defaults`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

__all__ = ["NemoRecipeDefaults", "nemo_recipe_defaults", "nemo_recipe_table", "TABLE_FILE"]

TABLE_FILE = "nemo_recipe_defaults.yaml"


@dataclass(frozen=True)
class NemoRecipeDefaults:
    """The defaults of one NeMo 2.0 recipe's ``pretrain_recipe``."""

    name: str  # the recipe module (NeMo's factory name: nemo llm pretrain --factory NAME)
    global_batch_size: int | None
    seq_length: int | None
    path: str
    version: str  # the NeMo ref and commit of the table
    layout: dict[str, Any] = field(default_factory=dict)
    #: the fields the recipe sets from the configuration (none known for NeMo 2.0's recipes)
    derived: dict[str, str] = field(default_factory=dict)

    def source(self) -> str:
        """Where the values come from, for a note."""
        return f"NeMo {self.version} {self.path}: pretrain_recipe"


@cache
def nemo_recipe_table() -> dict[str, Any]:
    """The data file, parsed (``source``, ``recipes``)."""
    data = yaml.safe_load(resources.files(__package__).joinpath(TABLE_FILE).read_text())
    if not isinstance(data, dict) or not {"source", "recipes"} <= set(data):
        raise ValueError(f"{TABLE_FILE}: needs source and recipes")
    return data


def nemo_recipe_defaults(recipe: str) -> NemoRecipeDefaults | None:
    """The defaults of NeMo 2.0 recipe ``recipe`` (``llama3_8b``), None where NeMo has none."""
    data = nemo_recipe_table()
    e = data["recipes"].get(recipe)
    if e is None:
        return None
    src = data["source"]
    return NemoRecipeDefaults(
        recipe,
        e.get("global_batch_size"),
        e.get("seq_length"),
        str(e["path"]),
        f"{src.get('ref', '?')} ({str(src.get('commit', '?'))[:12]})",
        dict(e.get("layout") or {}),
    )
