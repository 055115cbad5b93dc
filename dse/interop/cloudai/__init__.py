"""CloudAI test scenarios in and out, against CloudAI's current schema.

:func:`import_scenario` turns a CloudAI test scenario (or one test definition) of the NeMoRun
or MegatronBridge workloads into a dse space. The fields are read as CloudAI's current
``NeMoRunCmdArgs`` / ``MegatronBridgeCmdArgs`` name them (older names still read:
:data:`BRIDGE_RENAMED`); every field dse has a knob for becomes that knob (list values:
explored, CloudAI's implicit DSE dimensions; scalars: ``fixed``), ``compute_dtype`` and the
FP8 plugin fields become dse's FP8 knobs (so FLOPs and the cost model see FP8), ``agent``
maps to the dse agent of the same meaning (:data:`AGENTS`). ``extra_env_vars`` become the
``env`` section, ``num_nodes`` / ``num_gpus`` and the system's GPUs per node the resources, the
recipe and container the launcher settings, and an optional CloudAI system TOML
(:func:`read_system`) the GPUs per node, partition, account, container mounts and Slurm
options. The model comes from dse's model catalog or the example space of the recipe.
Whatever has no dse equivalent is returned in :attr:`CloudAIImport.unmapped` with what was
done about it, never dropped silently; what the import assumed is in
:attr:`CloudAIImport.notes`.

:func:`export_test` writes a configuration back as a CloudAI test TOML with scalar fields in
the current names (the full recipe in ``model_family_name`` / ``model_recipe_name`` and
``task``); knobs CloudAI names no field for travel as the recipe's own overrides
(``extra_cmd_args`` for MegatronBridge, dotted ``cmd_args`` for NeMoRun) through the recipe
launcher's table, and what the target cannot take is named.

The mapping tables below are the one place the CloudAI field names live.
"""

from __future__ import annotations

from dse.interop.cloudai._common import (
    AGENTS,
    BRIDGE_KNOBS,
    BRIDGE_RENAMED,
    COMPUTE_DTYPES,
    NEMO_RUN_KNOBS,
    CloudAIImport,
    CloudAISystem,
    Unmapped,
)
from dse.interop.cloudai.export import (
    CloudAIExport,
    dump_toml,
    export_test,
    export_test_full,
    figure_label,
)
from dse.interop.cloudai.importer import (
    bridge_recipe_parts,
    default_catalog,
    import_scenario,
    recipe_family,
)
from dse.interop.cloudai.system import read_system

__all__ = [
    "CloudAIImport",
    "CloudAISystem",
    "Unmapped",
    "import_scenario",
    "read_system",
    "export_test",
    "dump_toml",
    "NEMO_RUN_KNOBS",
    "BRIDGE_KNOBS",
    "BRIDGE_RENAMED",
    "COMPUTE_DTYPES",
    "AGENTS",
    "bridge_recipe_parts",
    "recipe_family",
    "default_catalog",
    "CloudAIExport",
    "export_test_full",
    "figure_label",
]
