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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dse.workloads.launchers._compare import Mismatch, compare

__all__ = [
    "PYTHON_ENV",
    "BEFORE_RUN_TIMEOUT_S",
    "CPU_ENTRY_MODULE",
    "BeforeRun",
    "RESOLVE_TIMEOUT_S",
    "mismatch_reasons",
    "mismatches",
    "nemo_python",
    "request_for",
    "resolvable",
    "resolve",
    "resolve_before_run",
]

#: The environment variable naming an interpreter that has NeMo 2.0.
PYTHON_ENV = "DSE_NEMO_PYTHON"
#: dse's module that runs NeMo's own factory recipe in-process, on the CPU too
#: (``workload.launcher.module``; :mod:`dse.workloads.megatron.nemo_cpu`): its overrides are
#: NeMo's, resolved as ``nemo llm pretrain``'s are.
CPU_ENTRY_MODULE = "dse.workloads.megatron.nemo_cpu"

#: Seconds the child may take (importing NeMo takes 15-45 s on a 2-core machine).
RESOLVE_TIMEOUT_S = 600
#: ... and before a trial: less than the runners' default hang timeout (300 s without a
#: metrics line), so a child that does not answer leaves the trial unchecked, not hung.
BEFORE_RUN_TIMEOUT_S = 240

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
    out = {"recipe": req["recipe"], "fields": {}, "resolved": {}, "error": None, "notes": []}
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
            reads = []
            for name, obj in objs:
                if not hasattr(obj, leaf):
                    continue
                got = getattr(obj, leaf)
                plain = isinstance(got, (bool, int, float, str, type(None), list))
                got_j = got if plain else repr(got)
                out["resolved"][f"{name}.{leaf}"] = got_j
                reads.append([f"{name}.{leaf}", got_j])
            out["fields"][key] = {"asked": want, "reads": reads}
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {str(e)[:400]}"
print(json.dumps({"importable": True, "results": results}, default=str))
"""


def nemo_python(env: Mapping[str, str] | None = None) -> str | None:
    """The interpreter that has NeMo 2.0: ``DSE_NEMO_PYTHON`` (of ``env``, else of this
    process), else this one if it finds ``nemo``; None where neither."""
    named = (env if env is not None else os.environ).get(PYTHON_ENV)
    if named:
        return named
    return sys.executable if importlib.util.find_spec("nemo") is not None else None


def resolvable(module: str | None, script: str | None) -> bool:
    """Whether a NeMo launcher command builds NeMo's factory recipe (``nemo llm``, or dse's
    :data:`CPU_ENTRY_MODULE`), which :func:`resolve` can rebuild; a module or script of the
    space's own may build anything."""
    return not script and module in (None, CPU_ENTRY_MODULE)


def request_for(recipe: str, task: str | None, argv: Sequence[str]) -> dict[str, Any] | None:
    """The resolve request of one rendered NeMo-Run command (``... --factory NAME -y
    KEY=VALUE ...``): its ``KEY=VALUE`` overrides, and the layout NeMo's factory is built
    with (``trainer.num_nodes``, ``trainer.devices``); None where ``argv`` has no ``-y``."""
    if "-y" not in argv:
        return None
    overrides = [a for a in argv[list(argv).index("-y") + 1 :] if "=" in a]
    fields = dict(o.split("=", 1) for o in overrides)
    return {
        "recipe": recipe,
        "task": task or "pretrain",
        "num_nodes": int(fields.get("trainer.num_nodes", 1)),
        "gpus_per_node": int(fields.get("trainer.devices", 8)),
        "overrides": overrides,
    }


def resolve(
    requests: Sequence[Mapping[str, Any]],
    *,
    python: str | None = None,
    timeout_s: float = RESOLVE_TIMEOUT_S,
) -> dict[str, Any]:
    """Each request (``recipe``: the NeMo factory module, ``overrides``: dse's ``KEY=VALUE``
    list, optional ``task``, ``num_nodes``, ``gpus_per_node``) resolved by NeMo: ``{"importable":
    bool, "results": [{"recipe", "fields", "resolved", "error", "notes"}], "error"}``; each
    field dse set has the value asked and where NeMo's objects were read for it (``fields``:
    ``{key: {"asked", "reads": [[read_from, value], ...]}}``)."""
    exe = python or nemo_python()
    if exe is None:
        return {"importable": False, "error": f"no interpreter with NeMo 2.0 (set {PYTHON_ENV})"}
    try:
        proc = subprocess.run(
            [exe, "-c", _RESOLVE],
            input=json.dumps(list(requests)),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"importable": False, "error": f"the NeMo child ({exe}) did not answer: {e}"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"importable": False, "error": f"the NeMo child failed: {tail[:300]}"}
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def mismatches(result: Mapping[str, Any]) -> list[Mismatch]:
    """Each field NeMo resolved to another value than dse set (:func:`compare`, the one
    comparison of every target), read where NeMo's trainer reads it; a field read elsewhere
    than its own key names where (``trainer.strategy.X (read from model.config.X)``). A
    field none of NeMo's objects has is not checked (its override would fail NeMo-Run)."""
    out: list[Mismatch] = []
    for key, entry in (result.get("fields") or {}).items():
        for where, got in entry.get("reads") or ():
            bad = compare({key: entry.get("asked")}, {key: got})
            if bad:
                name = key if where == key else f"{key} (read from {where})"
                out.append(Mismatch(name, bad[0].asked, bad[0].resolved))
                break
    return out


def mismatch_reasons(result: Mapping[str, Any]) -> list[str]:
    """One line per field NeMo resolved to another value than dse set, or the error that
    stopped the recipe from resolving (a configuration NeMo refuses)."""
    out = [
        f"{m.field}: dse set {m.asked!r}, NeMo resolved {m.resolved!r}" for m in mismatches(result)
    ]
    if result.get("error"):
        out.append(f"NeMo refused the recipe {result.get('recipe')!r}: {result['error']}")
    return out


@dataclass(frozen=True)
class BeforeRun:
    """One trial's overrides as NeMo resolved them before the trial ran them: the fields that
    differ, what resolved them (``origin``), the error where NeMo refused the configuration;
    or, where no interpreter here has NeMo 2.0, why nothing was checked (``why_not``)."""

    mismatches: tuple[Mismatch, ...] = ()
    origin: str = ""
    error: str | None = None
    why_not: str | None = None


def resolve_before_run(
    request: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> BeforeRun:
    """One trial's rendered overrides (:func:`request_for`) resolved by NeMo before the trial
    runs them (``env``: the trial's environment, which may name an interpreter in
    ``DSE_NEMO_PYTHON``)."""
    exe = nemo_python(env)
    if exe is None:
        return BeforeRun(
            why_not=f"no interpreter here has NeMo 2.0 ({PYTHON_ENV} unset, nemo not importable)"
        )
    got = resolve([request], python=exe, timeout_s=BEFORE_RUN_TIMEOUT_S)
    if not got.get("importable"):
        return BeforeRun(why_not=str(got.get("error") or "NeMo 2.0 did not import"))
    (res,) = got["results"]
    task = request.get("task") or "pretrain"
    return BeforeRun(
        mismatches=tuple(mismatches(res)),
        origin=f"NeMo's llm.{request['recipe']}.{task}_recipe after MegatronStrategy.connect",
        error=res.get("error"),
    )
