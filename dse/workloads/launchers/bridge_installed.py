"""Recipe names checked against the Megatron-Bridge installed where dse runs.

Bridge's ``run_recipe.py`` finds ``--recipe NAME`` as an exported function of
``megatron.bridge.recipes``, of a ``megatron.bridge.recipes.<family>.h100`` module, or of
``megatron.bridge.perf_recipes`` (``recipe_runner.load_recipe``); a name none of them has
stops the first trial with ``Recipe 'NAME' not found in megatron.bridge.recipes or
megatron.bridge.perf_recipes.`` Where Bridge is importable on the controller, ``dse validate``
and ``--dry-run`` look the name up the same way, in a child interpreter (importing Bridge pulls
in Megatron-Core, Transformer Engine where present and a model zoo; none of it stays in dse's
process). Where it is not installed or does not import, nothing is said here and the first
trial fails ``invalid`` with Bridge's own message (:data:`dse.workloads.logs.LOG_PATTERNS`).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

__all__ = ["LOOKUP_TIMEOUT_S", "bridge_installed", "resolve_recipe", "recipe_problem"]

#: Seconds the child interpreter may take to import Bridge and look the name up.
LOOKUP_TIMEOUT_S = 300

_LOOKUP = r"""
import importlib, json, pkgutil, sys
name = sys.argv[1]
try:
    import megatron.bridge.recipes as recipes
except Exception as e:  # Bridge installed but not importable here (e.g. no TE)
    print(json.dumps({"importable": False, "error": f"{type(e).__name__}: {e}"}))
    raise SystemExit(0)
found = callable(getattr(recipes, name, None))
for info in [] if found else pkgutil.iter_modules(recipes.__path__):
    if not info.ispkg or info.name.startswith("_") or info.name == "utils":
        continue
    try:
        mod = importlib.import_module(f"{recipes.__name__}.{info.name}.h100")
    except Exception:
        continue
    if callable(getattr(mod, name, None)):
        found = True
        break
if not found:
    try:
        perf = importlib.import_module("megatron.bridge.perf_recipes")
        found = callable(getattr(perf, name, None))
    except Exception:
        pass
exported = sorted(n for n in dir(recipes) if n.endswith("_config") and not n.startswith("_"))
print(json.dumps({"importable": True, "found": found, "exported": exported}))
"""


_RESOLVE = r"""
import copy, json, os, sys
os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("RANK", "0")
name, runs = sys.argv[1], json.loads(sys.stdin.read())
try:
    import megatron.bridge.recipes as recipes
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides
    from dse.workloads.launchers.bridge_entry import prepare_mixed_precision, resolved_fields
    build = getattr(recipes, name)
    base = build()
except Exception as e:
    print(json.dumps({"resolvable": False, "error": f"{type(e).__name__}: {e}"}))
    raise SystemExit(0)
out = []
for overrides in runs:
    cfg = copy.deepcopy(base)
    try:
        rest = prepare_mixed_precision(cfg, list(overrides), get_mixed_precision_config)
        cfg = process_config_with_overrides(cfg, cli_overrides=rest or None)
        runtime_config_update(cfg)
        out.append({"fields": resolved_fields(cfg)})
    except Exception as e:
        out.append({"error": f"{type(e).__name__}: {e}"})
print(json.dumps({"resolvable": True, "runs": out}))
"""


def resolve_recipe(
    name: str, argvs: list[list[str]], *, python: str | None = None
) -> list[dict[str, Any]] | None:
    """Resolve the recipe on this machine for each command of ``argvs``: its ``KEY=VALUE``
    overrides applied as dse's entry script applies them, then Bridge's
    ``runtime_config_update``. One ``{"fields": {...}}`` (the resolved fields) or
    ``{"error": "..."}`` per command; None when the recipe cannot be resolved here (Bridge
    not installed or not importable, the recipe not an exported function)."""
    if not bridge_installed() or not argvs:
        return None
    runs = [[a for a in argv if "=" in a and not a.startswith("-")] for argv in argvs]
    out = _probe(_RESOLVE, name, python, stdin=json.dumps(runs))
    return list(out["runs"]) if out and out.get("resolvable") else None


def _probe(
    script: str, name: str, python: str | None, *, stdin: str | None = None
) -> dict[str, Any] | None:
    """Run ``script`` with ``name`` in a child interpreter; its last JSON line (None: it did
    not start, failed or printed none)."""
    try:
        r = subprocess.run(
            [python or sys.executable, "-c", script, name], input=stdin,
            capture_output=True, text=True, timeout=LOOKUP_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return None
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def bridge_installed() -> bool:
    """Whether a ``megatron.bridge`` package is on this interpreter's path (not imported)."""
    try:
        return importlib.util.find_spec("megatron.bridge") is not None
    except (ImportError, ValueError):
        return False


def recipe_problem(name: str, *, python: str | None = None) -> str | None:
    """Why the installed Bridge cannot run ``--recipe name`` (None: it has it, or no Bridge
    is importable here to ask)."""
    if not bridge_installed():
        return None
    out = _probe(_LOOKUP, name, python)
    if out is None or not out.get("importable") or out.get("found"):
        return None
    near = [n for n in out.get("exported") or [] if n.split("_")[0] == name.split("_")[0]]
    hint = f"; recipes of that family it has: {', '.join(near[:8])}" if near else ""
    return (
        f"the installed Megatron-Bridge has no recipe {name!r} (not in "
        f"megatron.bridge.recipes, its <family>.h100 modules, or megatron.bridge.perf_recipes)"
        f"{hint}"
    )
