"""CloudAI test scenario or test -> dse space (:func:`import_scenario`)."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dse.core.envpolicy import env_var_problem
from dse.core.exceptions import SpaceError
from dse.interop.cloudai._common import (
    _BRIDGE_BOOKKEEPING,
    _CATALOG_ALIASES,
    _FAMILIES,
    _FP8_PARAM_PRESETS,
    _GPU_NAMES,
    _METRICS,
    _MIXED_PRECISION,
    _NEMO_TASKS,
    _OLD_FP8_RECIPES,
    _RECIPE_RE,
    _SEMANTICS,
    _WORKLOADS,
    AGENTS,
    BRIDGE_KNOBS,
    BRIDGE_RENAMED,
    COMPUTE_DTYPES,
    NEMO_RUN_KNOBS,
    CloudAIImport,
    CloudAISystem,
    Unmapped,
    _flatten,
    _read_toml,
)
from dse.interop.cloudai.cmd_args import validate_cmd_args
from dse.interop.cloudai.system import read_system
from dse.model.rules import check, is_valid
from dse.space.catalog import catalog, expand_model
from dse.space.catalog.bridge_recipes import RecipeDefaults, bridge_recipe_table, recipe_defaults
from dse.space.catalog.nemo_recipes import NemoRecipeDefaults, nemo_recipe_defaults
from dse.space.derive import DERIVATIONS
from dse.space.knobs import KNOBS, ModulesKnob, get_knob
from dse.space.layout import PIPELINE_SPLIT_KNOBS
from dse.space.searchspace import params_key, parse_space
from dse.workloads.launchers._core import NotTaken, launcher_for


def _find_test(name: str, tests_dir: Path | None, where: str) -> tuple[Path, dict[str, Any]]:
    """The test definition named ``name`` in ``tests_dir``: its file and its fields."""
    if tests_dir is None:
        raise SpaceError(
            f"{where}: test_name {name!r} names a test definition; give the folder of the "
            "CloudAI test TOMLs with --tests DIR"
        )
    for p in sorted(tests_dir.rglob("*.toml")):
        data = _read_toml(p)
        if data.get("name") == name and "test_template_name" in data:
            return p, data
    raise SpaceError(f"{where}: no test named {name!r} in {tests_dir}")


def _example_space(recipe: str, examples: Path | None) -> dict[str, Any] | None:
    """The example space of ``recipe`` (matched by file name or launcher recipe), if any."""
    if examples is None or not examples.is_dir():
        return None
    for p in sorted(examples.glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        if not isinstance(data, dict):
            continue
        launcher = (data.get("workload") or {}).get("launcher") or {}
        if p.stem == recipe or launcher.get("recipe") == recipe:
            return data
    return None


def default_catalog() -> Path:
    """The example spaces next to the package (a source checkout)."""
    return Path(__file__).resolve().parents[2] / "examples"


def _catalog_entry(key: str) -> str | None:
    name = _CATALOG_ALIASES.get(key, key)
    return name if name in catalog() else None


def _recipe_key(recipe: str) -> str:
    # CloudAI's own NeMo-Run factories are cloudai_<model>_recipe (cloudai_nemorun.py)
    return recipe.removeprefix("cloudai_").removesuffix("_recipe")


def bridge_recipe_parts(recipe: str) -> dict[str, str | None]:
    """A Bridge recipe function name as CloudAI's fields: ``model_recipe_name`` (the stem),
    ``task``, ``model_family_name`` (the recipe family) and what the name pins (GPUs, GPU,
    dtype). A name that does not follow ``<stem>_<task>[_<N>gpu][_<gpu>][_<dtype>]_config``
    is kept whole as the stem with task ``pretrain``."""
    m = _RECIPE_RE.match(recipe)
    stem = m.group("stem") if m else recipe.removesuffix("_config")
    return {
        "model_recipe_name": stem,
        "task": m.group("task") if m else "pretrain",
        "model_family_name": recipe_family(stem),
        "num_gpus": m.group("gpus") if m else None,
        "gpu": m.group("gpu") if m else None,
        "dtype": m.group("dtype") if m else None,
    }


def recipe_family(stem: str) -> str:
    """The Megatron-Bridge recipe family of a recipe stem (``qwen3_30b_a3b`` -> ``qwen``)."""
    for prefix, fam in _FAMILIES:
        if stem.startswith(prefix):
            return fam
    head = stem.split("_", 1)[0]
    return re.sub(r"\d.*$", "", head) or head


def _as_int(v: Any, key: str, where: str) -> int:
    if isinstance(v, bool):
        raise SpaceError(f"{where}: {key} must be an integer, got {v!r}")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise SpaceError(f"{where}: {key} must be an integer, got {v!r}") from None


def _module_list(v: Any) -> str | None:
    """CloudAI's list-in-a-string (``"[mlp, moe_act]"``, ``"attn,moe"``) as dse's
    comma-separated form; None for an empty list."""
    s = str(v).strip().strip("\"'")
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1]
    parts = [p.strip().strip("\"'").lower() for p in s.split(",") if p.strip().strip("\"'")]
    return ",".join(parts) or None


def _as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, list) else [v]


class _Builder:
    """Collects the knobs, fixed values and unmapped fields of one import."""

    def __init__(self, excluded: list[str]) -> None:
        self.knobs: dict[str, dict[str, Any]] = {}
        self.fixed: dict[str, Any] = {}
        self.constraints: list[str] = []
        self.unmapped: list[Unmapped] = []
        self.notes: list[str] = []
        self.excluded = excluded

    def swept(self, key: str, v: Any) -> bool:
        return isinstance(v, list) and not any(key.startswith(e) for e in self.excluded)

    def add(self, ck: str, knob: str, raw: Any, vals: list[Any], *, swept: bool) -> None:
        """Knob ``knob`` from CloudAI field ``ck`` (``raw`` as written) with dse values
        ``vals``: values the knob cannot take are listed and dropped."""
        kb = get_knob(knob)
        good: list[Any] = []
        bad: list[Any] = []
        for x in vals:
            (bad if x is not None and kb.check_value(x) else good).append(x)
        for x in bad:
            self.unmapped.append(
                Unmapped(ck, raw, f"not a value of the knob {knob}: {kb.check_value(x)}")
            )
        uniq: list[Any] = []
        for x in good:
            if x not in uniq:
                uniq.append(x)
        if not uniq:
            return
        if swept and len(uniq) > 1:
            self.knobs[knob] = {"values": uniq, "baseline": uniq[0]}
        elif uniq[0] is not None:
            self.fixed[knob] = uniq[0]
        elif knob in self.fixed:
            del self.fixed[knob]


def _compute_dtype(b: _Builder, ck: str, raw: Any, old_recipe: Any, swept: bool) -> None:
    """compute_dtype (and the older compute_dtype = "fp8" + fp8_recipe) as dse's FP8 knobs."""
    names = []
    for v in _as_list(raw):
        name = str(v).strip().lower()
        if name == "fp8":
            name = _OLD_FP8_RECIPES.get(str(old_recipe or "ds").lower(), "")
        if name not in COMPUTE_DTYPES:
            b.unmapped.append(
                Unmapped(
                    ck, v, f"no dse precision knob value for it (known: {sorted(COMPUTE_DTYPES)})"
                )
            )
            continue
        if name not in names:
            names.append(name)
    if not names:
        return
    pairs = [COMPUTE_DTYPES[n] for n in names]
    if len(pairs) == 1 or not swept:
        fp8, recipe = pairs[0]
        b.fixed["fp8"] = fp8
        if fp8 is None:
            b.fixed.pop("fp8")
        else:
            b.fixed["fp8_recipe"] = recipe
        return
    fp8s = list(dict.fromkeys(p[0] for p in pairs))
    recipes = list(dict.fromkeys(p[1] for p in pairs if p[1] is not None))
    b.knobs["fp8"] = {"values": fp8s, "baseline": fp8s[0]}
    if len(recipes) == 1:
        b.fixed["fp8_recipe"] = recipes[0]
    else:
        b.knobs["fp8_recipe"] = {
            "values": recipes,
            "baseline": recipes[0],
            "when": {"fp8": [f for f in fp8s if f is not None]},
        }
        allowed = ", ".join(f"({f!r}, {r!r})" for f, r in pairs if f is not None)
        b.constraints.append(f"fp8 == None or (fp8, fp8_recipe) in [{allowed}]")
    b.notes.append(
        f"compute_dtype {names} explored as the knobs fp8 / fp8_recipe "
        "(Megatron-Bridge's precision presets)"
    )


def _recompute_modules(b: _Builder, ck: str, raw: Any, swept: bool) -> None:
    """recompute_modules ("[mlp, moe_act]", "[]") as recompute: selective + recompute_modules;
    an empty list is no recompute."""
    sets = []
    for v in _as_list(raw):
        mods = _module_list(v)
        if mods is not None:
            why = get_knob("recompute_modules").check_value(mods)
            if why:
                b.unmapped.append(Unmapped(ck, v, f"not a value of recompute_modules: {why}"))
                continue
        if mods not in sets:
            sets.append(mods)
    if not sets:
        return
    modes = list(dict.fromkeys("none" if m is None else "selective" for m in sets))
    mods_only = [m for m in sets if m is not None]
    many = swept and len(sets) > 1
    if many and len(modes) > 1:
        b.knobs["recompute"] = {"values": modes, "baseline": modes[0]}
    else:
        b.fixed["recompute"] = modes[0]
    if many and len(mods_only) > 1:
        spec: dict[str, Any] = {"values": mods_only, "baseline": mods_only[0]}
        if "recompute" in b.knobs:
            spec["when"] = {"recompute": "selective"}
        b.knobs["recompute_modules"] = spec
    elif mods_only:
        b.fixed["recompute_modules"] = mods_only[0]


