"""Extract NeMo 2.0 recipes' default global batch size, sequence length and layout.

A CloudAI NeMoRun test that sets no ``data.seq_length`` / ``data.global_batch_size`` runs
with the values of its NeMo 2.0 recipe (``nemo/collections/llm/recipes/<name>.py``,
``pretrain_recipe``: the ``MockDataModule`` it configures, and the ``trainer(...)`` (or a
family's ``*_trainer(...)``) it builds, whose parallel sizes are the module's ``trainer``
defaults unless the call gives them, a keyword naming one of ``pretrain_recipe``'s own
parameters read at that parameter's default).
``dse cloudai import`` takes them from the data file this writes
(``dse/space/catalog/nemo_recipe_defaults.yaml``). Nothing is imported: each recipe module
is read by AST at a pinned commit; a value that is not a constant is left out.

    python scripts/extract_nemo_recipe_defaults.py --repo PATH/TO/NeMo/.git --commit v2.4.0 \\
        -o dse/space/catalog/nemo_recipe_defaults.yaml
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract_upstream_common import GitTree  # noqa: E402

RECIPES = "nemo/collections/llm/recipes"
#: ``trainer()`` argument -> the knob it sets (NeMo's MegatronStrategy fields).
TRAINER_ARGS = {
    "tensor_parallelism": "tensor_model_parallel_size",
    "pipeline_parallelism": "pipeline_model_parallel_size",
    "virtual_pipeline_parallelism": "virtual_pipeline_model_parallel_size",
    "context_parallelism": "context_parallel_size",
    "sequence_parallelism": "sequence_parallel",
    "expert_parallelism": "expert_model_parallel_size",
}
DATA_ARGS = ("seq_length", "global_batch_size", "micro_batch_size")


def _const(e: ast.expr | None) -> Any:
    if isinstance(e, ast.Constant) and isinstance(e.value, (int, bool, type(None))):
        return e.value
    return ...


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _defaults(fn: ast.FunctionDef) -> dict[str, Any]:
    a = fn.args
    params = [*a.posonlyargs, *a.args]
    out = {}
    for p, d in zip(params[len(params) - len(a.defaults) :], a.defaults, strict=True):
        out[p.arg] = _const(d)
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out[p.arg] = _const(d)
    return out


def recipe_entry(text: str) -> dict[str, Any] | None:
    """The defaults of one recipe module's ``pretrain_recipe``, None without one."""
    tree = ast.parse(text)
    pre = _function(tree, "pretrain_recipe")
    if pre is None:
        return None
    out: dict[str, Any] = {}
    layout: dict[str, Any] = {}
    own = _defaults(pre)  # a keyword may pass one of pretrain_recipe's own parameters

    def value(e: ast.expr) -> Any:
        if isinstance(e, ast.Name) and e.id in own:
            return own[e.id]
        return _const(e)

    trainer = _function(tree, "trainer")
    if trainer is not None:
        for arg, v in _defaults(trainer).items():
            if arg in TRAINER_ARGS and v is not ...:
                layout[TRAINER_ARGS[arg]] = v
    for call in (n for n in ast.walk(pre) if isinstance(n, ast.Call)):
        fname = ast.unparse(call.func)
        if fname == "trainer" or fname.endswith("_trainer"):  # its own or a family's
            for kw in call.keywords:
                if kw.arg in TRAINER_ARGS:
                    v = value(kw.value)
                    if v is ...:
                        layout.pop(TRAINER_ARGS[kw.arg], None)  # not known statically
                    else:
                        layout[TRAINER_ARGS[kw.arg]] = v
        elif call.args and ast.unparse(call.args[0]) == "MockDataModule":
            for kw in call.keywords:
                if kw.arg in DATA_ARGS and value(kw.value) not in (..., None):
                    out[kw.arg] = value(kw.value)
    mbs = out.pop("micro_batch_size", None)
    if mbs is not None:
        layout["micro_batch_size"] = mbs
    if layout:
        out["layout"] = layout
    return out


HEADER = """\
# NeMo 2.0 recipes' default global batch size, sequence length and layout, read by
# `dse cloudai import` for a CloudAI NeMoRun test that leaves them to its recipe.
# Written by scripts/extract_nemo_recipe_defaults.py (AST of each recipe module's
# pretrain_recipe: its MockDataModule and the trainer() it builds; nothing imported);
# regenerate it with that script, do not edit by hand. A value that is not a constant
# there is left out.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a NeMo git directory")
    ap.add_argument("--commit", default="v2.4.0")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    tree = GitTree(args.repo, args.commit)
    names = tree._git("ls-tree", "--name-only", f"{tree.commit}:{RECIPES}").split()
    recipes: dict[str, Any] = {}
    for name in sorted(names):
        if not name.endswith(".py") or name.startswith("_"):
            continue
        got = recipe_entry(tree.read(f"{RECIPES}/{name}") or "")
        if got:
            recipes[name.removesuffix(".py")] = {**got, "path": f"{RECIPES}/{name}"}
    source = {"project": "NVIDIA/NeMo", "ref": args.commit, "commit": tree.commit,
              "commit_date": tree.date()}  # fmt: skip
    lines = [HEADER.rstrip("\n"), yaml.safe_dump({"source": source}, sort_keys=False)]
    lines.append("recipes:")
    for name, entry in recipes.items():
        flow = yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6)
        lines.append(f"  {name}: {flow.rstrip()}")
    args.output.write_text("\n".join(lines) + "\n")
    sys.stderr.write(f"{len(recipes)} NeMo recipes at {tree.commit}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
