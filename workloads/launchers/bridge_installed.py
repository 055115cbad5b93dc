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

__all__ = ["LOOKUP_TIMEOUT_S", "bridge_installed", "recipe_problem"]

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
    try:
        r = subprocess.run(
            [python or sys.executable, "-c", _LOOKUP, name],
            capture_output=True, text=True, timeout=LOOKUP_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return None
    out = json.loads(lines[-1])
    if not out.get("importable") or out.get("found"):
        return None
    near = [n for n in out.get("exported") or [] if n.split("_")[0] == name.split("_")[0]]
    hint = f"; recipes of that family it has: {', '.join(near[:8])}" if near else ""
    return (
        f"the installed Megatron-Bridge has no recipe {name!r} (not in "
        f"megatron.bridge.recipes, its <family>.h100 modules, or megatron.bridge.perf_recipes)"
        f"{hint}"
    )