#: What Megatron-Bridge's performance launcher (scripts/performance/utils/overrides.py,
#: _set_megatron_fsdp_overrides) sets with --use_megatron_fsdp besides ddp.use_megatron_fsdp
#: (the ConfigContainer overrides a trial gives where the study always runs FSDP).
_BRIDGE_FSDP_OVERRIDES = {
    "ddp.average_in_collective": False,
    "ddp.keep_fp8_transpose_cache": False,
    "model.init_model_with_meta_device": True,
}


def _megatron_fsdp(
    when: str, fixed: dict[str, Any], overrides: dict[str, Any], notes: list[str]
) -> None:
    """use_megatron_fsdp true: the sharding Megatron-Bridge's performance launcher pairs with
    it (data_parallel_sharding_strategy optim_grads_params, read only with FSDP) and, where
    every trial runs FSDP, its other FSDP settings as recipe overrides."""
    if "ddp.data_parallel_sharding_strategy" not in overrides:
        fixed.setdefault("data_parallel_sharding_strategy", "optim_grads_params")
    if when == "always":
        for k, v in _BRIDGE_FSDP_OVERRIDES.items():
            overrides.setdefault(k, v)
        notes.append(
            "use_megatron_fsdp: data_parallel_sharding_strategy optim_grads_params and "
            f"{sorted(_BRIDGE_FSDP_OVERRIDES)}, as Megatron-Bridge's performance launcher "
            "sets them with --use_megatron_fsdp"
        )
    else:
        notes.append(
            "use_megatron_fsdp explored: data_parallel_sharding_strategy optim_grads_params "
            "(read only with FSDP), as Megatron-Bridge's performance launcher sets it; its "
            f"other FSDP settings {sorted(_BRIDGE_FSDP_OVERRIDES)} are left to the recipe "
            "(they would apply to the trials without FSDP too)"
        )


def _cuda_graph_scope(b: _Builder, ck: str, raw: Any, swept: bool) -> None:
    vals = [_module_list(v) for v in _as_list(raw)]
    b.add(ck, "cuda_graph_scope", raw, vals, swept=swept)
    spec = b.knobs.get("cuda_graph_scope")
    if spec is not None and "cuda_graph_impl" in b.knobs:
        spec["when"] = {"cuda_graph_impl": ["local", "transformer_engine"]}


def _bridge_recipe_defaults(
    recipe: str,
    task: str,
    args: dict[str, Any],
    gpu_type: str | None,
    gbs: Any,
    seq: Any,
    notes: list[str],
    pinned: str | None = None,
    where: str = "<test>",
) -> tuple[Any, Any, RecipeDefaults]:
    """The recipe Bridge's performance launcher builds for the test (CloudAI passes ``-mr``,
    ``--task``, ``-g gpu_type``, ``-c compute_dtype``, ``-ng num_gpus``, with CloudAI's
    defaults gb200, bf16 and 8), read from ``dse/space/catalog/bridge_recipe_defaults.yaml``,
    and the global batch size and sequence length the test leaves to it; a note says which
    values came from where (and the Megatron-Bridge commit the test pins, if any).

    Raises:
        SpaceError: no recipe of the table matches, naming the recipe, task, GPU, GPU count
            and compute dtype the launcher would look for.
    """

    gpu = str(gpu_type or args.get("gpu_type") or "gb200")
    dtypes = args.get("compute_dtype", "bf16")
    dtypes = [str(d) for d in dtypes] if isinstance(dtypes, list) else [str(dtypes)]
    num = args.get("num_gpus", 8)
    use_recipes = args.get("use_recipes") is True or str(args.get("use_recipes")).lower() == "true"
    variant = args.get("config_variant")
    try:
        num_gpus = int(num)
    except (TypeError, ValueError):
        num_gpus = None
    picks = [
        recipe_defaults(
            recipe,
            task,
            gpu=gpu,
            compute_dtype=d,
            num_gpus=num_gpus,
            use_recipes=use_recipes,
            config_variant=str(variant) if variant is not None else None,
        )
        for d in dtypes or ["bf16"]
    ]
    found = [p for p in picks if p is not None]
    if len(found) < len(picks) or not found:
        lost = [d for d, p in zip(dtypes or ["bf16"], picks, strict=True) if p is None]
        version = bridge_recipe_table()["source"].get("version", "?")
        raise SpaceError(
            f"{where}: no Megatron-Bridge recipe for model_recipe_name {recipe!r}, task "
            f"{task!r}, gpu_type {gpu!r}, num_gpus {num}, compute_dtype {', '.join(lost)}: "
            f"neither the performance recipe {recipe}_{task}_{num}gpu_{gpu}_<dtype>_config nor "
            f"the library recipe {recipe}_{task}_config is in Megatron-Bridge {version}'s "
            "recipes (dse/space/catalog/bridge_recipe_defaults.yaml); give the model_recipe_name"
            ", gpu_type, num_gpus and compute_dtype of a recipe Bridge has"
        )
    pick = found[0]
    if len({p.name for p in found}) > 1:
        lib = recipe_defaults(recipe, task, use_recipes=True)
        if lib is None:
            raise SpaceError(
                f"{where}: the compute_dtype sweep {dtypes} builds different Megatron-Bridge "
                f"recipes ({', '.join(p.name for p in found)}) and there is no library recipe "
                f"{recipe}_{task}_config to run them all from; sweep one compute_dtype per test"
            )
        why = "the compute_dtype sweep's performance recipes differ"
        pick = dataclasses.replace(lib, why=why)
    took = []
    if gbs is None and pick.global_batch_size is not None:
        gbs = pick.global_batch_size
        took.append(f"global_batch_size {gbs}")
    if seq is None and pick.seq_length is not None:
        seq = pick.seq_length
        took.append(f"seq_length {seq}")
    if took:
        if pick.kind == "perf":
            how = (
                f"the performance recipe Bridge's launcher builds for -g {gpu} -c "
                f"{dtypes[0]} -ng {num_gpus}"
            )
        else:
            how = "the library recipe" + (f"; {pick.why}" if pick.why else "")
        notes.append(
            f"{' and '.join(took)} from the recipe's defaults (the test leaves them to the "
            f"recipe): {pick.source()}, {how}"
            + (
                f" (the test pins Megatron-Bridge at {pinned}; the table is {pick.version}'s)"
                if pinned
                else ""
            )
            + "; give cmd_args.gb / seq_length or --global-batch-size / --seq-length to change"
        )
    return gbs, seq, pick


#: A Bridge recipe's layout field (:attr:`RecipeDefaults.layout`) -> the knob it sets.
_LAYOUT_KNOB = {"recompute_granularity": "recompute"}
#: Knobs of the layout that only a MoE model has.
_MOE_LAYOUT = ("expert_model_parallel_size", "expert_tensor_parallel_size",
               "moe_token_dispatcher_type", "moe_flex_dispatcher_backend")  # fmt: skip


def _recipe_layout(
    pick: RecipeDefaults | NemoRecipeDefaults,
    knobs: dict[str, dict[str, Any]],
    fixed: dict[str, Any],
    given: set[str],
    resources: dict[str, Any],
    is_moe: bool,
    notes: list[str],
) -> dict[str, Any]:
    """The recipe's own parallel sizes and settings (what it runs when the test leaves them
    to it) as the study's fixed values, or as the baseline of a knob the test sweeps; what
    the test sets itself wins. A flex dispatcher backend the recipe runs is declared as a
    feature of the image (the container that runs the recipe has it). Returns the knob values
    taken from the recipe."""
    took: list[str] = []
    taken: dict[str, Any] = {}
    for f, v in pick.layout.items():
        knob = _LAYOUT_KNOB.get(f, f)
        if knob not in KNOBS or (knob in _MOE_LAYOUT and not is_moe):
            continue
        if knob == "sequence_parallel":
            continue  # Bridge's finalize derives it from TP (derived: sequence_parallel: bridge)
        if knob == "recompute":
            v = "none" if v is None else v
        if KNOBS[knob].check_value(v) is not None or (v is None and KNOBS[knob].default is None):
            continue  # None: the knob's default, or no value of it (a backend left unset)
        if knob in knobs:
            if v in knobs[knob]["values"]:
                knobs[knob]["baseline"] = v
                taken[knob] = v
                took.append(f"{knob}={v!r} (baseline)")
            continue
        if knob in fixed or knob in given:
            if knob in fixed and fixed[knob] != v:
                notes.append(f"{knob}: the test's {fixed[knob]!r}, not the recipe's {v!r}")
            continue
        fixed[knob] = v
        taken[knob] = v
        took.append(f"{knob}={v!r}")
    backend = fixed.get("moe_flex_dispatcher_backend")
    if fixed.get("moe_token_dispatcher_type") == "flex" and backend in ("deepep", "hybridep"):
        if backend not in resources["features"]:
            resources["features"].append(backend)
    if took:
        notes.append(f"the recipe's own layout and settings: {', '.join(took)} ({pick.name})")
    return taken


