"""Extract the command-line flags of Megatron-LM's argument parser at a pinned commit.

Reads ``megatron/training/arguments.py`` of a Megatron-LM git clone by AST: every
``add_argument(...)`` call (its flags, whether it takes a value, its literal or enum
choices), and every ``ArgumentGroupFactory(ConfigClass, exclude=[...])`` group, whose flags
Megatron-LM derives from the dataclass fields (``megatron/training/argument_utils.py``: a
field ``foo_bar`` is ``--foo-bar``; a bool field that defaults to False is a switch
``--foo-bar``, any other bool ``--no-foo-bar`` / ``--disable-foo-bar``; a field's
``argparse_meta`` metadata may rename it). Writes a JSON data file with the commit.

    python scripts/extract_upstream_megatron_lm.py --repo PATH/TO/Megatron-LM/.git \\
        --commit 55ac7082517c3878ae653c07c09c534b8aed49f6 \\
        -o tests/fixtures/upstream/megatron_lm_args.json
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract_upstream_common import DataField, GitTree, Source, literal_strings  # noqa: E402

ARGUMENTS = "megatron/training/arguments.py"
ARGUMENTS_MODULE = "megatron.training.arguments"
#: core_v0.16.1, the Megatron-Core release the built-in trainer runs.
DEFAULT_COMMIT = "55ac7082517c3878ae653c07c09c534b8aed49f6"
NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}

Flag = dict[str, Any]


def _kw(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _choices(src: Source, node: ast.expr | None) -> list[str] | None:
    lit = literal_strings(node)
    if lit is not None:
        return lit
    # choices=list(SomeEnum): the parser's type maps a member name to the member
    if (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) == "list"
        and node.args
        and isinstance(node.args[0], ast.Name)
    ):
        return src.enum_members(ARGUMENTS_MODULE, node.args[0].id)
    return None


def _annotation_choices(src: Source, owner: str, annotation: str) -> list[str] | None:
    tree = ast.parse(annotation, mode="eval").body
    while isinstance(tree, ast.Subscript) and ast.unparse(tree.value) in (
        "Optional",
        "typing.Optional",
    ):
        tree = tree.slice
    if isinstance(tree, ast.BinOp):  # X | None
        left = tree.left if ast.unparse(tree.right) == "None" else None
        if left is not None:
            tree = left
    if isinstance(tree, ast.Subscript) and ast.unparse(tree.value) in (
        "Literal",
        "typing.Literal",
    ):
        elts = tree.slice.elts if isinstance(tree.slice, ast.Tuple) else [tree.slice]
        vals = [e.value for e in elts if isinstance(e, ast.Constant)]
        return [str(v) for v in vals]
    if isinstance(tree, ast.Name):
        return src.enum_members(owner.split(":")[0], tree.id)
    return None


def _is_bool(annotation: str) -> bool:
    a = annotation.replace(" ", "")
    return a in ("bool", "Optional[bool]", "bool|None", "None|bool", "Union[bool,None]")


def factory_flags(src: Source, f: DataField) -> dict[str, Flag]:
    """The flags ``ArgumentGroupFactory`` adds for one dataclass field."""
    names = ["--" + f.name.replace("_", "-")]
    takes_value = True
    choices = None
    if _is_bool(f.annotation):
        takes_value = False
        off_by_default = isinstance(f.default, ast.Constant) and f.default.value is False
        if not off_by_default:
            stem = f.name.replace("_", "-")
            names = [f"--no-{stem}", f"--disable-{stem}"]
    else:
        choices = _annotation_choices(src, f.owner, f.annotation)
    if isinstance(f.metadata, ast.Dict):  # argparse_meta overrides what was inferred
        for k, v in zip(f.metadata.keys, f.metadata.values, strict=True):
            if (
                isinstance(k, ast.Constant)
                and k.value == "argparse_meta"
                and isinstance(v, ast.Dict)
            ):
                meta = {
                    mk.value: mv
                    for mk, mv in zip(v.keys, v.values, strict=True)
                    if isinstance(mk, ast.Constant)
                }
                renamed = literal_strings(meta.get("arg_names"))
                if renamed:
                    names = renamed
                action = meta.get("action")
                if isinstance(action, ast.Constant):
                    takes_value = action.value not in NO_VALUE_ACTIONS
                if "choices" in meta:
                    choices = _choices(src, meta["choices"])
    return {n: {"takes_value": takes_value, "choices": choices, "dest": f.name} for n in names}


def extract(tree: GitTree) -> dict[str, Any]:
    src = Source([("megatron", tree, "")])
    got = src.module(ARGUMENTS_MODULE)
    if got is None:
        raise SystemExit(f"{ARGUMENTS} not found at {tree.commit}")
    module, _ = got
    flags: dict[str, Flag] = {}
    groups: dict[str, list[str]] = {}
    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        fn = ast.unparse(node.func)
        kw = _kw(node)
        if fn.endswith(".add_argument"):
            names = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("-")
            ]
            action = kw.get("action")
            takes_value = not (
                isinstance(action, ast.Constant) and action.value in NO_VALUE_ACTIONS
            )
            nargs = kw.get("nargs")
            if isinstance(nargs, ast.Constant) and nargs.value == 0:
                takes_value = False
            choices = _choices(src, kw.get("choices"))
            for n in names:
                flags[n] = {"takes_value": takes_value, "choices": choices}
        elif fn == "ArgumentGroupFactory" and node.args and isinstance(node.args[0], ast.Name):
            cls = node.args[0].id
            exclude = set(literal_strings(kw.get("exclude")) or [])
            hit = src.resolve(ARGUMENTS_MODULE, cls)
            if hit is None:
                raise SystemExit(f"ArgumentGroupFactory({cls}): class not found")
            added: list[str] = []
            for f in src.fields(ARGUMENTS_MODULE, cls).values():
                if f.name in exclude or not f.init:
                    continue
                for n, spec in factory_flags(src, f).items():
                    flags[n] = {"takes_value": spec["takes_value"], "choices": spec["choices"]}
                    added.append(n)
            groups[f"{hit[0]}:{cls}"] = sorted(added)
    return {
        "source": "NVIDIA/Megatron-LM",
        "commit": tree.commit,
        "commit_date": tree.date(),
        "file": ARGUMENTS,
        "extracted_by": "scripts/extract_upstream_megatron_lm.py (AST of add_argument calls "
        "and ArgumentGroupFactory dataclass groups)",
        "flags": dict(sorted(flags.items())),
        "dataclass_groups": groups,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a Megatron-LM git directory (a clone's .git)")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    data = extract(GitTree(args.repo, args.commit))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    sys.stderr.write(f"{len(data['flags'])} flags of {data['file']} at {data['commit']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
