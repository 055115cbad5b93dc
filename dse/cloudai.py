"""CloudAI test scenarios in and out.

:func:`import_scenario` turns a CloudAI test scenario (or one test definition) of the NeMoRun
or MegatronBridge workloads into a dse space: list-valued ``cmd_args`` (CloudAI's implicit DSE
dimensions) become knobs under their Megatron names, scalar ones fixed; ``extra_env_vars``
become the ``env`` section (lists become env knobs); ``num_nodes`` and the GPUs per node the
resources; the recipe and the container the launcher settings; the model comes from the
example space of the same recipe. Whatever has no dse equivalent is returned in
:attr:`CloudAIImport.unmapped` with what was done about it, never dropped silently.

:func:`export_test` writes a configuration back as a CloudAI test TOML with scalar fields.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dse.exceptions import SpaceError
from dse.knobs import check_env_var, get_knob

__all__ = [
    "CloudAIImport",
    "Unmapped",
    "import_scenario",
    "export_test",
    "NEMO_RUN_KNOBS",
    "BRIDGE_KNOBS",
]

#: NeMoRun ``cmd_args`` paths that are dse knobs (Megatron names; NeMo-Run override paths).
NEMO_RUN_KNOBS: dict[str, str] = {
    "trainer.strategy.tensor_model_parallel_size": "tensor_model_parallel_size",
    "trainer.strategy.pipeline_model_parallel_size": "pipeline_model_parallel_size",
    "trainer.strategy.virtual_pipeline_model_parallel_size": (
        "virtual_pipeline_model_parallel_size"
    ),
    "trainer.strategy.context_parallel_size": "context_parallel_size",
    "trainer.strategy.expert_model_parallel_size": "expert_model_parallel_size",
    "trainer.strategy.expert_tensor_parallel_size": "expert_tensor_parallel_size",
    "trainer.strategy.sequence_parallel": "sequence_parallel",
    "data.micro_batch_size": "micro_batch_size",
    "trainer.plugins.grad_reduce_in_fp32": "grad_reduce_in_fp32",
    "optim.config.use_precision_aware_optimizer": "use_precision_aware_optimizer",
    "optim.config.use_distributed_optimizer": "use_distributed_optimizer",
}

#: MegatronBridge ``cmd_args`` (CloudAI's short names) that are dse knobs.
BRIDGE_KNOBS: dict[str, str] = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "et": "expert_tensor_parallel_size",
    "mb": "micro_batch_size",
}

#: CloudAI ``gpu_type`` -> the GPU name dse's cost model knows.
_GPU_NAMES = {
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "gb200": "NVIDIA GB200",
    "gb300": "NVIDIA GB300",
}

#: CloudAI agent metrics -> dse objective (NeMoRun "default" is the step time).
_METRICS = {
    "step-time": ("step_time_s", "minimize"),
    "iteration-time": ("step_time_s", "minimize"),
    "tflops-per-gpu": ("tflops_per_gpu", "maximize"),
}

_WORKLOADS = {"NeMoRun": "nemo", "MegatronBridge": "bridge"}


@dataclass(frozen=True)
class Unmapped:
    """A CloudAI field dse has no equivalent for, and what the import did about it."""

    key: str
    value: Any
    why: str


@dataclass
class CloudAIImport:
    """The space a CloudAI scenario became, and what could not be mapped."""

    space: dict[str, Any]
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_yaml(self, source: str) -> str:
        """The space file, headed by comments that list every unmapped field."""
        head = [f"# Imported by `dse cloudai import` from the CloudAI scenario {source}."]
        for n in self.notes:
            head.append(f"# note: {n}")
        if self.unmapped:
            head.append("# Not mapped (no dse equivalent):")
            for u in self.unmapped:
                head.append(f"#   {u.key} = {u.value!r}: {u.why}")
        return "\n".join(head) + "\n" + yaml.safe_dump(self.space, sort_keys=False)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise SpaceError(f"{path}: cannot read the CloudAI file ({e.strerror})") from e
    except tomllib.TOMLDecodeError as e:
        raise SpaceError(f"{path}: not valid TOML: {e}") from e


def _find_test(name: str, tests_dir: Path | None, where: str) -> dict[str, Any]:
    if tests_dir is None:
        raise SpaceError(
            f"{where}: test_name {name!r} names a test definition; give the folder of the "
            "CloudAI test TOMLs with --tests DIR"
        )
    for p in sorted(tests_dir.rglob("*.toml")):
        data = _read_toml(p)
        if data.get("name") == name and "test_template_name" in data:
            return data
    raise SpaceError(f"{where}: no test named {name!r} in {tests_dir}")


def _catalog_space(recipe: str, catalog: Path | None) -> dict[str, Any] | None:
    """The example space of ``recipe`` (matched by file name or launcher recipe), if any."""
    if catalog is None or not catalog.is_dir():
        return None
    for p in sorted(catalog.glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        if not isinstance(data, dict):
            continue
        launcher = (data.get("workload") or {}).get("launcher") or {}
        if p.stem == recipe or launcher.get("recipe") == recipe:
            return data
    return None


def default_catalog() -> Path:
    """The example spaces next to the package (a source checkout)."""
    return Path(__file__).resolve().parents[1] / "examples"


def _recipe_key(recipe: str) -> str:
    # CloudAI's own factories are cloudai_<model>_recipe (cloudai_nemorun.py)
    return recipe.removeprefix("cloudai_").removesuffix("_recipe")


def _as_int(v: Any, key: str, where: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise SpaceError(f"{where}: {key} must be an integer, got {v!r}") from None


def import_scenario(
    path: str | Path,
    *,
    tests_dir: str | Path | None = None,
    test_id: str | None = None,
    gpus_per_node: int | None = None,
    model_from: str | Path | None = None,
    catalog: str | Path | None = None,
) -> CloudAIImport:
    """A CloudAI scenario (or test definition) TOML as a dse space mapping.

    Raises:
        SpaceError: unreadable TOML, a workload dse cannot launch, a missing test
            definition or model, naming the file and the field.
    """
    src = Path(path)
    where = str(src)
    top = _read_toml(src)
    unmapped: list[Unmapped] = []
    notes: list[str] = []
    run: dict[str, Any] = {}
    if "test_template_name" in top:  # a test definition on its own
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
            test = _find_test(run["test_name"], Path(tests_dir) if tests_dir else None, where)
        else:
            test = run
        for k in ("cmd_args", "extra_env_vars"):  # scenario-level overrides of the test
            if isinstance(run.get(k), dict) and run is not test:
                merged = _flatten(test.get(k, {}))
                merged.update(_flatten(run[k]))
                test = {**test, k: merged}
    template = test.get("test_template_name")
    workload = _WORKLOADS.get(str(template))
    if workload is None:
        raise SpaceError(
            f"{where}: test_template_name {template!r}: dse launches {sorted(_WORKLOADS)} "
            "tests (Megatron training recipes) only"
        )
    args = _flatten(test.get("cmd_args") or {})
    excluded = [str(x).removeprefix("cmd_args.") for x in run.get("dse_excluded_args") or []]
    excluded += [str(x).removeprefix("cmd_args.") for x in test.get("dse_excluded_args") or []]

    knobs: dict[str, Any] = {}
    fixed: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    env_fixed: dict[str, Any] = {}
    env_knobs: dict[str, Any] = {}
    launcher: dict[str, Any] = {}
    knob_map = NEMO_RUN_KNOBS if workload == "nemo" else BRIDGE_KNOBS

    def swept(key: str, v: Any) -> bool:
        return isinstance(v, list) and not any(key.startswith(e) for e in excluded)

    def first(key: str, v: Any, why: str) -> Any:
        if isinstance(v, list):
            if len(v) > 1:
                unmapped.append(Unmapped(key, v, why + f"; the space takes {v[0]!r}"))
            return v[0] if v else None
        return v

    # --- the recipe, the model and the semantics ------------------------------------------
    if workload == "nemo":
        recipe = args.pop("recipe_name", None)
        image = args.pop("docker_image_url", None)
        task = args.pop("task", "pretrain")
    else:
        name, size = args.pop("model_name", None), args.pop("model_size", None)
        recipe = f"{name}_{size}" if name and size else None
        image = args.pop("container_image", None)
        task = args.pop("task", "pretrain")
        args.pop("domain", None)
    if task != "pretrain":
        unmapped.append(Unmapped("cmd_args.task", task, "dse tunes pre-training recipes"))
    if not recipe:
        raise SpaceError(f"{where}: cmd_args names no recipe (recipe_name / model_name)")
    key = _recipe_key(str(recipe))
    base: dict[str, Any] | None
    if model_from is not None:
        base = yaml.safe_load(Path(model_from).read_text())
        notes.append(f"model and sequence length from {Path(model_from).name}")
    else:
        base = _catalog_space(key, Path(catalog) if catalog else default_catalog())
        if base is not None:
            notes.append(f"model and sequence length from the example space of {key!r}")
    if not base or "model" not in base:
        raise SpaceError(
            f"{where}: no example space for the recipe {key!r} gives the model; "
            "give a space file with its model section with --model-from"
        )
    model = dict(base["model"])
    base_sem = dict(base.get("semantics") or {})
    if workload == "nemo":
        launcher["recipe"] = key
    else:
        blaunch = (base.get("workload") or {}).get("launcher") or {}
        launcher["recipe"] = blaunch.get("recipe") or f"{key}_pretrain_config"
    if image:
        launcher["container_image"] = str(image).removeprefix("http://").removeprefix("https://")

    gbs_key = "data.global_batch_size" if workload == "nemo" else "gb"
    gbs = first(
        f"cmd_args.{gbs_key}",
        args.pop(gbs_key, base_sem.get("global_batch_size")),
        "the global batch size is a training semantic in dse (one study per value)",
    )
    seq_key = "data.seq_length" if workload == "nemo" else "seq_length"
    seq = first(f"cmd_args.{seq_key}", args.pop(seq_key, base_sem.get("seq_length")), "semantic")
    steps_key = "trainer.max_steps" if workload == "nemo" else "max_steps"
    steps = first(f"cmd_args.{steps_key}", args.pop(steps_key, base_sem.get("steps", 30)), "")
    if gbs is None or seq is None:
        raise SpaceError(f"{where}: no global batch size or sequence length in the test or model")
    steps = _as_int(steps, steps_key, where)
    # CloudAI's NeMoRun metric averages steps 80-100: time the last 20 steps
    warmup = max(steps - 20, 1) if steps > 21 else max(steps // 2, 1)
    layers = args.pop("num_layers", None)
    if layers is not None and int(first("cmd_args.num_layers", layers, "")) != model.get(
        "num_layers"
    ):
        model["num_layers"] = int(first("cmd_args.num_layers", layers, ""))
        notes.append("num_layers taken from the test (it differs from the example model)")
    semantics = {
        "global_batch_size": int(gbs),
        "seq_length": int(seq),
        "steps": steps,
        "warmup_steps": warmup,
        "precision": base_sem.get("precision", "bf16"),
    }

    # --- resources --------------------------------------------------------------------------
    nodes_v = run.get("num_nodes", args.pop("trainer.num_nodes", None) or 1)
    args.pop("trainer.num_nodes", None)
    nodes = _as_int(
        first("num_nodes", nodes_v, "dse runs one world size per study"), "num_nodes", where
    )
    gpn = args.pop("gpus_per_node", None) if workload == "bridge" else None
    num_gpus = args.pop("num_gpus", None) if workload == "bridge" else None
    gpn = int(gpus_per_node or gpn or 8)
    if gpus_per_node is None and workload == "nemo":
        notes.append("8 GPUs per node assumed (CloudAI's NeMoRun rule); set --gpus-per-node")
    world = int(num_gpus) if num_gpus else nodes * gpn
    resources: dict[str, Any] = {"world_size": world, "gpus_per_node": min(gpn, world)}
    gpu_type = args.pop("gpu_type", None)
    if gpu_type:
        resources["gpu"] = _GPU_NAMES.get(str(gpu_type).lower(), str(gpu_type))
    resources["device"] = "cuda"
    resources["features"] = "detect"

    # --- knobs, fixed knobs and recipe overrides ------------------------------------------
    for k, v in args.items():
        ck = f"cmd_args.{k}"
        knob = knob_map.get(k)
        if k == "hf_token":
            unmapped.append(Unmapped(ck, "<not copied>", "a secret: give it in the environment"))
            continue
        if knob is None:
            if swept(k, v):
                unmapped.append(Unmapped(ck, v, "a list over a field dse has no knob for"))
            elif workload == "nemo":
                overrides[k] = v  # the recipe's own override syntax (NeMo-Run dotted paths)
            else:
                unmapped.append(
                    Unmapped(ck, v, "a MegatronBridge script argument dse has no knob for")
                )
            continue
        vals = v if isinstance(v, list) else [v]
        if knob == "virtual_pipeline_model_parallel_size":
            vals = [None if x in (None, 1) else x for x in vals]
        kb = get_knob(knob)
        bad = [x for x in vals if x is not None and kb.check_value(x)]
        if bad:
            unmapped.append(
                Unmapped(ck, v, f"not a value of the knob {knob}: {kb.check_value(bad[0])}")
            )
            continue
        if swept(k, v) and len(set(map(str, vals))) > 1:
            knobs[knob] = {"values": vals, "baseline": vals[0]}
        elif vals[0] is not None:
            fixed[knob] = vals[0]

    for var, v in _flatten(test.get("extra_env_vars") or {}).items():
        why = check_env_var(var)
        if why:
            unmapped.append(Unmapped(f"extra_env_vars.{var}", v, why))
        elif isinstance(v, list) and len(v) > 1:
            env_knobs[var] = {"values": v, "baseline": v[0]}
        else:
            env_fixed[var] = v[0] if isinstance(v, list) else v

    if not knobs and not env_knobs:
        # a test that sweeps nothing: its own values become one-value knobs to widen
        for name in list(fixed):
            if name in ("tensor_model_parallel_size", "micro_batch_size"):
                knobs[name] = {"values": [fixed.pop(name)]}
        notes.append("the test sweeps nothing: widen the knobs' values to explore")
        if not knobs:
            knobs["micro_batch_size"] = {"values": [1]}

    # --- agent, objective, budget ---------------------------------------------------------
    agent_name = run.get("agent", test.get("agent", "grid_search"))
    agent = {"name": "grid"} if agent_name == "grid_search" else {"name": "tpe"}
    if agent_name != "grid_search":
        unmapped.append(Unmapped("agent", agent_name, "not a CloudAI agent dse has; tpe used"))
    metrics = run.get("agent_metrics", test.get("agent_metrics", ["default"]))
    metric = str(metrics[0]) if metrics else "default"
    if metric == "default":
        metric = "step-time" if workload == "nemo" else "tflops-per-gpu"
    obj = _METRICS.get(metric)
    if obj is None:
        unmapped.append(Unmapped("agent_metrics", metrics, "no dse metric; tflops_per_gpu used"))
        obj = ("tflops_per_gpu", "maximize")
    n_configs = 1
    for spec in [*knobs.values(), *env_knobs.values()]:
        n_configs *= len(spec["values"])
    steps_budget = run.get("agent_steps", test.get("agent_steps"))
    budget: dict[str, Any] = {"n_trials": int(steps_budget or n_configs)}
    tl = run.get("time_limit")
    if isinstance(tl, str) and tl.count(":") == 2:
        h, m, s = (int(x) for x in tl.split(":"))
        budget["trial_timeout_s"] = float(h * 3600 + m * 60 + s)

    space: dict[str, Any] = {
        "version": 1,
        "study": str(run.get("id") or test.get("name") or src.stem).replace(".", "-"),
        "recipe": f"CloudAI {template} {test.get('name', '')}".strip(),
        "model": model,
        "semantics": semantics,
        "resources": resources,
        "knobs": knobs,
        "fixed": fixed,
    }
    if env_fixed or env_knobs:
        space["env"] = {"fixed": env_fixed} if env_fixed else {}
        if env_knobs:
            space["env"]["knobs"] = env_knobs
    if overrides:
        launcher["overrides"] = overrides
    space.update(
        {
            "objective": {"metric": obj[0], "direction": obj[1]},
            "budget": budget,
            "agent": agent,
            "workload": {"name": workload, "launcher": launcher},
            "prescreen": {"enabled": False},
        }
    )
    for k in ("extra_container_mounts", "git_repos", "nsys", "env_params"):
        for holder in (test, run):
            if holder.get(k):
                unmapped.append(Unmapped(k, holder[k], "CloudAI-specific; not part of a trial"))
    return CloudAIImport(space, unmapped, notes)


def export_test(space: Any, params: dict[str, Any], name: str) -> dict[str, Any]:
    """A CloudAI test definition (scalar fields) that runs ``params`` of a launcher space.

    Raises:
        SpaceError: the space's workload has no CloudAI test template.
    """
    from dse.knobs import trial_env

    wl = space.workload
    if wl.name not in ("nemo", "bridge") or wl.launcher is None:
        raise SpaceError(
            f"study {space.study!r}: workload {wl.name!r} has no CloudAI test template "
            "(nemo -> NeMoRun, bridge -> MegatronBridge)"
        )
    full = space.full_params(params)
    knob_params = {k: v for k, v in full.items() if not k.startswith("env.")}
    res, sem = space.resources, space.semantics
    nodes = max(1, res.world_size // (res.gpus_per_node or res.world_size))
    cmd: dict[str, Any] = {}
    if wl.name == "nemo":
        template = "NeMoRun"
        cmd["docker_image_url"] = wl.launcher.container_image or ""
        cmd["task"] = "pretrain"
        cmd["recipe_name"] = wl.launcher.recipe or ""
        cmd["num_layers"] = space.model.num_layers
        inv = {v: k for k, v in NEMO_RUN_KNOBS.items()}
        flat: dict[str, Any] = {
            "data.micro_batch_size": None,
            "data.global_batch_size": sem.global_batch_size,
            "data.seq_length": sem.seq_length,
            "trainer.max_steps": sem.steps,
            "trainer.num_nodes": nodes,
        }
        for k, v in knob_params.items():
            if k in inv and v is not None:
                flat[inv[k]] = v
        for k, v in wl.launcher.overrides.items():
            if v is not None and k not in flat:
                flat[k] = v
        for k, v in flat.items():
            if v is None:
                continue
            node = cmd
            *parts, leaf = k.split(".")
            for p in parts:
                node = node.setdefault(p, {})
            node[leaf] = v
    else:
        template = "MegatronBridge"
        cmd["container_image"] = wl.launcher.container_image or ""
        model_name, _, size = (wl.launcher.recipe or "").partition("_")
        cmd["model_name"] = model_name
        cmd["model_size"] = size.split("_pretrain")[0]  # qwen3_30b_a3b_pretrain_..._config
        cmd["task"] = "pretrain"
        cmd["num_gpus"] = res.world_size
        cmd["gpus_per_node"] = res.gpus_per_node or res.world_size
        cmd["gb"] = sem.global_batch_size
        inv = {v: k for k, v in BRIDGE_KNOBS.items()}
        for k, v in knob_params.items():
            if k in inv:
                cmd[inv[k]] = 1 if v is None and k == "virtual_pipeline_model_parallel_size" else v
    out: dict[str, Any] = {
        "name": name,
        "description": f"best configuration of dse study {space.study}",
        "test_template_name": template,
        "cmd_args": cmd,
    }
    env = trial_env(full, space.env.fixed)
    if env:
        out["extra_env_vars"] = env
    return out


def dump_toml(data: dict[str, Any]) -> str:
    """TOML text of a CloudAI test (tables after scalars; strings, numbers, booleans)."""
    import json

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        return json.dumps(str(v))

    lines: list[str] = []

    def table(d: dict[str, Any], path: str) -> None:
        for k, v in d.items():
            if not isinstance(v, dict):
                lines.append(f"{k} = {scalar(v)}")
        for k, v in d.items():
            if isinstance(v, dict):
                sub = f"{path}.{k}" if path else k
                lines.append("")
                lines.append(f"[{sub}]")
                table(v, sub)

    table(data, "")
    return "\n".join(lines) + "\n"
