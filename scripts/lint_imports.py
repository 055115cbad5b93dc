"""Check the import contracts of pyproject.toml ([tool.importlinter]) and that no two dse
modules import each other in a cycle.

import-linter on the checkout (the source tree is the import tree: each layer is a folder of
``dse/`` with a contract of its own), then ``scripts/import_cycles.py``. Exit status 0 when every
contract is kept and there is no cycle. ``--root DIR`` checks another checkout (the tests use a
copy); its ``dse`` is the one imported.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args(argv)
    root = args.root.resolve()
    config = str(root / "pyproject.toml")
    here = str(Path(__file__).resolve().parent)  # plugin_contract.py, import_cycles.py
    code = (
        f"import sys; sys.path[:0] = [{str(root)!r}, {here!r}];"
        "from importlinter.cli import lint_imports;"
        f"sys.exit(lint_imports(config_filename={config!r}, no_cache=True, no_logo=True))"
    )
    contracts = subprocess.call([sys.executable, "-c", code], cwd=root)
    cycles_code = (
        f"import sys; sys.path[:0] = [{str(root)!r}, {here!r}];"
        "from import_cycles import main; sys.exit(main(['dse']))"
    )
    cycles = subprocess.call([sys.executable, "-c", cycles_code], cwd=root)
    return contracts or cycles


if __name__ == "__main__":
    sys.exit(main())
