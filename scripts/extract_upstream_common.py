"""Reading upstream Python source at a pinned commit, by AST only (nothing is imported).

The ``extract_upstream_*.py`` scripts use this to list what Megatron-LM's argument parser,
Megatron-Bridge's ``ConfigContainer`` and NeMo's recipe objects accept, from a git clone of
each project at a commit written into the data file they produce
(``tests/fixtures/upstream/``). ``tests/workloads/test_upstream_names.py`` checks every flag
and override path dse renders against those files.

A :class:`Source` is one or more git trees, each serving the modules under a package prefix
(``megatron.core`` from a Megatron-LM clone, ``megatron.bridge`` from ``src/`` of a Bridge
clone); classes are found through the ``import`` statements of the module that names them,
and dataclass fields are collected over their base classes.
"""

from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GitTree", "Source", "DataField", "literal_strings", "submodule_commit"]


class GitTree:
    """The files of one commit of a git repository (``git show COMMIT:PATH``)."""

    def __init__(self, git_dir: str | Path, commit: str) -> None:
        self.git_dir = str(git_dir)
        self.commit = self._rev(commit)

    def _git(self, *args: str) -> str:
        out = subprocess.run(
            ["git", "--git-dir", self.git_dir, *args], capture_output=True, text=True
        )
        if out.returncode != 0:
            raise FileNotFoundError(
                f"git {' '.join(args)} in {self.git_dir}: {out.stderr.strip()}"
            )
        return out.stdout

    def _rev(self, commit: str) -> str:
        return self._git("rev-parse", f"{commit}^{{commit}}").strip()

    def read(self, path: str) -> str | None:
        """The text of ``path`` at the commit, None when the commit has no such file."""
        try:
            return self._git("show", f"{self.commit}:{path}")
        except FileNotFoundError:
            return None

    def date(self) -> str:
        return self._git("log", "-1", "--format=%cI", self.commit).strip()


def submodule_commit(tree: GitTree, path: str) -> str:
    """The commit a submodule (``path``) of ``tree`` points at."""
    line = tree._git("ls-tree", tree.commit, path).split()
    if len(line) < 3 or line[1] != "commit":
        raise FileNotFoundError(f"{path} is not a submodule at {tree.commit}")
    return line[2]


@dataclass(frozen=True)
class DataField:
    """One dataclass field, as written in its class body."""

    name: str
    owner: str  # module:Class that declares it
    annotation: str
    default: ast.expr | None  # the default expression (``field(default=...)`` unwrapped)
    init: bool
    metadata: ast.expr | None


class Source:
    """Modules served by git trees: ``(package prefix, tree, folder of the package root)``."""

    def __init__(self, trees: list[tuple[str, GitTree, str]]) -> None:
        self.trees = trees
        self._parsed: dict[str, tuple[ast.Module, str] | None] = {}

    def module(self, name: str) -> tuple[ast.Module, str] | None:
        """The AST of module ``name`` and its path, or None when no tree serves it."""
        if name in self._parsed:
            return self._parsed[name]
        found = None
        for prefix, tree, root in self.trees:
            if name != prefix and not name.startswith(prefix + "."):
                continue
            base = root + name.replace(".", "/")
            for path in (base + ".py", base + "/__init__.py"):
                text = tree.read(path)
                if text is not None:
                    found = (ast.parse(text, filename=path), path)
                    break
            if found:
                break
        self._parsed[name] = found
        return found

    @staticmethod
    def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep])
        return f"{base}.{node.module}" if node.module else base

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """Where class ``name`` as seen from ``module`` is defined (following imports and
        re-exports), or None when it is outside the trees (a third-party class)."""
        if depth > 12:
            return None
        got = self.module(module)
        if got is None:
            return None
        tree, path = got
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        is_package = path.endswith("__init__.py")
        for node in ast.walk(tree):  # module-level and function-level imports
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        src = self._absolute(module, node, is_package)
                        hit = self.resolve(src, alias.name, depth + 1)
                        if hit is not None:
                            return hit
                        # ``from pkg import submodule`` is not a class
        return None

    def enum_members(self, module: str, name: str) -> list[str] | None:
        """The member names of an ``enum.Enum`` class, None when it is not one."""
        hit = self.resolve(module, name)
        if hit is None:
            return None
        _, cls = hit
        if not any(ast.unparse(b).split(".")[-1].endswith("Enum") for b in cls.bases):
            return None
        out = []
        for node in cls.body:
            if isinstance(node, ast.Assign):
                out += [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.append(node.target.id)
        return out

    def fields(self, module: str, name: str) -> dict[str, DataField]:
        """The dataclass fields of class ``name`` (bases first, a subclass's declaration of
        a field replacing its base's), following the bases the trees serve."""
        hit = self.resolve(module, name)
        if hit is None:
            raise LookupError(f"class {name} not found from {module}")
        mod, cls = hit
        out: dict[str, DataField] = {}
        for base in reversed(cls.bases):
            bname = ast.unparse(base).split("[")[0]
            if "." in bname:  # module.Class: only classes imported by name are followed
                continue
            if self.resolve(mod, bname) is not None:
                out.update(self.fields(mod, bname))
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            ann = ast.unparse(node.annotation)
            if ann.startswith(("ClassVar", "typing.ClassVar")):
                continue
            default, init, metadata = node.value, True, None
            if isinstance(default, ast.Call) and ast.unparse(default.func) in (
                "field",
                "dataclasses.field",
            ):
                kw = {k.arg: k.value for k in default.keywords if k.arg}
                default = kw.get("default")
                init_kw = kw.get("init")
                init = not (isinstance(init_kw, ast.Constant) and init_kw.value is False)
                metadata = kw.get("metadata")
            out[node.target.id] = DataField(
                node.target.id, f"{mod}:{cls.name}", ann, default, init, metadata
            )
        return out

    def init_params(self, module: str, name: str) -> list[str]:
        """The named parameters of class ``name``'s ``__init__`` (no self, *args, **kwargs)."""
        hit = self.resolve(module, name)
        if hit is None:
            raise LookupError(f"class {name} not found from {module}")
        _, cls = hit
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                a = node.args
                return [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]][1:]
        raise LookupError(f"class {name} of {module} has no __init__")


def literal_strings(node: ast.expr | None) -> list[str] | None:
    """The strings of a literal list/tuple/set expression, None when it is not one."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        if len(vals) == len(node.elts):
            return [str(v) for v in vals]
    return None


def call_order(text: str, function: str) -> list[str]:
    """The calls a top-level function of module source ``text`` makes, in source order, each
    as its callee written out (``apply_environment_variables``, ``cfg.validate``): what a
    stand-in of that function must call in the same order. Raises LookupError when the
    module has no such function."""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
            calls.sort(key=lambda c: (c.lineno, c.col_offset))
            return [ast.unparse(c.func) for c in calls]
    raise LookupError(f"no function {function!r}")
