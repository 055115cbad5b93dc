"""Type-check the installed layout: dse/ with agents/, workloads/, storage/, api/ mapped to
dse.agents, dse.workloads, dse.storage, dse.api (as pyproject's package-dir does), through a
tree of symbolic links under build/typecheck, then run mypy on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"agents": "agents", "workloads": "workloads", "storage": "storage", "api": "api"}


def build_tree(root: Path, out: Path) -> Path:
    """A folder under which ``dse`` is the installed package of checkout ``root`` (links)."""
    shutil.rmtree(out, ignore_errors=True)
    pkg = out / "dse"
    pkg.mkdir(parents=True)
    for item in (root / "dse").iterdir():
        if item.name != "__pycache__":
            os.symlink(item, pkg / item.name)
    for name, folder in LAYERS.items():
        os.symlink(root / folder, pkg / name)
    return out


def main() -> int:
    out = build_tree(ROOT, ROOT / "build" / "typecheck")
    cfg = ROOT / "pyproject.toml"
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(cfg), "-p", "dse"]
    return subprocess.call(cmd, cwd=out)


if __name__ == "__main__":
    sys.exit(main())
