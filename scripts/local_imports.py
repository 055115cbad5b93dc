"""The rule for function-local first-party imports: every ``import dse...`` / ``from dse...
import`` inside a function of ``dse/`` defers a heavy stack, or is allowlisted with its reason.

An import inside a function is an edge a reader does not see at the top of the module. It is
kept only where it saves a cost: the statement, run in a fresh interpreter that has imported
the module it sits in, loads one of :data:`HEAVY` that the module did not load already (a
command that never calls the function never pays for the stack). Every other local import
belongs at module level, except the few of :data:`ALLOWLIST` (each with its reason).

    python scripts/local_imports.py [--root DIR]           # the count, per folder of dse/
    python scripts/local_imports.py --check [--root DIR]   # the rule; exit 1 naming file:line

How a statement is judged: one child interpreter per module (``PYTHONPATH`` the checkout)
imports the module, notes which heavy stacks are loaded, then forks once per local import of
the module; the fork runs the statement with an import hook that stops it at the first heavy
stack not loaded before and reports that stack's name (the stack itself is never loaded, so
judging an import of the trainer costs no torch start).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ALLOWLIST", "HEAVY", "LocalImport", "judge", "local_imports", "main", "violations"]

#: The heavy stacks: top-level packages whose import a command that does not use them should
#: not pay. Cumulative ``python -X importtime -c "import NAME"`` of each, the least of three
#: runs on the 2-core development machine at load 5 (Python 3.11; their dependencies
#: included), or why they count where not installed there.
HEAVY: dict[str, str] = {
    "torch": "3.8 s",
    "megatron": "megatron.core: 12 s (torch included)",
    "transformer_engine": "Megatron-Core's fused layers; loads torch and CUDA libraries",
    "nemo": "NeMo 2.0 (a recipe launcher's import); loads torch, Lightning, NeMo-Run",
    "ray": "1.1 s",
    "fastapi": "0.69 s (Starlette, pydantic's JSON schema, anyio)",
    "starlette": "FastAPI's server layer; 0.2 s of fastapi's import",
    "matplotlib": "0.49 s; matplotlib.pyplot 1.1 s",
    "optuna": "0.44 s (numpy and SQLAlchemy included)",
    "sqlalchemy": "0.57 s",
    "alembic": "0.41 s (SQLAlchemy included)",
    "numpy": "0.10 s",
    "scipy": "0.17 s (numpy included)",
    "pandas": "numpy plus its own extensions (~0.3 s where installed)",
}

#: (file, the module a statement imports from) -> why that local import stays local.
ALLOWLIST: dict[tuple[str, str], str] = {
    ("dse/storage/migrations/env.py", "dse.storage._models"): (
        "Alembic's env script: dse's own upgrade runs the frozen revisions without the live "
        "models; only `alembic revision --autogenerate` from a shell loads them (and the "
        "script imports only under Alembic's context)"
    ),
}

_CHILD = r"""
import importlib, json, os, sys
heavy, module, statements = sys.argv[1].split(","), sys.argv[2], json.loads(sys.argv[3])
def loaded():
    return {name.partition(".")[0] for name in sys.modules} & set(heavy)
try:
    importlib.import_module(module)
except BaseException as exc:
    print(json.dumps({"error": f"importing {module} failed: {exc!r}"}))
    sys.exit(0)
before = loaded()
class Stop:
    def __init__(self, fd):
        self.fd = fd
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in heavy and top not in before:
            os.write(self.fd, top.encode())
            os._exit(0)
        return None
