"""Type-check dse with mypy (the configuration of pyproject.toml): ``python scripts/typecheck.py``.

The source tree is the import tree (every package is a folder under ``dse/``), so mypy runs on
the checkout itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    cfg = ROOT / "pyproject.toml"
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(cfg), "-p", "dse"]
    return subprocess.call(cmd, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
