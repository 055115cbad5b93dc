"""A dse configuration -> a CloudAI test TOML (:func:`export_test`, :func:`export_test_full`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dse.core.exceptions import SpaceError
from dse.interop.cloudai._common import (
    _GPU_NAMES,
    _MIXED_PRECISION,
    _TEMPLATES,
    BRIDGE_KNOBS,
    COMPUTE_DTYPES,
    NEMO_RUN_KNOBS,
)
from dse.interop.cloudai.importer import _recipe_key, bridge_recipe_parts
from dse.space.knobs import trial_env
from dse.workloads.launchers._core import NotTaken, launcher_for

# --- export -------------------------------------------------------------------------------


@dataclass
class CloudAIExport:
    """A CloudAI test and what of the configuration it could not carry."""

    test: dict[str, Any]
    not_taken: list[tuple[str, Any, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _cloudai_list(mods: Any) -> str:
    return "[" + ", ".join(m for m in str(mods or "").split(",") if m) + "]"


def _launcher_overrides(space: Any, params: Mapping[str, Any], out: CloudAIExport) -> list[str]:
    """The recipe launcher's own overrides for ``params`` (knobs it cannot take are named
    and left out)."""

    launcher = launcher_for(space)
    rest = dict(params)
    for _ in range(len(rest) + 1):
        try:
            return launcher.knob_overrides(rest)
        except NotTaken as e:
            out.not_taken.append((e.knob, e.value, e.why))
            rest.pop(e.knob, None)
    return []


def export_test(space: Any, params: dict[str, Any], name: str) -> dict[str, Any]:
    """A CloudAI test definition (scalar fields) that runs ``params`` of a launcher space."""
    return export_test_full(space, params, name).test


def export_test_full(space: Any, params: Mapping[str, Any], name: str) -> CloudAIExport:
    """:func:`export_test` with the knobs the target could not take, and notes.

    Raises:
        SpaceError: the space's workload has no CloudAI test template.
    """

    wl = space.workload
    if wl.name not in ("nemo", "bridge") or wl.launcher is None:
        raise SpaceError(
            f"study {space.study!r}: workload {wl.name!r} has no CloudAI test template "
            "(nemo -> NeMoRun, bridge -> MegatronBridge)"
        )
    out = CloudAIExport({})
    full = space.active_config(params)  # no value that does nothing there
    set_names = set(space.knobs) | set(space.fixed) | set(space.derived)
    knob_params = {k: v for k, v in full.items() if not k.startswith("env.") and k in set_names}
    res, sem = space.resources, space.semantics
    nodes = max(1, res.world_size // (res.gpus_per_node or res.world_size))
    cmd: dict[str, Any] = {}
    test: dict[str, Any] = {
        "name": name,
        "description": f"best configuration of dse study {space.study}",
        "test_template_name": _TEMPLATES[wl.name],
        "cmd_args": cmd,
    }
    src = wl.launcher.cloudai
    named = dict(src.recipe_fields) if src is not None else {}
    if wl.name == "nemo":
        cmd["docker_image_url"] = wl.launcher.container_image or ""
        cmd["task"] = wl.launcher.task or "pretrain"
        cmd["recipe_name"] = wl.launcher.recipe or ""
        given = named.get("recipe_name")
        if given is not None and _recipe_key(given) == cmd["recipe_name"]:
            cmd["recipe_name"] = given  # the test's own factory name (cloudai_..._recipe)
        cmd["num_layers"] = space.model.num_layers
        inv = {v: k for k, v in NEMO_RUN_KNOBS.items()}
        flat: dict[str, Any] = {
            "data.global_batch_size": sem.global_batch_size,
            "data.seq_length": sem.seq_length,
            "trainer.max_steps": sem.steps,
            "trainer.num_nodes": nodes,
        }
        rest: dict[str, Any] = {}
        for k, v in knob_params.items():
            if k in inv:
                if v is not None:
                    flat[inv[k]] = v
            else:
                rest[k] = v
        for item in _launcher_overrides(space, rest, out):
            key, _, text = item.partition("=")
            flat.setdefault(key, _literal(text))
        for k, v in wl.launcher.overrides.items():
            flat.setdefault(k, v)
        for k, v in flat.items():
            if v is None:
                out.notes.append(f"{k}: None (the recipe's default) left out; TOML has no null")
                continue
            node = cmd
            *parts, leaf = k.split(".")
            for p in parts:
                node = node.setdefault(p, {})
            node[leaf] = v
    else:
        recipe = wl.launcher.recipe or ""
        parts_ = bridge_recipe_parts(recipe)
        cmd["container_image"] = wl.launcher.container_image or ""
        cmd["model_family_name"] = parts_["model_family_name"]
        cmd["model_recipe_name"] = parts_["model_recipe_name"]
        if named.get("model_recipe_name") == parts_["model_recipe_name"]:
            for k in ("model_family_name", "model_recipe_name"):  # as the test wrote them
                if k in named:
                    cmd[k] = named[k]
        cmd["task"] = parts_["task"]
        gpu = _gpu_type(res.gpu)
        if gpu:
            cmd["gpu_type"] = gpu
        cmd["num_gpus"] = res.world_size
        cmd["domain"] = "llm"
        cmd["hf_token"] = ""  # CloudAI reads HF_TOKEN from the environment when empty
        cmd["gb"] = sem.global_batch_size
        cmd["seq_length"] = sem.seq_length
        cmd["max_steps"] = sem.steps
        test["description"] += f" (Megatron-Bridge recipe {recipe})"
        handled: set[str] = set()
        inv = {v: k for k, v in BRIDGE_KNOBS.items()}
        for k, v in knob_params.items():
            if k in inv:
                if k == "virtual_pipeline_model_parallel_size" and v is None:
                    v = 1
                if v is not None:
                    cmd[inv[k]] = v
                    handled.add(k)
        scope = knob_params.get("cuda_graph_scope")
        if "cuda_graph_scope" in knob_params:
            handled.add("cuda_graph_scope")
            if scope is not None:
                cmd["cuda_graph_scope"] = _cloudai_list(scope)
        rec = knob_params.get("recompute")
        if rec in ("none", "selective"):
            cmd["recompute_modules"] = (
                _cloudai_list(knob_params.get("recompute_modules") or "core_attn")
                if rec == "selective"
                else "[]"
            )
            handled |= {"recompute", "recompute_modules"}
        fp8 = (
            knob_params.get("fp8"),
            knob_params.get("fp8_recipe") if knob_params.get("fp8") else None,
        )
        mp = wl.launcher.overrides.get("mixed_precision")
        dtype = next((d for d, pair in COMPUTE_DTYPES.items() if pair == fp8), None)
        if fp8 == (None, None) and isinstance(mp, str) and mp in _MIXED_PRECISION:
            dtype = _MIXED_PRECISION[mp]
        if dtype is not None and dtype != "fp8_ds":
            cmd["compute_dtype"] = dtype
            handled |= {"fp8", "fp8_recipe"}
        elif dtype == "fp8_ds" or fp8[0] is not None:
            out.not_taken.append(
                (
                    "fp8",
                    fp8,
                    "no CloudAI compute_dtype is this FP8 recipe (bf16, fp8_cs, fp8_mx, fp8_sc)",
                )
            )
            handled |= {"fp8", "fp8_recipe"}
        extra: dict[str, str] = {}
        rest = {k: v for k, v in knob_params.items() if k not in handled}
        for item in _launcher_overrides(space, rest, out):
            key, _, text = item.partition("=")
            extra[key] = text
        for k, v in wl.launcher.overrides.items():
            if k == "mixed_precision" and "compute_dtype" in cmd:
                continue
            if v is not None:
                extra.setdefault(k, v if isinstance(v, str) else _hydra(v))
        if extra:
            test["extra_cmd_args"] = extra
        if not (src is not None and src.git_repos):
            test["git_repos"] = [
                {"url": "https://github.com/NVIDIA-NeMo/Megatron-Bridge.git", "commit": "main"}
            ]
            out.notes.append(
                "git_repos: CloudAI's MegatronBridge needs the Megatron-Bridge repository; pin "
                "the commit the study ran"
            )
        out.notes.append(
            f"CloudAI runs Megatron-Bridge's performance launcher, which picks the recipe from "
            f"model_recipe_name {parts_['model_recipe_name']!r}, task {parts_['task']!r}, "
            f"num_gpus, gpu_type and compute_dtype; the study ran {recipe!r}"
        )
    if src is not None and src.git_repos:
        test["git_repos"] = [dict(r) for r in src.git_repos]  # as the test pinned them
    env = trial_env(full, space.env.fixed)
    if "vboost" in space.env.node_steps:
        if wl.name == "bridge":
            cmd["enable_vboost"] = True
        else:
            env["ENABLE_VBOOST"] = "1"
    if env:
        test["extra_env_vars"] = env
    out.test = test
    return out


def _hydra(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, list):
        return "[" + ",".join(_hydra(x) for x in v) + "]"
    return str(v)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _gpu_type(gpu: str | None) -> str | None:
    if not gpu:
        return None
    for short, full in _GPU_NAMES.items():
        if gpu == full:
            return short
    up = gpu.upper()
    for short in sorted(_GPU_NAMES, key=len, reverse=True):
        if short.upper() in up:
            return short
    return None


def dump_toml(data: dict[str, Any]) -> str:
    """TOML text of a CloudAI test (tables after scalars, lists of tables as ``[[...]]``;
    strings, numbers, booleans)."""
    import json

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        return json.dumps(str(v))

    def key(k: str) -> str:
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)

    def is_tables(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    lines: list[str] = []

    def table(d: dict[str, Any], path: str) -> None:
        for k, v in d.items():
            if not isinstance(v, dict) and not is_tables(v):
                lines.append(f"{key(k)} = {scalar(v)}")
        for k, v in d.items():
            sub = f"{path}.{key(k)}" if path else key(k)
            if isinstance(v, dict):
                lines.append("")
                lines.append(f"[{sub}]")
                table(v, sub)
            elif is_tables(v):
                for item in v:
                    lines.append("")
                    lines.append(f"[[{sub}]]")
                    table(item, sub)

    table(data, "")
    return "\n".join(lines) + "\n"


def figure_label(payload: Mapping[str, Any]) -> str:
    """The best figure of a ``dse best`` payload with where it comes from: measured, a
    replayed measurement, or an estimate (the cost model or the sim workload)."""
    value = payload["objective"]["value"]
    source = payload.get("source")
    if source == "measured":
        return f"{value} (measured)"
    if source == "replay":
        return f"{value} (replayed from a measured table)"
    return f"{value} (estimate: {source or 'unknown source'}, not measured)"