verdicts = []
for text in statements:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        sys.meta_path.insert(0, Stop(w))
        try:
            exec(text, {})
        except BaseException as exc:
            os.write(w, ("!" + repr(exc)).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    verdicts.append(b"".join(chunks).decode())
print(json.dumps({"verdicts": verdicts}))
"""


@dataclass(frozen=True)
class LocalImport:
    """One first-party import statement inside a function of ``dse/``."""

    path: str  # relative to the checkout, with ``/``
    line: int
    module: str  # the module it imports from (``import a.b``: ``a.b``), relative ones resolved
    statement: str  # the statement with its module written absolute

    @property
    def importer(self) -> str:
        """The dotted name of the module the statement sits in."""
        parts = Path(self.path).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, package: Sequence[str]) -> str:
    if not node.level:
        return node.module or ""
    base = list(package[: len(package) - (node.level - 1)])
    return ".".join(base + ([node.module] if node.module else []))


def _walk(node: ast.AST, inside: bool, rel: Path, out: list[LocalImport]) -> None:
    package = rel.with_suffix("").parts[:-1]
    for child in ast.iter_child_nodes(node):
        if inside and isinstance(child, ast.Import):
            for alias in child.names:
                if alias.name.partition(".")[0] == "dse":
                    text = ast.unparse(ast.Import(names=[alias]))
                    out.append(LocalImport(rel.as_posix(), child.lineno, alias.name, text))
        elif inside and isinstance(child, ast.ImportFrom):
            module = _absolute(child, package)
            if module.partition(".")[0] == "dse":
                text = ast.unparse(ast.ImportFrom(module, child.names, 0))
                out.append(LocalImport(rel.as_posix(), child.lineno, module, text))
        funcs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        _walk(child, inside or isinstance(child, funcs), rel, out)


def local_imports(root: Path) -> list[LocalImport]:
    """Every first-party import statement inside a function (or lambda) of ``root/dse``."""
    out: list[LocalImport] = []
    for path in sorted((root / "dse").rglob("*.py")):
        rel = path.relative_to(root)
        _walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(rel)), False, rel, out)
    return out


def _judge_module(root: Path, module: str, statements: list[str]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-c", _CHILD, ",".join(HEAVY), module, json.dumps(statements)]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return {"error": f"the child judging {module} exited {done.returncode}: {done.stderr}"}
    result: dict[str, object] = json.loads(lines[-1])
    return result


def judge(root: Path, imports: Iterable[LocalImport], workers: int = 2) -> dict[LocalImport, str]:
    """Each import -> the heavy stack it defers (``""``: none; ``"!..."``: why it could not be
    judged). One child interpreter per importing module, ``workers`` at a time."""
    by_module: dict[str, list[LocalImport]] = {}
    for imp in imports:
        by_module.setdefault(imp.importer, []).append(imp)

    def one(module: str) -> list[tuple[LocalImport, str]]:
        items = by_module[module]
        result = _judge_module(root, module, [i.statement for i in items])
        if "error" in result:
            return [(i, f"!{result['error']}") for i in items]
        verdicts = result["verdicts"]
        assert isinstance(verdicts, list)
        return list(zip(items, (str(v) for v in verdicts), strict=True))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return {imp: v for pairs in pool.map(one, sorted(by_module)) for imp, v in pairs}


def violations(
    imports: Sequence[LocalImport],
    verdicts: dict[LocalImport, str],
    allowlist: dict[tuple[str, str], str] | None = None,
) -> list[str]:
    """One line per local import that neither defers a heavy stack nor is allowlisted."""
    allowed = ALLOWLIST if allowlist is None else allowlist
    out = []
    for imp in imports:
        if (imp.path, imp.module) in allowed:
            continue
        verdict = verdicts[imp]
        if verdict.startswith("!"):
            out.append(f"{imp.path}:{imp.line}: `{imp.statement}` could not be judged: "
                       f"{verdict[1:]}")  # fmt: skip
        elif verdict not in HEAVY:
            out.append(f"{imp.path}:{imp.line}: `{imp.statement}` loads no heavy stack that "
                       f"{imp.importer} does not load already: import it at module level (or "
                       "allowlist it in scripts/local_imports.py with its reason)")  # fmt: skip
    return out


def count(imports: Iterable[LocalImport]) -> Counter[str]:
    """The local imports per folder of ``dse/`` (a module right under ``dse/``: its name)."""
    return Counter(Path(i.path).parts[1] for i in imports)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--check", action="store_true", help="judge each import (the rule)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    found = local_imports(root)
    per = count(found)
    sys.stdout.write(f"{len(found)} function-local first-party imports in dse/: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(per.items())) + "\n")  # fmt: skip
    if not args.check:
        return 0
    bad = violations(found, judge(root, [i for i in found if (i.path, i.module) not in ALLOWLIST]))
    sys.stdout.write("".join(f"{line}\n" for line in bad))
    sys.stdout.write(f"{len(bad)} local import(s) without a reason\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