def _recipe_derived(
    pick: RecipeDefaults | NemoRecipeDefaults, derived: dict[str, str], notes: list[str]
) -> dict[str, str]:
    """The fields the recipe sets from the configuration (:attr:`RecipeDefaults.derived`)
    added to the space's ``derived`` section, each named in a note. Returns them."""
    own = dict(pick.derived)
    for knob, how in own.items():
        derived[knob] = how
        notes.append(
            f"{knob} derived ({knob}: {how}) as {pick.name} sets it: "
            f"{DERIVATIONS[knob][how].description}"
        )
    return own


# --- one strategy per CloudAI workload template ---------------------------------------------


@dataclasses.dataclass
class _ArgState:
    """What the template-specific ``cmd_args`` fields leave for the rest of the import."""

    old_fp8_recipe: Any  #: the older MegatronBridge fp8_recipe field, read with compute_dtype
    node_steps: list[str] = dataclasses.field(default_factory=list)
    slurm_old: dict[str, Any] = dataclasses.field(default_factory=dict)  #: account, partition
    fsdp_on: str | None = None  #: use_megatron_fsdp true: "always" or "swept"


@dataclasses.dataclass(frozen=True, eq=False)
class _Template:
    """What the import reads differently per CloudAI test template (its ``cmd_args`` model)."""

    workload: str  #: dse's workload name
    knob_map: Mapping[str, str]  #: cmd_args field -> dse knob
    default_metric: str  #: CloudAI's ``agent_metrics = ["default"]`` for this template
    gbs_field: str  #: the cmd_args field of the global batch size
    seq_field: str  #: the cmd_args field of the sequence length
    recipe_fields: str  #: the cmd_args field(s) that name the recipe
    gpus_in_test: bool = False  #: cmd_args may carry num_gpus / gpus_per_node (older schema)

    def read_recipe(self, args: dict[str, Any], where: str) -> tuple[Any, Any, str, Any]:
        """(recipe, container image, task, model family) popped from ``args``."""
        raise NotImplementedError

    def pick_recipe(self, ctx: _Import, recipe: str) -> None:
        """The recipe the trial runs (``ctx.launcher``) and the recipe whose defaults and
        layout stand in for what the test leaves to it (``ctx.pick``)."""
        raise NotImplementedError

    def recipe_batch(self, ctx: _Import, gbs: Any, seq: Any) -> tuple[Any, Any]:
        """The global batch size and sequence length, the recipe's where the test has none."""
        return gbs, seq

    def renamed_notes(self, args: Mapping[str, Any]) -> list[str]:
        """Notes on fields the test writes under an older CloudAI name."""
        return []

    def arg_state(self, args: dict[str, Any]) -> _ArgState:
        """The state the template's own fields fill (pops what it reads ahead of the others)."""
        return _ArgState(None)

    def own_arg(self, b: _Builder, k: str, v: Any, sw: bool, st: _ArgState) -> bool:
        """Reads a ``cmd_args`` field this template treats on its own (not one knob's value);
        True when it did."""
        return False

    def check_task(self, task: str, unmapped: list[Unmapped]) -> str:
        """The test's task, noted where dse knows no such training task."""
        if task not in ("pretrain", "sft", "finetune", "peft", "lora"):
            unmapped.append(Unmapped("cmd_args.task", task, "not a training task dse knows"))
        return task

    def pop_dense_first(self, args: dict[str, Any]) -> Any:
        """The test's count of leading dense layers of an MoE model (a template that has it)."""
        return None

    def fp8_preset(self, fixed: Mapping[str, Any], overrides: dict[str, Any]) -> None:
        """The recipe's own FP8 setting for a fixed FP8 knob (a template that needs one)."""

    def unknown_arg(self, b: _Builder, k: str, v: Any, overrides: dict[str, Any]) -> None:
        """A scalar ``cmd_args`` field dse has no knob for."""
        raise NotImplementedError

    def after_knob(self, k: str, v: Any, sw: bool, overrides: dict[str, Any]) -> None:
        """After a field became a knob's value: what else the trial needs of it."""

    def extra_cmd_args(
        self, b: _Builder, test: Mapping[str, Any], overrides: dict[str, Any]
    ) -> None:
        """The test's ``extra_cmd_args`` (a template that has them)."""

    def derived(self, fixed: dict[str, Any], is_moe: bool, notes: list[str]) -> dict[str, str]:
        """The space's ``derived`` section: how the stack finalizes fields the trial leaves."""
        derived: dict[str, str] = {}
        if is_moe:
            derived["sequence_parallel"] = "tp_gt_1"  # MoE with TP > 1 needs SP
        return derived


class _NeMoRunTemplate(_Template):
    """CloudAI's ``NeMoRunCmdArgs``: NeMo 2.0 recipes through ``nemo llm TASK``."""

    def read_recipe(self, args: dict[str, Any], where: str) -> tuple[Any, Any, str, Any]:
        recipe = args.pop("recipe_name", None)
        image = args.pop("docker_image_url", None)
        task = str(args.pop("task", "pretrain"))
        return recipe, image, task, None

    def pick_recipe(self, ctx: _Import, recipe: str) -> None:
        ctx.launcher["recipe"] = ctx.key
        ctx.launcher["task"] = ctx.task  # nemo llm TASK --factory RECIPE
        if ctx.key != recipe:
            ctx.notes.append(
                f"CloudAI's factory {recipe!r} (cloudai_nemorun.py) runs as NeMo's own recipe "
                f"{ctx.key!r}: the settings CloudAI's factory adds (callbacks, TP-overlap "
                "configurations) are not part of the trial"
            )
        ctx.pick = nemo_recipe_defaults(ctx.key)

    def recipe_batch(self, ctx: _Import, gbs: Any, seq: Any) -> tuple[Any, Any]:
        pick = ctx.pick
        if pick is None or (gbs is not None and seq is not None):
            return gbs, seq
        took = []
        if gbs is None and pick.global_batch_size is not None:
            gbs = pick.global_batch_size
            took.append(f"global_batch_size {gbs}")
        if seq is None and pick.seq_length is not None:
            seq = pick.seq_length
            took.append(f"seq_length {seq}")
        if took:
            ctx.notes.append(
                f"{' and '.join(took)} from the recipe's defaults (the test leaves them to the "
                f"recipe): {pick.source()}; give cmd_args.data.global_batch_size / "
                "data.seq_length or --global-batch-size / --seq-length to change"
            )
        return gbs, seq

    def check_task(self, task: str, unmapped: list[Unmapped]) -> str:
        if task not in _NEMO_TASKS:
            # CloudAI's NeMoRun runs llm.pretrain or llm.finetune (cloudai_nemorun.py)
            unmapped.append(
                Unmapped("cmd_args.task", task, f"NeMo's CLI task is one of {list(_NEMO_TASKS)}")
            )
            return "pretrain"
        return super().check_task(task, unmapped)

    def unknown_arg(self, b: _Builder, k: str, v: Any, overrides: dict[str, Any]) -> None:
        overrides[k] = v  # the recipe's own override syntax (NeMo-Run dotted paths)

    def after_knob(self, k: str, v: Any, sw: bool, overrides: dict[str, Any]) -> None:
        if k.startswith("trainer.plugins.fp8") and not sw:
            # NeMo's precision plugin sets the model's FP8 fields when the trial starts (over
            # model.config.*): the recipe keeps it as written, the knob tells dse's cost model
            overrides[k] = v


