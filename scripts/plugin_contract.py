"""The import-linter contract type ``plugin_layers``: a layers contract that also sees the plugin
edges of dse's composition root.

The plugin table (:data:`dse.plugins.PLUGINS`) names each implementation as a string
(``module:attribute``, imported when asked for, so that listing the plugins imports neither
Optuna nor Ray nor torch); grimp's graph has no edge for it. This contract adds one edge per
string, from the table's module to the module it names (the implementation and the options
model), and checks the layers on that graph. A plugin named in the table is then held to the
same layers as an import: the composition root sits above every folder it names, and no folder
may reach it, directly or through the ``dse`` package (whose import of the root is the
registration, left out of the graph here). A named module that does not exist breaks it too.

Options: those of ``layers``, plus ``table`` (``module:attribute`` of a sequence of
:class:`dse.core.registry.Plugin`). Registered in pyproject.toml (``contract_types``);
``scripts/lint_imports.py`` puts this folder on the path.
"""

from __future__ import annotations

import importlib
from typing import Any

from importlinter.contracts.layers import LayersContract
from importlinter.domain import fields
from importlinter.domain.contract import ContractCheck

__all__ = ["PluginLayersContract", "plugin_edges"]


def plugin_edges(table: str) -> list[tuple[str, str, str]]:
    """``(table module, named module, what names it)`` for each string of the table."""
    module, _, attr = table.partition(":")
    out = []
    for p in getattr(importlib.import_module(module), attr):
        for what, ref in (("target", p.target), ("options", p.options)):
            out.append((module, ref.split(":", 1)[0], f"{p.kind} {p.name!r} {what} {ref}"))
    return out


class PluginLayersContract(LayersContract):
    """Layers, on the import graph plus the plugin table's edges."""

    type_name = "plugin_layers"

    table = fields.StringField()

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        edges = plugin_edges(str(self.table))
        missing = sorted({f"{named} ({why})" for _, named, why in edges
                          if named not in graph.modules})  # fmt: skip
        if missing:
            return ContractCheck(kept=False, metadata={"missing": missing})
        root = str(self.table).partition(":")[0]
        package = root.rpartition(".")[0]
        if package and graph.direct_import_exists(importer=package, imported=root):
            graph.remove_import(importer=package, imported=root)  # the registration
        for importer, named, why in edges:
            graph.add_import(importer=importer, imported=named, line_number=0,
                             line_contents=f"plugin {why}")  # fmt: skip
        return super().check(graph, verbose)

    def render_broken_contract(self, check: ContractCheck) -> None:
        missing = check.metadata.get("missing")
        if missing:
            from importlinter.application import output

            output.print_error("The plugin table names modules that do not exist:")
            for m in missing:
                output.print_error(f"- {m}")
            return
        super().render_broken_contract(check)
