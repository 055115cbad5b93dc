"""dse's NeMo 2.0 overrides resolved by the real NeMo, where an interpreter has it installed.

NeMo 2.0 (``nemo.collections.llm``, last released in nemo-toolkit 2.7.3) builds a recipe as a
NeMo-Run ``run.Partial``; dse's NeMo launcher (:mod:`dse.workloads.launchers.nemo`) renders
``KEY=VALUE`` overrides of it. Before a run, NeMo rewrites part of what it was given:
``MegatronStrategy.connect`` copies the strategy's parallel sizes into ``model.config``
(``_strategy_lib.set_model_parallel_attributes``), the precision plugin's dtypes into the
model, optimizer and DDP configs, and the optimizer's ``use_distributed_optimizer`` into the
DDP config; the model's ``TransformerConfig`` refuses invalid combinations at construction.

:func:`resolve` asks a child interpreter with NeMo (``DSE_NEMO_PYTHON``, or this one where NeMo
imports) to build each recipe through its own factory (``llm.<recipe>.pretrain_recipe``),
apply the overrides through NeMo-Run's config objects, build the strategy, the model and the
optimizer with Fiddle, connect them as NeMo's trainer does, and read every field back: a value
that differs from what dse set is a mismatch naming the field and where it was read (the
strategy's parallel fields are read from the model's config too, what the model is built
with). No GPU and no data are needed (the data module is not built: its fields are read from
the recipe). Without Transformer Engine the model's config refuses TE-only fusions
(``apply_rope_fusion``) at construction: those are turned off, where dse did not set them,
and said in ``notes``. Where no interpreter has NeMo, the answer says so
(``importable: false``) and nothing is checked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["RESOLVE_TIMEOUT_S", "mismatch_reasons", "nemo_python", "resolve"]

#: Seconds the child may take (importing NeMo takes 15-45 s on a 2-core machine).
RESOLVE_TIMEOUT_S = 600

_RESOLVE = r"""
import ast, json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
reqs = json.loads(sys.stdin.read())
try:
    import fiddle as fdl
    from nemo.collections import llm
except Exception as e:
    print(json.dumps({"importable": False, "error": f"{type(e).__name__}: {e}"}))
    raise SystemExit(0)
results = []
for req in reqs:
    out = {"recipe": req["recipe"], "mismatches": [], "resolved": {}, "error": None, "notes": []}
    results.append(out)
    try:
        family = getattr(llm, req["recipe"])
        task = req.get("task", "pretrain")
        factory = family.pretrain_recipe if task == "pretrain" else family.finetune_recipe
        recipe = factory(
            name="dse",
            dir=__import__("tempfile").mkdtemp(prefix="dse-nemo-"),
            num_nodes=req.get("num_nodes", 1),
            num_gpus_per_node=req.get("gpus_per_node", 8),
        )
        asked = {}
        for item in req["overrides"]:
            key, _, text = item.partition("=")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
            *parents, leaf = key.split(".")
            obj = recipe
            for p in parents:
                obj = getattr(obj, p)
            setattr(obj, leaf, value)
            asked[key] = value
        notes = []
        try:
            import transformer_engine  # noqa: F401
        except Exception:
            # without Transformer Engine the config refuses TE-only fusions at construction
            for f in ("apply_rope_fusion",):
                if getattr(recipe.model.config, f, False) and f"model.config.{f}" not in asked:
                    setattr(recipe.model.config, f, False)
                    notes.append(
                        f"model.config.{f}=False (no Transformer Engine here; not set by dse)"
                    )
        out["notes"] = notes
        strategy = fdl.build(recipe.trainer.strategy)
        plugins = recipe.trainer.plugins
        if plugins is not None:
            strategy._precision_plugin = fdl.build(plugins)
        model = fdl.build(recipe.model)
        model.optim = fdl.build(recipe.optim)
        # NeMo copies its parallel and dtype settings into the configs here
        strategy.connect(model)
        where = {
            "trainer.strategy.ddp": strategy.ddp_config,
            "trainer.strategy": strategy,
            "model.config": model.config,
            "optim.config": model.optim.config,
        }
        for key, want in asked.items():
            head, _, leaf = key.rpartition(".")
            if head in where:
                objs = [(head, where[head])]
                if head == "trainer.strategy" and hasattr(model.config, leaf):
                    objs.append(("model.config", model.config))  # what the model is built with
            else:
                obj = recipe
                for p in head.split("."):
                    obj = getattr(obj, p)
                objs = [(head, obj)]
            for name, obj in objs:
                if not hasattr(obj, leaf):
                    continue
                got = getattr(obj, leaf)
                plain = isinstance(got, (bool, int, float, str, type(None), list))
                got_j = got if plain else repr(got)
                out["resolved"][f"{name}.{leaf}"] = got_j
                if got != want and not (isinstance(want, list) and list(got or []) == want):
                    out["mismatches"].append(
                        {"field": key, "read_from": f"{name}.{leaf}", "asked": want,
                         "resolved": got_j}
                    )
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {str(e)[:400]}"
print(json.dumps({"importable": True, "results": results}, default=str))
"""


def nemo_python() -> str | None:
    """The interpreter that has NeMo 2.0: ``DSE_NEMO_PYTHON``, else this one if it finds
    ``nemo``; None where neither."""
    env = os.environ.get("DSE_NEMO_PYTHON")
    if env:
        return env
    return sys.executable if importlib.util.find_spec("nemo") is not None else None


def resolve(
    requests: Sequence[dict[str, Any]],
    *,
    python: str | None = None,
    timeout_s: float = RESOLVE_TIMEOUT_S,
) -> dict[str, Any]:
    """Each request (``recipe``: the NeMo factory module, ``overrides``: dse's ``KEY=VALUE``
    list, optional ``task``, ``num_nodes``, ``gpus_per_node``) resolved by NeMo: ``{"importable":
    bool, "results": [{"recipe", "mismatches", "resolved", "error", "notes"}], "error"}``."""
    exe = python or nemo_python()
    if exe is None:
        return {"importable": False, "error": "no interpreter with NeMo 2.0 (set DSE_NEMO_PYTHON)"}
    proc = subprocess.run(
        [exe, "-c", _RESOLVE],
        input=json.dumps(list(requests)),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"importable": False, "error": f"the NeMo child failed: {tail[:300]}"}
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def mismatch_reasons(result: dict[str, Any]) -> list[str]:
    """One line per field NeMo resolved to another value than dse set, or the error that
    stopped the recipe from resolving (a configuration NeMo refuses)."""
    out = [
        f"{m['field']}: dse set {m['asked']!r}, NeMo resolved {m['resolved']!r} "
        f"(read from {m['read_from']})"
        for m in result.get("mismatches", [])
    ]
    if result.get("error"):
        out.append(f"NeMo refused the recipe {result.get('recipe')!r}: {result['error']}")
    return out