class _MegatronBridgeTemplate(_Template):
    """CloudAI's ``MegatronBridgeCmdArgs``: Megatron-Bridge recipes."""

    def read_recipe(self, args: dict[str, Any], where: str) -> tuple[Any, Any, str, Any]:
        family = args.pop("model_family_name", None)
        recipe = args.pop("model_recipe_name", None)
        old_name, old_size = args.pop("model_name", None), args.pop("model_size", None)
        if not recipe and old_name and old_size:
            recipe = f"{old_name}_{old_size}"
        family = family or (recipe_family(str(recipe)) if recipe else None)
        image = args.pop("container_image", None)
        task = str(args.pop("task", "pretrain"))
        domain = args.pop("domain", None)
        if domain not in (None, "llm"):
            raise SpaceError(
                f"{where}: cmd_args.domain {domain!r}: dse tunes language-model recipes "
                "(domain llm) only"
            )
        return recipe, image, task, family

    def pick_recipe(self, ctx: _Import, recipe: str) -> None:
        # the recipe CloudAI's launcher builds (Bridge's performance launcher's rule)
        repos = [r for r in ctx.test.get("git_repos") or [] if isinstance(r, dict)]
        bridge_repos = [r for r in repos if "Megatron-Bridge" in str(r.get("url"))]
        ctx.pinned = next((str(r["commit"]) for r in bridge_repos if r.get("commit")), None)
        _gb, _seq, pick = _bridge_recipe_defaults(
            ctx.key, ctx.task, ctx.args, ctx.opts.gpu_type, None, None, [], ctx.pinned, ctx.where
        )
        ctx.pick = pick
        ctx.launcher["recipe"] = pick.name
        ctx.notes.append(
            f"recipe {pick.name}: what CloudAI's MegatronBridge launcher builds for this "
            f"test ({pick.source()}" + (f"; {pick.why}" if pick.why else "") + ")"
        )

    def recipe_batch(self, ctx: _Import, gbs: Any, seq: Any) -> tuple[Any, Any]:
        if gbs is None or seq is None:
            gbs, seq, ctx.pick = _bridge_recipe_defaults(
                ctx.key, ctx.task, ctx.args, ctx.opts.gpu_type, gbs, seq, ctx.notes,
                ctx.pinned, ctx.where,
            )  # fmt: skip
        return gbs, seq

    def pop_dense_first(self, args: dict[str, Any]) -> Any:
        return args.pop("first_k_dense_replace", None)

    def fp8_preset(self, fixed: Mapping[str, Any], overrides: dict[str, Any]) -> None:
        if "fp8" in fixed and "mixed_precision" not in overrides:
            # Bridge's mixed_precision preset sets the model's FP8 fields at setup (over model.*):
            # the recipe runs the preset of its compute_dtype, the knobs tell dse's cost model
            pair = (fixed["fp8"], fixed.get("fp8_recipe"))
            preset = next(
                (m for m, d in _MIXED_PRECISION.items() if COMPUTE_DTYPES[d] == pair), None
            )
            if preset is not None:
                overrides["mixed_precision"] = preset

    def arg_state(self, args: dict[str, Any]) -> _ArgState:
        return _ArgState(args.pop("fp8_recipe", None))

    def own_arg(self, b: _Builder, k: str, v: Any, sw: bool, st: _ArgState) -> bool:
        ck = f"cmd_args.{k}"
        if k == "compute_dtype":
            _compute_dtype(b, ck, v, st.old_fp8_recipe, sw)
            return True
        if k == "recompute_modules":
            _recompute_modules(b, ck, v, sw)
            return True
        if k == "cuda_graph_scope":
            _cuda_graph_scope(b, ck, v, sw)
            return True
        if k == "use_megatron_fsdp":
            b.add(ck, "use_megatron_fsdp", v, _as_list(v), swept=sw)
            if True in _as_list(v):
                st.fsdp_on = "always" if b.fixed.get("use_megatron_fsdp") is True else "swept"
            return True
        if k == "enable_vboost":
            if any(bool(x) for x in _as_list(v)):
                st.node_steps.append("vboost")
            return True
        if k == "use_tokendrop":
            b.unmapped.append(
                Unmapped(
                    ck,
                    v,
                    "MoE token dropping changes which experts tokens reach (a routing "
                    "semantic, semantics.moe_routing); set it there for the study",
                )
            )
            return True
        if k in ("account", "partition"):
            st.slurm_old[k] = v
            return True
        if k in _BRIDGE_BOOKKEEPING:
            if v not in (None, "", False):
                b.unmapped.append(
                    Unmapped(ck, v, "a CloudAI launcher setting, not part of a trial")
                )
            return True
        return False

    def unknown_arg(self, b: _Builder, k: str, v: Any, overrides: dict[str, Any]) -> None:
        b.unmapped.append(
            Unmapped(f"cmd_args.{k}", v, "a MegatronBridge launcher argument dse has no knob for")
        )

    def extra_cmd_args(
        self, b: _Builder, test: Mapping[str, Any], overrides: dict[str, Any]
    ) -> None:
        for hk, hv in (test.get("extra_cmd_args") or {}).items():
            if hk == "mixed_precision" and str(hv) in _MIXED_PRECISION:
                _compute_dtype(b, f"extra_cmd_args.{hk}", _MIXED_PRECISION[str(hv)], None, False)
            else:
                overrides[str(hk)] = hv  # Hydra overrides of the ConfigContainer

    def derived(self, fixed: dict[str, Any], is_moe: bool, notes: list[str]) -> dict[str, str]:
        # Megatron-Bridge finalizes SP off at TP 1 and ETP 1 where EP > 1 (dse.space.derive)
        fixed.setdefault("sequence_parallel", True)
        derived = {"sequence_parallel": "bridge"}
        if is_moe:
            derived["expert_tensor_parallel_size"] = "bridge"
            fixed.setdefault("moe_grouped_gemm", True)
            notes.append("moe_grouped_gemm on: Megatron-Bridge's MoE model providers' default")
        return derived

    def renamed_notes(self, args: Mapping[str, Any]) -> list[str]:
        return [
            f"cmd_args.{old} is CloudAI's older name of {new}"
            for old, new in BRIDGE_RENAMED.items()
            if old in args and new not in args
        ]


_STRATEGIES: dict[str, _Template] = {
    "nemo": _NeMoRunTemplate(
        "nemo",
        NEMO_RUN_KNOBS,
        "step-time",
        "data.global_batch_size",
        "data.seq_length",
        "recipe_name",
    ),
    "bridge": _MegatronBridgeTemplate(
        "bridge",
        BRIDGE_KNOBS,
        "tflops-per-gpu",
        "gb",
        "seq_length",
        "model_recipe_name / model_family_name",
        gpus_in_test=True,
    ),
}


def _scenario_test(
    top: dict[str, Any],
    where: str,
    test_id: str | None,
    tests_dir: str | Path | None,
    unmapped: list[Unmapped],
) -> tuple[dict[str, Any], dict[str, Any], Callable[[str], str]]:
    """The scenario's run entry, the test it runs (a test file on its own: no run entry) and
    which file gives a ``cmd_args`` field (the scenario where its run entry sets it, else
    the test's file); the scenario's other tests are unmapped (one study per space)."""
    run: dict[str, Any] = {}
    test_file = where
    overridden: set[str] = set()
    if "test_template_name" in top and "Tests" not in top:  # a test definition on its own
        test = top
    else:
        tests = top.get("Tests")
        if not isinstance(tests, list) or not tests:
            raise SpaceError(f"{where}: neither a CloudAI test scenario ([[Tests]]) nor a test")
        if test_id is not None:
            pick = [t for t in tests if t.get("id") == test_id]
            if not pick:
                ids = [t.get("id") for t in tests]
                raise SpaceError(f"{where}: no test with id {test_id!r} (ids: {ids})")
            run = pick[0]
        else:
            run = tests[0]
        for other in tests:
            if other is not run:
                unmapped.append(
                    Unmapped(
                        f"Tests[id={other.get('id')!r}]",
                        other.get("test_name") or other.get("name"),
                        "a dse space is one study; import it with --test-id",
                    )
                )
        if "test_spec" in run:
            test = run["test_spec"]
        elif "test_name" in run:
            found, test = _find_test(
                run["test_name"], Path(tests_dir) if tests_dir else None, where
            )
            test_file = str(found)
        else:
            test = run
        for k in ("cmd_args", "extra_env_vars", "extra_cmd_args"):  # scenario overrides
            if isinstance(run.get(k), dict) and run is not test:
                merged = _flatten(test.get(k, {}))
                merged.update(_flatten(run[k]))
                test = {**test, k: merged}
                if k == "cmd_args":
                    overridden = set(_flatten(run[k]))
    return run, test, _file_of(where, test_file, overridden)


def _file_of(where: str, test_file: str, overridden: set[str]) -> Callable[[str], str]:
    """Which file gives a ``cmd_args`` field: the scenario where its run entry sets it (or
    a field of it), else the test's file."""

    def file_of(key: str) -> str:
        if not key or any(o == key or o.startswith(key + ".") for o in overridden):
            return where
        return test_file

    return file_of


