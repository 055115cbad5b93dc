"""Extract Megatron-Bridge recipes' default global batch size, sequence length and layout.

A CloudAI MegatronBridge test that sets no ``gb`` / ``seq_length`` runs with the values of
the recipe Megatron-Bridge's ``scripts/performance`` launcher builds: a *performance recipe*
(``src/megatron/bridge/perf_recipes``, named ``<recipe>_<task>_<N>gpu_<gpu>_<dtype>_config``)
by default, the *library recipe* (``src/megatron/bridge/recipes/<family>``, named
``<recipe>_<task>_config``) with ``use_recipes``. ``dse cloudai import`` takes those values
from the data file this writes (``dse/space/catalog/bridge_recipe_defaults.yaml``).

Nothing is imported: each public recipe function is read by AST and its body followed
(the helpers it calls, the dataclass constructors and field defaults it relies on) for
``train.global_batch_size``, ``dataset.seq_length`` and ``model.seq_length``; a value that
depends on something not known statically (a branch on an unknown condition, a model
provider read from a Hugging Face config) is written as null.

    python scripts/extract_bridge_recipe_defaults.py --tree PATH/TO/unpacked-wheel \\
        --version 0.6.2 -o dse/space/catalog/bridge_recipe_defaults.yaml
    python scripts/extract_bridge_recipe_defaults.py --repo PATH/TO/Megatron-Bridge/.git \\
        --commit v0.6.2 -o ...

``--tree`` takes a folder holding ``megatron/bridge`` (an unpacked wheel) or
``src/megatron/bridge`` (a checkout's work tree).
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract_upstream_common import GitTree, Source  # noqa: E402

PKG = "megatron.bridge"
LIBRARY = "megatron.bridge.recipes"
PERF = "megatron.bridge.perf_recipes"
_TASK = r"(pretrain|sft|finetune|peft)"
_LIBRARY_NAME = re.compile(rf"^[a-z0-9_]+_{_TASK}(_[a-z0-9_]+)?_config$")
_PERF_DEF = re.compile(r"^def ([a-zA-Z0-9_]+_config)\(", re.MULTILINE)  # as Bridge's launcher


class DirTree:
    """The files of a source folder, read like :class:`GitTree` (``read(path)``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.commit = None

    def read(self, path: str) -> str | None:
        p = self.root / path
        return p.read_text() if p.is_file() else None

    def listdir(self, path: str) -> list[str]:
        p = self.root / path
        return sorted(x.name for x in p.iterdir()) if p.is_dir() else []


def _git_listdir(tree: GitTree, path: str) -> list[str]:
    out = tree._git("ls-tree", "--name-only", f"{tree.commit}:{path}")
    return sorted(out.split())


# --- a small interpreter over recipe source --------------------------------------------


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class Obj:
    """A config object: the attributes set on it (others are unknown)."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        self.attrs: dict[str, Any] = dict(attrs or {})

    def child(self, name: str) -> Obj:
        v = self.attrs.get(name)
        if not isinstance(v, Obj):
            v = Obj()
            self.attrs[name] = v
        return v


@dataclass(frozen=True)
class Ref:
    """A top-level definition: a function or class of a module, or a module itself."""

    module: str
    node: ast.FunctionDef | ast.ClassDef | None  # None: the module


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


class _Abort(Exception):
    """The function raises (or the interpreter cannot follow it)."""


@dataclass
class Frame:
    module: str
    env: dict[str, Any]
    uncertain: int = 0
    returns: list[Any] = field(default_factory=list)


class Interpreter:
    """Runs recipe functions over :class:`Obj` values, following calls into the trees."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.depth = 0
        self._scope: dict[tuple[str, str], Any] = {}

    # -- names ------------------------------------------------------------------------
    def lookup(self, module: str, name: str, depth: int = 0) -> Any:
        """What ``name`` is at the top level of ``module``: a :class:`Ref`, a constant, or
        UNKNOWN (outside the trees)."""
        key = (module, name)
        if key in self._scope:
            return self._scope[key]
        self._scope[key] = UNKNOWN  # a cycle reads as unknown
        val = self._lookup(module, name, depth)
        self._scope[key] = val
        return val

    def _lookup(self, module: str, name: str, depth: int) -> Any:
        if depth > 16:
            return UNKNOWN
        got = self.src.module(module)
        if got is None:
            return UNKNOWN
        tree, path = got
        is_package = path.endswith("__init__.py")
        found: Any = UNKNOWN
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                found = Ref(module, node)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                found = self.eval(node.value, Frame(module, {}))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.target.id == name and node.value is not None:
                    found = self.eval(node.value, Frame(module, {}))
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":  # a name it defines wins over star imports
                        if found is UNKNOWN:
                            base = Source._absolute(module, node, is_package)
                            found = self.lookup(base, name, depth + 1)
                        continue
                    if (alias.asname or alias.name) != name:
                        continue
                    base = Source._absolute(module, node, is_package)
                    sub = f"{base}.{alias.name}"
                    if self.src.module(sub) is not None:
                        found = Ref(sub, None)
                    else:
                        found = self.lookup(base, alias.name, depth + 1)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == name:
                        found = Ref(alias.name, None)
        return found

    # -- calls ------------------------------------------------------------------------
    def call(self, ref: Ref, args: list[Any], kwargs: dict[str, Any]) -> Any:
        node = ref.node
        if isinstance(node, ast.ClassDef):
            return self.construct(ref, kwargs)
        if not isinstance(node, ast.FunctionDef) or self.depth > 40:
            return UNKNOWN
        frame = Frame(ref.module, {})
        a = node.args
        params = [*a.posonlyargs, *a.args]
        defaults = [None] * (len(params) - len(a.defaults)) + list(a.defaults)
        for i, (p, d) in enumerate(zip(params, defaults, strict=True)):
            if i < len(args):
                frame.env[p.arg] = args[i]
            elif p.arg in kwargs:
                frame.env[p.arg] = kwargs[p.arg]
            else:
                frame.env[p.arg] = self.eval(d, Frame(ref.module, {})) if d else UNKNOWN
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            if p.arg in kwargs:
                frame.env[p.arg] = kwargs[p.arg]
            else:
                frame.env[p.arg] = self.eval(d, Frame(ref.module, {})) if d else UNKNOWN
        self.depth += 1
        try:
            self.run(node.body, frame)
        except _Return as r:
            frame.returns.append(r.value)
        except _Abort:
            return UNKNOWN
        finally:
            self.depth -= 1
        if not frame.returns:
            return None
        first = frame.returns[0]
        return first if all(r is first or r == first for r in frame.returns) else UNKNOWN

    def construct(self, ref: Ref, kwargs: dict[str, Any]) -> Obj:
        """A dataclass instance: its tracked fields' defaults, then the keywords given."""
        obj = Obj()
        assert isinstance(ref.node, ast.ClassDef)
        try:
            fields = self.src.fields(ref.module, ref.node.name)
        except LookupError:
            fields = {}
        for name, f in fields.items():
            if name in _TRACKED_DEFAULTS and f.default is not None:
                owner = f.owner.split(":", 1)[0]
                obj.attrs[name] = self.eval(f.default, Frame(owner, {}))
        obj.attrs.update(kwargs)
        return obj

    # -- statements -------------------------------------------------------------------
    def run(self, body: list[ast.stmt], frame: Frame) -> None:
        for stmt in body:
            self.stmt(stmt, frame)

    def stmt(self, s: ast.stmt, frame: Frame) -> None:
        if isinstance(s, ast.Assign):
            v = self.eval(s.value, frame)
            for t in s.targets:
                self.assign(t, v, frame)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.assign(s.target, self.eval(s.value, frame), frame)
        elif isinstance(s, ast.AugAssign):
            self.assign(s.target, UNKNOWN, frame)
        elif isinstance(s, ast.Expr):
            self.eval(s.value, frame)
        elif isinstance(s, ast.Return):
            v = self.eval(s.value, frame) if s.value is not None else None
            if frame.uncertain:
                frame.returns.append(v)
                frame.uncertain += 1  # the rest of the function may not run
            else:
                raise _Return(v)
        elif isinstance(s, ast.Raise):
            if not frame.uncertain:
                raise _Abort
        elif isinstance(s, ast.If):
            test = self.eval(s.test, frame)
            if test is UNKNOWN or isinstance(test, Obj):
                frame.uncertain += 1
                self.run(s.body, frame)
                self.run(s.orelse, frame)
                frame.uncertain -= 1
            else:
                self.run(s.body if test else s.orelse, frame)
        elif isinstance(s, (ast.For, ast.While, ast.AsyncFor)):
            frame.uncertain += 1
            self.run(s.body, frame)
            self.run(s.orelse, frame)
            frame.uncertain -= 1
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            self.run(s.body, frame)
        elif isinstance(s, ast.Try):
            self.run(s.body, frame)
            self.run(s.orelse, frame)
            self.run(s.finalbody, frame)
        elif isinstance(s, ast.FunctionDef):
            frame.env[s.name] = Ref(frame.module, s)
        # pass, assert, import, delete, global: nothing tracked

    def assign(self, target: ast.expr, v: Any, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            old = frame.env.get(target.id, UNKNOWN)
            frame.env[target.id] = v if not frame.uncertain or v is old or v == old else UNKNOWN
        elif isinstance(target, ast.Attribute):
            owner = self.owner(target.value, frame)
            if owner is None:
                return
            old = owner.attrs.get(target.attr, UNKNOWN)
            if frame.uncertain and not (v is old or v == old):
                v = UNKNOWN
            owner.attrs[target.attr] = v
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.assign(t, UNKNOWN, frame)

    def owner(self, e: ast.expr, frame: Frame) -> Obj | None:
        """The object an attribute is set on (``cfg.model`` becomes an object when it was
        None or unknown: setting its attribute says it is one)."""
        if isinstance(e, ast.Attribute):
            parent = self.owner(e.value, frame)
            return parent.child(e.attr) if parent is not None else None
        v = self.eval(e, frame)
        return v if isinstance(v, Obj) else None

    # -- expressions ------------------------------------------------------------------
    def eval(self, e: ast.expr | None, frame: Frame) -> Any:
        if e is None:
            return None
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Name):
            if e.id in frame.env:
                return frame.env[e.id]
            return self.lookup(frame.module, e.id)
        if isinstance(e, ast.Attribute):
            owner = self.eval(e.value, frame)
            if isinstance(owner, Obj):
                return owner.child(e.attr) if e.attr not in owner.attrs else owner.attrs[e.attr]
            if isinstance(owner, Ref) and owner.node is None:
                sub = f"{owner.module}.{e.attr}"
                if self.src.module(sub) is not None:
                    return Ref(sub, None)
                return self.lookup(owner.module, e.attr)
            return UNKNOWN
        if isinstance(e, ast.Call):
            return self.eval_call(e, frame)
        if isinstance(e, ast.BinOp):
            left, right = self.eval(e.left, frame), self.eval(e.right, frame)
            if not all(type(x) in (int, float) for x in (left, right)):
                return UNKNOWN
            ops: dict[type, Any] = {
                ast.Add: lambda x, y: x + y,
                ast.Sub: lambda x, y: x - y,
                ast.Mult: lambda x, y: x * y,
                ast.FloorDiv: lambda x, y: x // y,
                ast.Div: lambda x, y: x / y,
                ast.Pow: lambda x, y: x**y,
                ast.LShift: lambda x, y: x << y,
            }
            op = ops.get(type(e.op))
            try:
                return op(left, right) if op else UNKNOWN
            except (ArithmeticError, TypeError):
                return UNKNOWN
        if isinstance(e, ast.UnaryOp):
            v = self.eval(e.operand, frame)
            if isinstance(e.op, ast.Not) and isinstance(v, (bool, int, str, type(None))):
                return not v
            if isinstance(e.op, ast.USub) and type(v) in (int, float):
                return -v
            return UNKNOWN
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            left, right = self.eval(e.left, frame), self.eval(e.comparators[0], frame)
            known = (bool, int, float, str, type(None))
            if isinstance(e.ops[0], (ast.Is, ast.IsNot)):
                if isinstance(left, (_Unknown, Ref)) or isinstance(right, (_Unknown, Ref)):
                    return UNKNOWN
                same = left is right
                return same if isinstance(e.ops[0], ast.Is) else not same
            if isinstance(left, known) and isinstance(right, known):
                cmp: dict[type, Any] = {
                    ast.Eq: lambda x, y: x == y,
                    ast.NotEq: lambda x, y: x != y,
                    ast.Lt: lambda x, y: x < y,
                    ast.LtE: lambda x, y: x <= y,
                    ast.Gt: lambda x, y: x > y,
                    ast.GtE: lambda x, y: x >= y,
                }
                f = cmp.get(type(e.ops[0]))
                try:
                    return f(left, right) if f else UNKNOWN
                except TypeError:
                    return UNKNOWN
            return UNKNOWN
        if isinstance(e, ast.BoolOp):
            vals = [self.eval(v, frame) for v in e.values]
            if any(isinstance(v, (_Unknown, Obj, Ref)) for v in vals):
                return UNKNOWN
            return all(vals) if isinstance(e.op, ast.And) else any(vals)
        if isinstance(e, ast.IfExp):
            test = self.eval(e.test, frame)
            if isinstance(test, (_Unknown, Obj, Ref)):
                a, b = self.eval(e.body, frame), self.eval(e.orelse, frame)
                return a if a is b or a == b else UNKNOWN
            return self.eval(e.body if test else e.orelse, frame)
        return UNKNOWN

    def eval_call(self, e: ast.Call, frame: Frame) -> Any:
        args = [self.eval(a, frame) for a in e.args if not isinstance(a, ast.Starred)]
        kwargs = {k.arg: self.eval(k.value, frame) for k in e.keywords if k.arg is not None}
        fname = ast.unparse(e.func)
        if fname in ("replace", "dataclasses.replace") and args and isinstance(args[0], Obj):
            return Obj({**args[0].attrs, **kwargs})
        if fname in ("deepcopy", "copy.deepcopy", "copy.copy", "copy") and args:
            return copy.deepcopy(args[0]) if isinstance(args[0], Obj) else args[0]
        if fname == "int" and len(args) == 1 and type(args[0]) in (int, float):
            return int(args[0])
        fn = self.eval(e.func, frame)
        if isinstance(fn, Ref) and fn.node is not None:
            if len(args) < len(e.args) or any(k.arg is None for k in e.keywords):
                return UNKNOWN  # *args / **kwargs: not followed
            return self.call(fn, args, kwargs)
        return UNKNOWN


# --- the recipes ----------------------------------------------------------------------


#: The recipe's own layout and settings dse has knobs for: ``section.field`` of the
#: ConfigContainer -> the name in the table (the knob's name).
LAYOUT_FIELDS: dict[str, str] = {
    "model.tensor_model_parallel_size": "tensor_model_parallel_size",
    "model.pipeline_model_parallel_size": "pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size": "virtual_pipeline_model_parallel_size",
    "model.context_parallel_size": "context_parallel_size",
    "model.expert_model_parallel_size": "expert_model_parallel_size",
    "model.expert_tensor_parallel_size": "expert_tensor_parallel_size",
    "model.sequence_parallel": "sequence_parallel",
    "train.micro_batch_size": "micro_batch_size",
    "model.moe_token_dispatcher_type": "moe_token_dispatcher_type",
    "model.moe_flex_dispatcher_backend": "moe_flex_dispatcher_backend",
    "model.recompute_granularity": "recompute_granularity",
    "mixed_precision.grad_reduce_in_fp32": "grad_reduce_in_fp32",
    "model.cross_entropy_loss_fusion": "cross_entropy_loss_fusion",
    "model.cross_entropy_fusion_impl": "cross_entropy_fusion_impl",
}
_TRACKED_DEFAULTS = {"seq_length", "global_batch_size"} | {
    k.split(".", 1)[1] for k in LAYOUT_FIELDS
}


@dataclass(frozen=True)
class Extracted:
    name: str
    function: str
    path: str
    global_batch_size: int | None
    seq_length: int | None
    layout: dict[str, Any] = field(default_factory=dict)


def _module_path(src: Source, module: str) -> str:
    """The repository path of a module (``src/megatron/bridge/...``, also from a wheel)."""
    got = src.module(module)
    path = got[1] if got else module
    return path if path.startswith("src/") else "src/" + path


def _known(v: Any) -> int | None:
    return v if type(v) is int else None


def evaluate(interp: Interpreter, module: str, name: str) -> Extracted | None:
    ref = interp.lookup(module, name)
    if not isinstance(ref, Ref) or not isinstance(ref.node, ast.FunctionDef):
        return None
    cfg = interp.call(ref, [], {})
    gbs = seq = None
    if isinstance(cfg, Obj):
        train, data, model = (cfg.attrs.get(k) for k in ("train", "dataset", "model"))
        if isinstance(train, Obj):
            gbs = _known(train.attrs.get("global_batch_size"))
        if isinstance(data, Obj):
            seq = _known(data.attrs.get("seq_length"))
        if seq is None and isinstance(model, Obj):
            seq = _known(model.attrs.get("seq_length"))
    layout: dict[str, Any] = {}
    if isinstance(cfg, Obj):
        for path, key in LAYOUT_FIELDS.items():
            sec, attr = path.split(".", 1)
            owner = cfg.attrs.get(sec)
            if isinstance(owner, Obj) and attr in owner.attrs:
                v = owner.attrs[attr]
                if v is None or type(v) in (int, bool, str):  # known (None: set to None)
                    layout[key] = v
    return Extracted(name, ref.node.name, _module_path(interp.src, ref.module), gbs, seq, layout)


def _exported(src: Source, module: str) -> list[str]:
    """The names in a package's ``__all__`` (its imported names where it has none)."""
    got = src.module(module)
    if got is None:
        return []
    tree, _ = got
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                return [
                    x.value
                    for x in node.value.elts
                    if isinstance(x, ast.Constant) and isinstance(x.value, str)
                ]
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names += [a.asname or a.name for a in node.names]
    return names


def _walk_py(listdir: Any, read: Any, folder: str) -> Iterator[str]:
    for name in listdir(folder):
        path = f"{folder}/{name}"
        if name.endswith(".py"):
            yield path
        elif "." not in name and name != "__pycache__":
            yield from _walk_py(listdir, read, path)


def extract(tree: GitTree | DirTree, root: str) -> dict[str, Any]:
    """The library and performance recipes of the Bridge tree (package under ``root``)."""
    src = Source([(PKG, tree, root)])  # type: ignore[list-item]
    interp = Interpreter(src)
    if isinstance(tree, DirTree):
        listdir = tree.listdir
    else:

        def listdir(path: str) -> list[str]:
            try:
                return _git_listdir(tree, path)
            except FileNotFoundError:
                return []

    base = root + "megatron/bridge"
    library: dict[str, dict[str, Any]] = {}
    for fam in listdir(f"{base}/recipes"):
        if "." in fam or fam.startswith("_") or fam == "utils":
            continue
        # the family's names (<recipe>_<task>_config aliases), then its hardware
        # subpackages' (<recipe>_<task>_<N>gpu_<gpu>_<dtype>_config)
        mods = [f"{LIBRARY}.{fam}"] + [
            f"{LIBRARY}.{fam}.{sub}"
            for sub in listdir(f"{base}/recipes/{fam}")
            if "." not in sub and sub != "__pycache__"
        ]
        for mod in mods:
            for name in sorted(set(_exported(src, mod))):
                if _LIBRARY_NAME.match(name) and name not in library:
                    got = evaluate(interp, mod, name)
                    if got is not None:
                        library[name] = _entry(got)
    perf: dict[str, dict[str, Any]] = {}
    for path in _walk_py(listdir, tree.read, f"{base}/perf_recipes"):
        text = tree.read(path) or ""
        module = path[len(root) :].removesuffix(".py").replace("/", ".")
        for name in _PERF_DEF.findall(text):
            if name.startswith("_"):
                continue
            got = evaluate(interp, module, name)
            if got is not None:
                perf[name] = _entry(got)
    return {
        "recipes": dict(sorted(library.items())),
        "perf_recipes": dict(sorted(perf.items())),
    }


def _entry(x: Extracted) -> dict[str, Any]:
    out: dict[str, Any] = {
        "global_batch_size": x.global_batch_size,
        "seq_length": x.seq_length,
        "path": x.path,
    }
    if x.function != x.name:
        out["function"] = x.function
    if x.layout:
        out["layout"] = x.layout
    return out


HEADER = """\
# Megatron-Bridge recipes' default global batch size and sequence length, read by
# `dse cloudai import` for a CloudAI MegatronBridge test that sets no gb / seq_length.
# Written by scripts/extract_bridge_recipe_defaults.py (AST of each recipe function and
# what it calls; nothing imported); regenerate it with that script, do not edit by hand.
#
# recipes: the library recipes (the exports of src/megatron/bridge/recipes/<family> and of
#   its hardware subpackages); Bridge's performance launcher builds <recipe>_<task>_config
#   with --use_recipes.
# perf_recipes: src/megatron/bridge/perf_recipes, what the launcher builds by default
#   (<recipe>_<task>_<N>gpu_<gpu>_<dtype>[_<variant>]_config).
# path: the repository file that defines the function (function: its name there, for an
#   alias).
# null: not known statically (the function raises, or the value comes from a Hugging Face
#   config or a branch on something unknown).
# layout: the parallel sizes and settings the recipe sets itself (a field it leaves to
#   Megatron-Core's default, or sets on a branch not known statically, is left out; null: set
#   to None); dse cloudai import takes them as the study's baseline.
"""


def render(data: dict[str, Any], source: dict[str, Any]) -> str:
    """The data file: the header, ``source``, then one line a recipe."""
    out = [HEADER.rstrip("\n"), yaml.safe_dump({"source": source}, sort_keys=False, width=99)]
    for sec in ("recipes", "perf_recipes"):
        out.append(f"{sec}:")
        for name, entry in data[sec].items():
            line = yaml.safe_dump(
                {name: entry}, default_flow_style=None, sort_keys=False, width=10**6
            )
            if "layout" in entry:  # one line a recipe, its layout a flow mapping too
                flow = yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6)
                line = f"{name}: {flow}"
            out.append("  " + line.rstrip("\n"))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", help="a Megatron-Bridge git directory")
    where.add_argument("--tree", help="a source folder (unpacked wheel or work tree)")
    ap.add_argument("--commit", default="v0.6.2", help="with --repo: the tag or commit")
    ap.add_argument("--version", help="the Megatron-Bridge version of --tree")
    ap.add_argument("--wheel", help="the wheel --tree was unpacked from (its sha256 is noted)")
    ap.add_argument("--note", help="a line on the source, kept in the file")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    source: dict[str, Any] = {"project": "NVIDIA-NeMo/Megatron-Bridge"}
    if args.repo:
        tree: GitTree | DirTree = GitTree(args.repo, args.commit)
        root = "src/"
        source.update(ref=args.commit, commit=tree.commit, commit_date=tree.date())
    else:
        tree = DirTree(args.tree)
        root = "src/" if (Path(args.tree) / "src/megatron/bridge").is_dir() else ""
        if args.version:
            source["version"] = args.version
        if args.wheel:
            w = Path(args.wheel)
            source["wheel"] = w.name
            source["wheel_sha256"] = hashlib.sha256(w.read_bytes()).hexdigest()
    if args.note:
        source["note"] = args.note
    data = extract(tree, root)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(data, source))
    for sec in ("recipes", "perf_recipes"):
        n = len(data[sec])
        full = sum(
            1
            for e in data[sec].values()
            if e["global_batch_size"] is not None and e["seq_length"] is not None
        )
        sys.stderr.write(f"{sec}: {n} functions, {full} with both values\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
