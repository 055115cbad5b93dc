"""Check the import contracts of pyproject.toml ([tool.importlinter]) on the installed layout.

dse/ with agents/, workloads/, storage/, api/ mapped to dse.agents, dse.workloads,
dse.storage, dse.api (as pyproject's package-dir does) through the tree of symbolic links
that scripts/typecheck.py builds, then import-linter on it. Exit status 0 when every
contract is kept and no two dse modules import each other in a cycle
(``scripts/import_cycles.py``). ``--root DIR`` checks another checkout (the tests use a copy).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from typecheck import build_tree  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args(argv)
    root = args.root.resolve()
    tree = build_tree(root, root / "build" / "importlint")
    config = str(root / "pyproject.toml")
    code = (
        "import sys; sys.path.insert(0, '.');"
        "from importlinter.cli import lint_imports;"
        f"sys.exit(lint_imports(config_filename={config!r}, no_cache=True, no_logo=True))"
    )
    contracts = subprocess.call([sys.executable, "-c", code], cwd=tree)
    here = str(Path(__file__).resolve().parent)
    cycles_code = (
        f"import sys; sys.path[:0] = ['.', {here!r}];"
        "from import_cycles import main; sys.exit(main(['dse']))"
    )
    cycles = subprocess.call([sys.executable, "-c", cycles_code], cwd=tree)
    return contracts or cycles


if __name__ == "__main__":
    sys.exit(main())