def _env_section(
    env_in: dict[str, Any],
    first: Callable[[str, Any, str], Any],
    node_steps: list[str],
    unmapped: list[Unmapped],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``extra_env_vars`` as the env section's fixed variables and variable knobs."""
    env_fixed: dict[str, Any] = {}
    env_knobs: dict[str, Any] = {}
    for var, v in env_in.items():
        if var == "ENABLE_VBOOST":  # CloudAI's generic Slurm vboost step
            if str(first(f"extra_env_vars.{var}", v, "")) not in ("", "0"):
                node_steps.append("vboost")
            continue
        env_why = env_var_problem(var)
        if var.startswith("CLOUDAI_") and var != "CLOUDAI_GPU_TYPE" and not env_why:
            env_why = (
                "read by CloudAI's own recipe factories (cloudai_nemorun.py), which dse does "
                "not run"
            )
        if var == "CLOUDAI_GPU_TYPE":
            continue  # resources.gpu
        if env_why:
            unmapped.append(Unmapped(f"extra_env_vars.{var}", v, env_why))
        elif isinstance(v, list) and len(v) > 1:
            env_knobs[var] = {"values": v, "baseline": v[0]}
        else:
            env_fixed[var] = v[0] if isinstance(v, list) else v
    return env_fixed, env_knobs


def _agent_section(
    run: Mapping[str, Any],
    test: Mapping[str, Any],
    default_metric: str,
    n_configs: int,
    unmapped: list[Unmapped],
    notes: list[str],
) -> tuple[dict[str, Any], tuple[str, str], dict[str, Any]]:
    """The agent, objective and budget of the space: (agent, (metric, direction), budget)."""
    agent_name = str(run.get("agent") or test.get("agent") or "grid_search")
    dse_agent = AGENTS.get(agent_name)
    agent: dict[str, Any] = {"name": dse_agent or "tpe"}
    if dse_agent is None:
        unmapped.append(
            Unmapped(
                "agent",
                agent_name,
                f"no dse agent of that meaning (known: {sorted(AGENTS)}); tpe used",
            )
        )
    elif dse_agent != "grid":
        notes.append(f"agent {agent_name!r} is dse's {dse_agent!r}")
    agent_cfg = run.get("agent_config") or test.get("agent_config") or {}
    if isinstance(agent_cfg, Mapping):
        for ak, av in agent_cfg.items():
            if ak == "random_seed" and isinstance(av, int):
                agent["seed"] = av
            elif ak == "sobol_num_trials" and isinstance(av, int) and dse_agent == "gp":
                agent["n_startup_trials"] = av
            else:
                unmapped.append(Unmapped(f"agent_config.{ak}", av, "no dse agent setting"))
    metrics = run.get("agent_metrics", test.get("agent_metrics", ["default"]))
    metric = str(metrics[0]) if metrics else "default"
    if metric == "default":
        metric = default_metric
    obj = _METRICS.get(metric)
    if obj is None:
        unmapped.append(Unmapped("agent_metrics", metrics, "no dse metric; tflops_per_gpu used"))
        obj = ("tflops_per_gpu", "maximize")
    steps_budget = run.get("agent_steps", test.get("agent_steps"))
    budget: dict[str, Any] = {"n_trials": int(steps_budget or n_configs)}
    tl = run.get("time_limit")
    if isinstance(tl, str) and tl.count(":") == 2:
        h, m, s = (int(x) for x in tl.split(":"))
        budget["trial_timeout_s"] = float(h * 3600 + m * 60 + s)
    return agent, obj, budget


@dataclasses.dataclass(frozen=True)
class _Options:
    """What the caller gives besides the scenario (:func:`import_scenario`'s keywords)."""

    tests_dir: str | Path | None = None
    test_id: str | None = None
    gpus_per_node: int | None = None
    model_from: str | Path | None = None
    catalog: str | Path | None = None
    gpu_type: str | None = None
    seq_length: int | None = None
    global_batch_size: int | None = None


@dataclasses.dataclass
class _Import:
    """One import: the test it reads, its template, and what each section has found."""

    src: Path
    run: dict[str, Any]
    test: dict[str, Any]
    template: str  #: CloudAI's test_template_name
    tpl: _Template
    args: dict[str, Any]  #: the test's cmd_args (dotted keys), checked; sections pop them
    b: _Builder
    opts: _Options
    sys_info: CloudAISystem | None
    provenance: dict[str, Any]
    env_in: dict[str, Any]
    key: str = ""  #: dse's name of the recipe
    task: str = "pretrain"
    launcher: dict[str, Any] = dataclasses.field(default_factory=dict)
    pick: RecipeDefaults | NemoRecipeDefaults | None = None  #: the recipe's own defaults
    pinned: str | None = None  #: the Megatron-Bridge commit the test pins
    #: the fields the recipe sets from the configuration (knob -> derivation)
    recipe_derived: dict[str, str] = dataclasses.field(default_factory=dict)
    model: Any = None
    base_sem: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def where(self) -> str:
        return str(self.src)

    @property
    def notes(self) -> list[str]:
        return self.b.notes

    @property
    def unmapped(self) -> list[Unmapped]:
        return self.b.unmapped

    def first(self, key: str, v: Any, why: str) -> Any:
        """A value the space takes one of: the first of a list, the rest listed as unmapped."""
        if isinstance(v, list):
            if len(v) > 1:
                self.unmapped.append(Unmapped(key, v, why + f"; the space takes {v[0]!r}"))
            return v[0] if v else None
        return v


def _open(src: Path, opts: _Options, system: str | Path | CloudAISystem | None) -> _Import:
    """The scenario's test, its template and its checked ``cmd_args``."""
    where = str(src)
    top = _read_toml(src)
    unmapped: list[Unmapped] = []
    run, test, file_of = _scenario_test(top, where, opts.test_id, opts.tests_dir, unmapped)
    template = str(test.get("test_template_name"))
    workload = _WORKLOADS.get(template)
    if workload is None:
        raise SpaceError(
            f"{where}: test_template_name {test.get('test_template_name')!r}: dse launches "
            f"{sorted(_WORKLOADS)} tests (Megatron training recipes) only"
        )
    tpl = _STRATEGIES[workload]
    args = validate_cmd_args(workload, _flatten(test.get("cmd_args") or {}), file_of)
    excluded = [str(x).removeprefix("cmd_args.") for x in run.get("dse_excluded_args") or []]
    excluded += [str(x).removeprefix("cmd_args.") for x in test.get("dse_excluded_args") or []]
    b = _Builder(excluded)
    b.unmapped = unmapped
    # the names and pins of the recipe as the test writes them, kept for the export
    provenance = _provenance(test, args, unmapped)
    b.notes.extend(tpl.renamed_notes(args))
    sys_info = read_system(system) if isinstance(system, (str, Path)) else system
    env_in = _flatten(test.get("extra_env_vars") or {})
    return _Import(src, run, test, template, tpl, args, b, opts, sys_info, provenance, env_in)


def _model_source(ctx: _Import) -> tuple[Any, dict[str, Any]]:
    """The model (a catalog entry or fields) and the semantics of the space it comes from:
    ``--model-from``, else the recipe's example space, else dse's model catalog."""
    base: dict[str, Any] | None = None
    model: Any = None
    if ctx.opts.model_from is not None:
        base = yaml.safe_load(Path(ctx.opts.model_from).read_text())
        ctx.notes.append(f"model and sequence length from {Path(ctx.opts.model_from).name}")
    else:
        catalog = ctx.opts.catalog
        base = _example_space(ctx.key, Path(catalog) if catalog else default_catalog())
        if base is not None:
            ctx.notes.append(f"model and sequence length from the example space of {ctx.key!r}")
        else:
            entry = _catalog_entry(ctx.key)
            if entry is not None:
                model = entry
                ctx.notes.append(f"model from dse's model catalog entry {entry!r}")
    if model is None:
        if not base or "model" not in base:
            raise SpaceError(
                f"{ctx.where}: no example space or catalog model for the recipe {ctx.key!r}; "
                "give a space file with its model section with --model-from"
            )
        model = base["model"]
    return model, dict((base or {}).get("semantics") or {})


def _recipe_section(ctx: _Import) -> None:
    """The recipe, task and container of the test (the launcher section) and its model."""
    tpl = ctx.tpl
    recipe, image, task, family = tpl.read_recipe(ctx.args, ctx.where)
    ctx.task = tpl.check_task(task, ctx.unmapped)
    if not recipe:
        raise SpaceError(f"{ctx.where}: cmd_args names no recipe ({tpl.recipe_fields})")
    ctx.key = _recipe_key(str(recipe))
    if family and family != recipe_family(ctx.key):
        ctx.notes.append(
            f"model_family_name {family!r} differs from the family dse reads from the recipe "
            f"({recipe_family(ctx.key)!r}); the export writes dse's"
        )
    ctx.model, ctx.base_sem = _model_source(ctx)
    tpl.pick_recipe(ctx, str(recipe))
    if image:
        ctx.launcher["container_image"] = (
            str(image).removeprefix("http://").removeprefix("https://")
        )


def _model_overrides(ctx: _Import) -> None:
    """The model fields the test sets (``num_layers``, ``hidden_size``, the leading dense
    layers of an MoE model) over the model's own."""
    model = ctx.model
    over: dict[str, Any] = {}
    for mk in ("num_layers", "hidden_size"):
        v = ctx.args.pop(mk, None)
        if v is None:
            continue
        v = _as_int(ctx.first(f"cmd_args.{mk}", v, "a model field"), mk, ctx.where)
        if v != _model_fields(model).get(mk):
            over[mk] = v
            ctx.notes.append(f"{mk} {v} taken from the test (it differs from the model's)")
    dense_first = ctx.tpl.pop_dense_first(ctx.args)
    if dense_first is not None:
        n_dense = _as_int(
            ctx.first("cmd_args.first_k_dense_replace", dense_first, "a model field"),
            "first_k_dense_replace", ctx.where,
        )  # fmt: skip
        n_layers = int(over.get("num_layers") or _model_fields(model).get("num_layers") or 0)
        if not 0 <= n_dense <= n_layers:
            raise SpaceError(
                f"{ctx.where}: cmd_args.first_k_dense_replace must be between 0 and the "
                f"model's {n_layers} layers (got {n_dense})"
            )
        freq = [0] * n_dense + [1] * (n_layers - n_dense)
        if freq != _model_fields(model).get("moe_layer_freq"):
            over["moe_layer_freq"] = freq
        ctx.notes.append(
            f"first_k_dense_replace {n_dense}: the first {n_dense} layers dense "
            "(model.moe_layer_freq)"
        )
    if over:
        ctx.model = {"catalog": model, **over} if isinstance(model, str) else {**model, **over}


def _require_batch(ctx: _Import, gbs: Any, seq: Any) -> None:
    """Refuse a global batch size or sequence length nobody gives, naming where to give it."""
    missing = [
        f"{n} (cmd_args.{ck}, or --{n.replace('_', '-')})"
        for n, ck, v in (
            ("global_batch_size", ctx.tpl.gbs_field, gbs),
            ("seq_length", ctx.tpl.seq_field, seq),
        )
        if v is None
    ]
    if missing:
        raise SpaceError(
            f"{ctx.where}: the test leaves {' and '.join(missing)} to the recipe, whose value "
            "dse does not know; give it"
        )


def _semantics_section(ctx: _Import) -> dict[str, Any]:
    """The training semantics: the test's, else the caller's, else the recipe's, else the
    model's space's (global batch size, sequence length, steps)."""
    tpl, where = ctx.tpl, ctx.where
    vals: dict[str, Any] = {}
    for ck, name in _SEMANTICS[tpl.workload].items():
        v = ctx.args.pop(ck, None)
        why = f"{name} is a training semantic in dse (one study per value)"
        vals[name] = ctx.first(f"cmd_args.{ck}", v, why) if v is not None else None
    gbs = vals["global_batch_size"] or ctx.opts.global_batch_size
    seq = vals["seq_length"] or ctx.opts.seq_length
    gbs, seq = tpl.recipe_batch(ctx, gbs, seq)
    gbs = gbs or ctx.base_sem.get("global_batch_size")
    seq = seq or ctx.base_sem.get("seq_length")
    if seq is None and isinstance(ctx.model, dict) and ctx.model.get("seq_length"):
        seq = ctx.model["seq_length"]
    _require_batch(ctx, gbs, seq)
    steps = _as_int(vals["steps"] or ctx.base_sem.get("steps", 30), "max_steps", where)
    _model_overrides(ctx)
    return {
        "global_batch_size": _as_int(gbs, "global_batch_size", where),
        "seq_length": _as_int(seq, "seq_length", where),
        "steps": steps,
        # CloudAI's NeMoRun metric averages steps 80-100: time the last 20 steps
        "warmup_steps": max(steps - 20, 1) if steps > 21 else max(steps // 2, 1),
        "precision": ctx.base_sem.get("precision", "bf16"),
    }


def _gpus_per_node(ctx: _Import, nodes: int, old_gpn: Any, num_gpus: Any) -> int:
    """The GPUs per node: the caller's, else the older test's, else the system's, else
    num_gpus / num_nodes, else CloudAI's 8."""
    sys_info, notes = ctx.sys_info, ctx.notes
    if ctx.opts.gpus_per_node is not None:
        return ctx.opts.gpus_per_node
    if old_gpn:  # the older MegatronBridge schema named it in the test
        gpn = _as_int(old_gpn, "gpus_per_node", ctx.where)
        if sys_info is not None and sys_info.gpus_per_node not in (None, gpn):
            notes.append(
                f"cmd_args.gpus_per_node {gpn} used; the system {sys_info.name!r} says "
                f"{sys_info.gpus_per_node}"
            )
        return gpn
    if sys_info is not None and sys_info.gpus_per_node:
        notes.append(f"{sys_info.gpus_per_node} GPUs per node from the system {sys_info.name!r}")
        return sys_info.gpus_per_node
    if num_gpus and nodes:
        gpn = max(1, _as_int(num_gpus, "num_gpus", ctx.where) // nodes)
        notes.append(f"{gpn} GPUs per node assumed (num_gpus / num_nodes); give --system")
        return gpn
    notes.append("8 GPUs per node assumed (CloudAI's NeMoRun rule); give --system")
    return 8


def _gpu_section(ctx: _Import, resources: dict[str, Any]) -> None:
    """The GPU type (the caller's, the test's, CLOUDAI_GPU_TYPE, the system's) and its
    memory for the pre-screen."""
    gtype = (
        ctx.opts.gpu_type or ctx.args.pop("gpu_type", None) or ctx.env_in.get("CLOUDAI_GPU_TYPE")
    )
    ctx.args.pop("gpu_type", None)
    if not gtype and ctx.sys_info is not None:
        gtype = ctx.sys_info.gpu_type
    if not gtype:
        ctx.notes.append("no GPU type in the test or system (gpu_type): no memory pre-screen")
        return
    from dse.model.costmodel.throughput import DEFAULT_GPU, gpu_spec

    gname = _GPU_NAMES.get(str(gtype).lower(), str(gtype))
    resources["gpu"] = gname
    spec = gpu_spec(gname)
    if spec is not DEFAULT_GPU:
        resources["gpu_memory_gib"] = spec.memory_gib
        ctx.notes.append(
            f"GPU {gtype!r}: {spec.memory_gib} GiB per GPU (dse's GPU table) for the "
            "memory pre-screen (an estimate)"
        )
    else:
        ctx.notes.append(f"GPU {gtype!r} is not in dse's GPU table: no memory pre-screen")


def _resources_section(ctx: _Import) -> tuple[dict[str, Any], int]:
    """The resources section (world size, GPUs per node, GPU type and memory, features) and
    the GPUs per node; pops the fields it reads from the test's ``cmd_args``."""
    args, where, tpl = ctx.args, ctx.where, ctx.tpl
    nodes_v = ctx.run.get("num_nodes", args.pop("trainer.num_nodes", None) or 1)
    args.pop("trainer.num_nodes", None)
    nodes = _as_int(
        ctx.first("num_nodes", nodes_v, "dse runs one world size per study"), "num_nodes", where
    )
    old_gpn = args.pop("gpus_per_node", None) if tpl.gpus_in_test else None
    num_gpus = args.pop("num_gpus", None) if tpl.gpus_in_test else None
    gpn = _gpus_per_node(ctx, nodes, old_gpn, num_gpus)
    world = _as_int(num_gpus, "num_gpus", where) if num_gpus else nodes * gpn
    if num_gpus and nodes * gpn != world:
        ctx.notes.append(
            f"num_gpus {world} is not num_nodes x GPUs per node ({nodes} x {gpn}); "
            "the world size is num_gpus"
        )
    resources: dict[str, Any] = {"world_size": world, "gpus_per_node": min(gpn, world)}
    _gpu_section(ctx, resources)
    resources["device"] = "cuda"
    # The NeMo Framework container the recipes run in ships Transformer Engine and Apex;
    # declared, so the space validates the same on any machine (edit for another image).
    feats = ["transformer_engine", "apex"]
    if _model_fields(ctx.model).get("hybrid_layer_pattern"):
        feats.append("mamba_ssm")
    resources["features"] = feats
    ctx.notes.append(
        f"features {feats} declared (the NeMo container's); edit if the image differs"
    )
    return resources, gpn


def _knob_values(knob: str, v: Any) -> list[Any]:
    """A CloudAI field's value(s) as the knob's values (VP 1 is no VP; no CUDA graph)."""
    vals = _as_list(v)
    if knob == "virtual_pipeline_model_parallel_size":
        return [None if x in (None, 1, "None", "none") else x for x in vals]
    if knob == "cuda_graph_impl":
        return ["none" if x in (None, "", "null", "None") else str(x).lower() for x in vals]
    return vals


def _knobs_section(ctx: _Import) -> tuple[dict[str, Any], _ArgState]:
    """Each remaining ``cmd_args`` field as a knob (a list: explored; a scalar: fixed), the
    template's own reading, a recipe override or an unmapped field; the recipe overrides."""
    tpl, b = ctx.tpl, ctx.b
    overrides: dict[str, Any] = {}
    st = tpl.arg_state(ctx.args)
    for k, v in ctx.args.items():
        ck = f"cmd_args.{k}"
        sw = b.swept(k, v)
        if k == "hf_token":
            if v:
                b.unmapped.append(Unmapped(ck, "<not copied>", "a secret: give it as HF_TOKEN"))
            continue
        if tpl.own_arg(b, k, v, sw, st):
            continue
        knob = tpl.knob_map.get(k)
        if knob is None:
            if sw:
                b.unmapped.append(Unmapped(ck, v, "a list over a field dse has no knob for"))
            else:
                tpl.unknown_arg(b, k, v, overrides)
            continue
        b.add(ck, knob, v, _knob_values(knob, v), swept=sw)
        tpl.after_knob(k, v, sw, overrides)
    tpl.extra_cmd_args(b, ctx.test, overrides)
    return overrides, st


def _recipe_settings(
    ctx: _Import, resources: dict[str, Any], st: _ArgState, overrides: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """What the recipe runs where the test leaves it: its layout (:func:`_recipe_layout`),
    Megatron FSDP's settings, its FP8 preset, the stack's derived fields, the distributed
    optimizer and Transformer Engine attention. Returns (the knob values taken from the
    recipe, the space's ``derived`` section)."""
    tpl, b, notes = ctx.tpl, ctx.b, ctx.notes
    knobs, fixed = b.knobs, b.fixed
    is_moe = _is_moe(ctx.model)
    recipe_values: dict[str, Any] = {}
    if ctx.pick is not None:
        given = {tpl.knob_map[k] for k in ctx.args if k in tpl.knob_map}  # also None
        if "recompute_modules" in ctx.args:
            given.add("recompute")
        recipe_values = _recipe_layout(ctx.pick, knobs, fixed, given, resources, is_moe, notes)
    if st.fsdp_on:
        _megatron_fsdp(st.fsdp_on, fixed, overrides, notes)
    tpl.fp8_preset(fixed, overrides)
    preset = overrides.get("mixed_precision")
    if preset in _FP8_PARAM_PRESETS and "fp8_param" not in fixed and "fp8_param" not in knobs:
        fixed["fp8_param"] = True
        notes.append(
            f"fp8_param on: Megatron-Bridge's mixed_precision preset {preset} keeps the "
            "parameters in FP8 (fp8_param_gather)"
        )
    derived = tpl.derived(fixed, is_moe, notes)
    if ctx.pick is not None:
        ctx.recipe_derived = _recipe_derived(ctx.pick, derived, notes)
    if "use_distributed_optimizer" not in fixed and "use_distributed_optimizer" not in knobs:
        # NeMo 2.0's and Megatron-Bridge's recipes train with the distributed optimizer
        # (distributed_fused_adam_with_cosine_annealing); Megatron-Core's default is off
        fixed["use_distributed_optimizer"] = True
        notes.append("use_distributed_optimizer on: the recipes' distributed Adam")
    if "attention_backend" not in fixed and "attention_backend" not in knobs:
        fixed["attention_backend"] = "te"  # the recipes' Transformer Engine attention
        notes.append("attention_backend te: the recipe's Transformer Engine attention")
    return recipe_values, derived


def _widen_if_nothing_swept(b: _Builder, env_knobs: Mapping[str, Any]) -> None:
    """A test that sweeps nothing: its own TP and micro-batch become one-value knobs to widen."""
    if b.knobs or env_knobs:
        return
    for name in list(b.fixed):
        if name in ("tensor_model_parallel_size", "micro_batch_size"):
            b.knobs[name] = {"values": [b.fixed.pop(name)]}
    b.notes.append("the test sweeps nothing: widen the knobs' values to explore")
    if not b.knobs:
        b.knobs["micro_batch_size"] = {"values": [1]}


def _grid_size(*sections: Mapping[str, Mapping[str, Any]]) -> int:
    n = 1
    for section in sections:
        for spec in section.values():
            n *= len(spec["values"])
    return n


def _runner_section(ctx: _Import, st: _ArgState, gpn: int) -> dict[str, Any]:
    mounts: list[str] = []
    for holder in (ctx.test, ctx.run):
        mounts += [str(x) for x in holder.get("extra_container_mounts") or [] if str(x).strip()]
    image = ctx.launcher.get("container_image")
    return _runner(ctx.sys_info, st.slurm_old, mounts, image, gpn, ctx.unmapped, ctx.notes)


def _env_space(
    env_fixed: dict[str, Any], env_knobs: dict[str, Any], node_steps: list[str]
) -> dict[str, Any] | None:
    """The space's ``env`` section, if anything is in it."""
    if not (env_fixed or env_knobs or node_steps):
        return None
    env: dict[str, Any] = {"fixed": env_fixed} if env_fixed else {}
    if env_knobs:
        env["knobs"] = env_knobs
    if node_steps:
        env["node_steps"] = sorted(set(node_steps))
    return env


def _space(ctx: _Import, sections: dict[str, Any]) -> dict[str, Any]:
    """The space mapping: the import's sections in the space file's order."""
    run, test, b = ctx.run, ctx.test, ctx.b
    space: dict[str, Any] = {
        "version": 1,
        "study": str(run.get("id") or test.get("name") or ctx.src.stem).replace(".", "-"),
        "recipe": f"CloudAI {ctx.template} {test.get('name', '')}".strip(),
        "model": ctx.model,
        "semantics": sections["semantics"],
        "resources": sections["resources"],
        "knobs": b.knobs,
        "fixed": b.fixed,
    }
    if sections["derived"]:
        space["derived"] = sections["derived"]
    if b.constraints:
        space["constraints"] = b.constraints
    if sections["env"] is not None:
        space["env"] = sections["env"]
    if sections["overrides"]:
        ctx.launcher["overrides"] = sections["overrides"]
    if ctx.provenance:
        ctx.launcher["cloudai"] = ctx.provenance
    metric, direction = sections["objective"]
    space.update(
        {
            "objective": {"metric": metric, "direction": direction},
            "budget": sections["budget"],
            "agent": sections["agent"],
            "runner": sections["runner"],
            "workload": {"name": ctx.tpl.workload, "launcher": ctx.launcher},
            "prescreen": {"enabled": "gpu_memory_gib" in sections["resources"]},
        }
    )
    for k in ("nsys", "env_params"):
        for holder in (test, run):
            if holder.get(k):
                b.unmapped.append(Unmapped(k, holder[k], "CloudAI-specific; not part of a trial"))
    return space


def import_scenario(
    path: str | Path,
    *,
    tests_dir: str | Path | None = None,
    test_id: str | None = None,
    gpus_per_node: int | None = None,
    model_from: str | Path | None = None,
    catalog: str | Path | None = None,
    system: str | Path | CloudAISystem | None = None,
    gpu_type: str | None = None,
    seq_length: int | None = None,
    global_batch_size: int | None = None,
) -> CloudAIImport:
    """A CloudAI scenario (or test definition) TOML as a dse space mapping.

    ``system``: a CloudAI system TOML (or one read with :func:`read_system`) for the GPUs per
    node, partition, account and Slurm options; ``gpu_type`` overrides the test's GPU type;
    ``seq_length`` / ``global_batch_size`` stand in for what the test leaves to the recipe.

    Raises:
        SpaceError: unreadable TOML, a workload dse cannot launch, a missing test
            definition or model, a ``cmd_args`` value its template does not take, naming
            the file and the field.
    """
    opts = _Options(tests_dir, test_id, gpus_per_node, model_from, catalog, gpu_type,
                    seq_length, global_batch_size)  # fmt: skip
    ctx = _open(Path(path), opts, system)
    _recipe_section(ctx)
    semantics = _semantics_section(ctx)
    resources, gpn = _resources_section(ctx)
    overrides, st = _knobs_section(ctx)
    recipe_values, derived = _recipe_settings(ctx, resources, st, overrides)
    env_fixed, env_knobs = _env_section(ctx.env_in, ctx.first, st.node_steps, ctx.unmapped)
    _widen_if_nothing_swept(ctx.b, env_knobs)
    n_configs = _grid_size(ctx.b.knobs, env_knobs)
    agent, objective, budget = _agent_section(
        ctx.run, ctx.test, ctx.tpl.default_metric, n_configs, ctx.unmapped, ctx.notes
    )
    runner = _runner_section(ctx, st, gpn)
    space = _space(ctx, {
        "semantics": semantics, "resources": resources, "derived": derived,
        "env": _env_space(env_fixed, env_knobs, st.node_steps), "overrides": overrides,
        "objective": objective, "budget": budget, "agent": agent, "runner": runner,
    })  # fmt: skip
    _knobs_from_overrides(space, ctx.where, ctx.notes)
    _uneven_pipeline_note(space, ctx.notes)
    _valid_baseline(space, ctx.where, ctx.notes, recipe_values, ctx.recipe_derived)
    return CloudAIImport(space, ctx.unmapped, ctx.notes)


#: The cmd_args fields that name a test's recipe (kept as written: :class:`CloudAISource`).
_RECIPE_FIELDS = ("recipe_name", "model_family_name", "model_recipe_name")


def _provenance(
    test: Mapping[str, Any], args: Mapping[str, Any], unmapped: list[Unmapped]
) -> dict[str, Any]:
    """``workload.launcher.cloudai`` of an imported test: its ``[[git_repos]]`` (Bridge's pinned
    commit, where CloudAI mounts it, whether it inits submodules) and the fields naming its
    recipe, exactly as written, for :func:`export_test_full` to write back."""
    repos: list[dict[str, str | bool]] = []
    for i, r in enumerate(test.get("git_repos") or []):
        if not isinstance(r, Mapping):
            unmapped.append(Unmapped(f"git_repos[{i}]", r, "not a table; not kept"))
            continue
        bad = {k: v for k, v in r.items() if not isinstance(v, (str, bool))}
        if bad:
            unmapped.append(Unmapped(f"git_repos[{i}]", bad, "not text or true/false; not kept"))
        repos.append({str(k): v for k, v in r.items() if isinstance(v, (str, bool))})
    names = {k: args[k] for k in _RECIPE_FIELDS if isinstance(args.get(k), str)}
    out: dict[str, Any] = {}
    if repos:
        out["git_repos"] = repos
    if names:
        out["recipe_fields"] = names
    return out


def _override_value(v: Any) -> Any:
    """A recipe override's value as data (Hydra / NeMo-Run text read as YAML)."""
    if not isinstance(v, str):
        return v
    try:
        return yaml.safe_load(v) if v else None
    except yaml.YAMLError:
        return v


def _knobs_from_overrides(space: dict[str, Any], where: str, notes: list[str]) -> None:
    """Recipe overrides that are exactly what the recipe launcher renders for one knob value
    (the export writes a knob CloudAI names no field for that way) become that knob's fixed
    value, so an exported test imports back as knobs and renders without a knob and an
    override setting one field. An override of a knob the test explores stays as written."""

    launcher_sec = space["workload"]["launcher"]
    ov: dict[str, Any] = launcher_sec.get("overrides") or {}
    if not ov:
        return
    try:
        parsed = parse_space(space, where)
        launcher = launcher_for(parsed)
        derived_now = parsed.full_params(parsed.baseline())
    except SpaceError:
        return
    have = {k: _override_value(v) for k, v in ov.items()}

    def rendered(name: str, value: Any) -> dict[str, Any] | None:
        try:
            items = launcher.knob_overrides({name: value})
        except (NotTaken, ValueError, TypeError):
            return None
        out = {}
        for item in items:
            key, sep, text = item.partition("=")
            if not sep:
                return None
            out[key.lstrip("+")] = _override_value(text)
        return out or None

    taken: list[str] = []
    for name, kb in KNOBS.items():
        if name in space["knobs"] or kb.kind == "env":
            continue
        probe_value = (
            kb.default
            if kb.default is not None
            else (kb.choices[0] if kb.choices else kb.min_value)
        )
        probe = rendered(name, probe_value)
        if not probe or not set(probe) & set(have):
            continue
        first = next(iter(probe))
        cands: list[Any]
        if isinstance(kb, ModulesKnob):
            got = have.get(first)
            cands = [",".join(map(str, got))] if isinstance(got, list) and got else []
        elif kb.kind == "bool":
            cands = [False, True]
        elif kb.kind == "choice":
            cands = list(kb.choices)
        else:
            cands = [have.get(first)]
        for v in cands:
            if v is None and kb.kind == "int" or kb.check_value(v):
                continue
            r = rendered(name, v)
            if r and all(k in have and have[k] == x for k, x in r.items()):
                # a derived knob at what its derivation gives here (the export writes the
                # derived value) is redundant; otherwise the test's value is the knob's
                if not (name in parsed.derived and derived_now.get(name) == v):
                    if space["fixed"].get(name, v) != v:
                        notes.append(
                            f"{name} {v!r} from the test's overrides (over the import's "
                            f"{space['fixed'][name]!r})"
                        )
                    space["fixed"][name] = v
                for k in r:
                    have.pop(k, None)
                    ov.pop(k, None)
                    ov.pop("+" + k, None)
                taken.append(name)
                break
    if taken:
        notes.append(f"recipe overrides read back as the knobs {sorted(taken)}")
    if not ov:
        launcher_sec.pop("overrides", None)


def _uneven_pipeline_note(space: dict[str, Any], notes: list[str]) -> None:
    """Name the PP values that cannot split the model's layers evenly when the test gives
    no pipeline split: those configurations are refused."""
    n = _model_fields(space["model"]).get("num_layers")
    spec = space["knobs"].get("pipeline_model_parallel_size")
    pps = spec["values"] if spec else [space["fixed"].get("pipeline_model_parallel_size", 1)]
    bad = [pp for pp in pps if isinstance(pp, int) and isinstance(n, int) and n % pp]
    sections = (space["knobs"], space["fixed"], space.get("derived") or {})
    split = any(k in sec for sec in sections for k in PIPELINE_SPLIT_KNOBS)
    if bad and not split:
        notes.append(
            f"PP {bad} cannot split the model's {n} layers evenly and the test sets no "
            "pipeline split (pipeline_model_parallel_layout, num_layers_in_first/"
            "last_pipeline_stage, account_for_*_in_pipeline_split), so dse refuses those "
            "configurations; a recipe that picks its own layout needs it given as that knob "
            "or derived (dse/space/derive.py)"
        )


#: Knob combinations looked at for a valid baseline (CloudAI has no baseline; its first
#: values, or the recipe's own layout, may break a rule).
_BASELINE_SEARCH = 100_000


def _distance(
    values: Mapping[str, list[Any]], base: Mapping[str, Any]
) -> Callable[[Mapping[str, Any]], tuple[int, int]]:
    """How far a configuration is from ``base``: (knobs changed, steps along their lists)."""

    def cost(cfg: Mapping[str, Any]) -> tuple[int, int]:
        changed = [n for n in values if cfg.get(n) != base.get(n)]
        steps = 0
        for n in changed:
            vs = values[n]
            if cfg.get(n) in vs and base.get(n) in vs:
                steps += abs(vs.index(cfg.get(n)) - vs.index(base.get(n)))
        return len(changed), steps

    return cost


def _closest_valid(
    parsed: Any, base: Mapping[str, Any], feats: list[str] | None
) -> dict[str, Any] | None:
    """The valid configuration closest to ``base``: the fewest knobs changed, then the values
    nearest in each knob's list, then the grid's order. Looks at configurations by the
    number of knobs they change (one, then two, ...), up to :data:`_BASELINE_SEARCH`."""

    names = list(parsed.knobs)
    values = {n: list(parsed.knobs[n].values()) for n in names}
    alts = {n: [v for v in values[n] if v != base.get(n)] for n in names}
    cost = _distance(values, base)
    seen: set[str] = set()
    looked = 0
    for size in range(1, len(names) + 1):
        found: list[dict[str, Any]] = []
        for subset in itertools.combinations(names, size):
            for combo in itertools.product(*(alts[n] for n in subset)):
                looked += 1
                if looked > _BASELINE_SEARCH:
                    return min(found, key=cost) if found else None
                cfg = parsed.apply_conditions({**base, **dict(zip(subset, combo, strict=True))})
                key = params_key(cfg)
                if key not in seen:
                    seen.add(key)
                    if is_valid(parsed, cfg, feats):
                        found.append(cfg)
        if found:
            return min(found, key=cost)  # min keeps the first of equals: the grid's order
    return None


def _valid_baseline(
    space: dict[str, Any],
    where: str,
    notes: list[str],
    recipe_values: Mapping[str, Any],
    recipe_derived: Mapping[str, str] | None = None,
) -> None:
    """CloudAI's first values (or the recipe's own, ``recipe_values``, where the test leaves
    them to it) as the baseline; where they break a dse rule, the valid configuration that
    changes the fewest knobs (:func:`_closest_valid`), each change named in a note. Only
    knobs' baselines move: a value the study fixes is never changed. A note names the
    baseline's value of each field the recipe derives (``recipe_derived``)."""

    try:
        parsed = parse_space(space, where)
    except SpaceError:
        return  # the caller's validation names the problem
    feats = parsed.resources.features if isinstance(parsed.resources.features, list) else None
    base = parsed.baseline()
    broken = check(parsed, base, feats)
    if not broken:
        _derived_baseline_note(parsed, base, recipe_derived or {}, "passes dse's rules", notes)
        return
    best = _closest_valid(parsed, base, feats)
    if best is None:
        notes.append(f"no configuration looked at passes dse's rules (first: {broken[0]})")
        return
    changes = []
    for name, spec in space["knobs"].items():
        if name not in best:
            continue
        spec["baseline"] = best[name]
        if best[name] != base.get(name):
            own = name in recipe_values and recipe_values[name] == base.get(name)
            whose = "the recipe's own " if own else "CloudAI's first "
            changes.append(f"{whose}{name} {base.get(name)!r} -> {best[name]!r}")
    notes.append(
        f"the baseline breaks a dse rule ({broken[0]}); the valid configuration closest to "
        f"it (fewest knobs changed) is the baseline: {', '.join(changes)}"
    )
    _derived_baseline_note(parsed, best, recipe_derived or {}, "is the baseline", notes)


def _derived_baseline_note(
    parsed: Any, base: Mapping[str, Any], derived: Mapping[str, str], what: str, notes: list[str]
) -> None:
    """Name the baseline's layout and the value each field the recipe derives takes there."""
    if not derived:
        return
    full = parsed.full_params(base)
    sizes = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
             "virtual_pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size")  # fmt: skip
    shown = ", ".join(f"{k} {full.get(k)!r}" for k in sizes if k in full)
    values = ", ".join(f"{k} {full.get(k)!r}" for k in derived)
    notes.append(f"the baseline ({shown}) {what} with the recipe's derived {values}")


def _model_fields(model: Any) -> dict[str, Any]:
    """A space's ``model`` value (a catalog reference or fields) as its fields."""

    out = expand_model(model)
    return dict(out) if isinstance(out, Mapping) else {}


def _is_moe(model: Any) -> bool:
    return bool(_model_fields(model).get("num_moe_experts"))


def _runner(
    sysi: CloudAISystem | None,
    old: dict[str, Any],
    mounts: list[str],
    image: str | None,
    gpn: int,
    unmapped: list[Unmapped],
    notes: list[str],
) -> dict[str, Any]:
    """The runner section: the Slurm runner with the system's options, else the local one."""
    if sysi is None or sysi.scheduler != "slurm":
        if sysi is not None:
            notes.append(f"system scheduler {sysi.scheduler!r}: trials run on the local runner")
        else:
            notes.append(
                "no --system: trials run on the local runner (give the CloudAI system TOML "
                "for Slurm)"
            )
        for k, v in old.items():
            if v:
                unmapped.append(Unmapped(f"cmd_args.{k}", v, "a Slurm option; give --system"))
        if mounts:
            unmapped.append(
                Unmapped("extra_container_mounts", mounts, "Slurm container mounts; give --system")
            )
        return {"name": "local"}
    opts: dict[str, Any] = {}
    partition = sysi.partition or old.get("partition") or None
    account = sysi.account or old.get("account") or None
    if partition:
        opts["partition"] = partition
    if account:
        opts["account"] = account
    opts["gpus_per_node"] = gpn
    if image:
        opts["container_image"] = image
    if mounts:
        opts["container_mounts"] = mounts
    if sysi.sbatch_args:
        opts["sbatch_args"] = list(sysi.sbatch_args)
    srun = list(sysi.srun_args)
    if sysi.container_mount_home:
        srun.append("--container-mount-home")
    if srun:
        opts["srun_args"] = srun
    env: dict[str, str] = {}
    for var, val in sysi.env:
        why = env_var_problem(var)
        if why:
            unmapped.append(Unmapped(f"system.global_env_vars.{var}", val, why))
        else:
            env[var] = val
    if env:
        opts["env"] = env
    notes.append(f"Slurm runner options from the system {sysi.name!r}")
    return {"name": "slurm", "options": opts}
