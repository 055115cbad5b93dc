"""Megatron-Bridge recipes' default global batch size, sequence length and layout.

``bridge_recipe_defaults.yaml`` (next to this module, written by
``scripts/extract_bridge_recipe_defaults.py`` from Megatron-Bridge's source) holds, for each
library recipe (``src/megatron/bridge/recipes``) and performance recipe
(``src/megatron/bridge/perf_recipes``), the ``train.global_batch_size`` and
``dataset.seq_length`` it sets, and its parallel layout (``layout``: the sizes, micro-batch,
MoE dispatcher and recompute it sets itself). :func:`recipe_defaults` picks the recipe
Megatron-Bridge's performance launcher (``scripts/performance/setup_experiment.py``, what a CloudAI
MegatronBridge test runs) would build for a test, by the launcher's own naming rules.

Some recipes set a field from the configuration rather than to a value: :data:`RECIPE_DERIVED`
names them, as derivations of the space's ``derived:`` section (:mod:`dse.space.derive`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

__all__ = [
    "RecipeDefaults",
    "RECIPE_DERIVED",
    "bridge_recipe_table",
    "recipe_defaults",
    "TABLE_FILE",
]

TABLE_FILE = "bridge_recipe_defaults.yaml"

#: Bridge's launcher's precision names in perf recipe names (scripts/performance/utils/utils.py)
_PRECISION = {
    "bf16": "bf16",
    "fp8_cs": "fp8cs",
    "fp8_mx": "fp8mx",
    "fp8_sc": "fp8sc",
    "nvfp4": "nvfp4",
}

#: Bridge recipes (by the launcher's ``model_recipe_name``, ``-mr``) that set a field from
#: the configuration: knob -> derivation (:data:`dse.space.derive.DERIVATIONS`). DeepSeek-V3:
#: its recipes call ``set_deepseek_v3_pipeline_model_parallel_layout`` after setting PP / VP,
#: and the performance launcher (scripts/performance/utils/overrides.py) calls it again for
#: ``-mr deepseek_v3`` whenever a test overrides PP or VP (or gives a layout): the layout
#: follows (PP, VP) in every configuration a test sweeps. Not ``deepseek_v3_32nodes``: the
#: launcher re-derives for ``deepseek_v3`` only.
RECIPE_DERIVED: dict[str, dict[str, str]] = {
    "deepseek_v3": {"pipeline_model_parallel_layout": "bridge_deepseek_v3"},
}


@dataclass(frozen=True)
class RecipeDefaults:
    """The defaults of one Bridge recipe function, and how it was chosen."""

    name: str  # the function name the launcher builds
    kind: str  # "perf" (perf_recipes, the launcher's default) or "library" (use_recipes)
    global_batch_size: int | None
    seq_length: int | None
    path: str  # the repository file that defines it
    function: str  # its name there (an alias's target)
    version: str  # the Megatron-Bridge version of the table
    why: str = ""  # how the launcher's choice was made, when not the obvious one
    #: the parallel sizes and settings the recipe sets itself (knob name -> value; a field it
    #: leaves to Megatron-Core's default is absent)
    layout: Mapping[str, Any] = field(default_factory=dict)
    #: the fields the recipe sets from the configuration: knob -> derivation
    #: (:data:`RECIPE_DERIVED`)
    derived: Mapping[str, str] = field(default_factory=dict)

    def source(self) -> str:
        """Where the values come from, for a note."""
        fn = self.name if self.function == self.name else f"{self.name} (= {self.function})"
        return f"Megatron-Bridge {self.version} {self.path}: {fn}"


@cache
def bridge_recipe_table() -> dict[str, Any]:
    """The data file, parsed (``source``, ``recipes``, ``perf_recipes``)."""
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not {"source", "recipes", "perf_recipes"} <= set(data):
        raise ValueError(f"{TABLE_FILE}: needs source, recipes and perf_recipes")
    return data


def _entry(
    section: str, name: str, kind: str, why: str = "", recipe: str = ""
) -> RecipeDefaults | None:
    data = bridge_recipe_table()
    e = data[section].get(name)
    if e is None:
        return None
    src = data["source"]
    version = str(src.get("version") or src.get("ref") or src.get("commit", "?"))
    return RecipeDefaults(
        name,
        kind,
        e.get("global_batch_size"),
        e.get("seq_length"),
        str(e["path"]),
        str(e.get("function") or name),
        version,
        why,
        dict(e.get("layout") or {}),
        dict(RECIPE_DERIVED.get(recipe, {})),
    )


def _variant_suffix(variant: str | None) -> str:
    # the launcher reads the legacy labels v1/v2 as the canonical recipe
    if variant is None or str(variant).lower() in ("v1", "v2"):
        return ""
    return f"_{str(variant).lower()}"


def recipe_defaults(
    recipe: str,
    task: str = "pretrain",
    *,
    gpu: str | None = None,
    compute_dtype: str | None = None,
    num_gpus: int | None = None,
    use_recipes: bool = False,
    config_variant: str | None = None,
) -> RecipeDefaults | None:
    """The recipe Bridge's performance launcher builds for ``-mr RECIPE --task TASK -g GPU
    -c DTYPE -ng N`` and its defaults, None when the table has neither a performance nor a
    library recipe of that name.

    Without ``use_recipes`` the launcher builds the performance recipe
    ``<recipe>_<task>_<N>gpu_<gpu>_<dtype>[_<variant>]_config``; where there is none for
    ``num_gpus`` it starts from one of another GPU count and rescales its global batch size
    by the data-parallel size, which this does not follow: the library recipe
    ``<recipe>_<task>_config`` (what ``use_recipes`` builds) stands in, and ``why`` says so.
    """
    data = bridge_recipe_table()
    lib_name = f"{recipe}_{task}_config"
    if recipe == "deepseek_v3_32nodes" and task == "pretrain":  # the launcher's one exception
        lib_name = "deepseek_v3_pretrain_config_32nodes"
    if use_recipes:
        return _entry("recipes", lib_name, "library", "use_recipes", recipe)
    why = ""
    if gpu and compute_dtype:
        prec = _PRECISION.get(compute_dtype.lower(), compute_dtype.lower().replace("_", ""))
        tail = f"gpu_{gpu.lower()}_{prec}{_variant_suffix(config_variant)}_config"
        if num_gpus:
            got = _entry("perf_recipes", f"{recipe}_{task}_{num_gpus}{tail}", "perf", "", recipe)
            if got is not None:
                return got
        head = f"{recipe}_{task}_"
        others = sorted(
            n
            for n in data["perf_recipes"]
            if n.startswith(head) and n.endswith(tail) and n[len(head) : -len(tail)].isdigit()
        )
        if others:
            why = (
                f"no performance recipe for {num_gpus} GPUs ({', '.join(others)} exist: the "
                "launcher would rescale one's global batch size by the data-parallel size)"
            )
        else:
            why = f"no performance recipe for {gpu.lower()} {compute_dtype}"
    return _entry("recipes", lib_name, "library", why, recipe)
