"""Size and complexity of the CloudAI interop code (issue 37, cloudai package).

For a file or a package folder: total lines, the largest file, the longest function (lines,
from the ast) and the cyclomatic complexity of each function as ruff's C901 (McCabe) counts
it, with the highest and how many are over 10.

    python bench/cloudai_package_metrics.py dse/interop/cloudai   # or a copy of cloudai.py
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

_C901 = re.compile(r":(\d+):\d+: C901 `([^`]+)` is too complex \((\d+) > 0\)")


def _complexities(target: Path) -> dict[tuple[str, int], int]:
    ruff = Path(sys.executable).with_name("ruff")
    out = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "C901", "--config",
         "lint.mccabe.max-complexity=0", "--output-format", "concise", str(target)],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    got: dict[tuple[str, int], int] = {}
    for line in out.splitlines():
        m = _C901.search(line)
        if m:
            got[(Path(line.split(":")[0]).name + ":" + m.group(2), int(m.group(1)))] = int(
                m.group(3)
            )
    return got


def measure(target: Path) -> dict[str, object]:
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    cc = _complexities(target)
    lines = 0
    funcs: list[tuple[str, int, int]] = []  # name, lines, complexity
    for f in files:
        text = f.read_text()
        lines += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{f.name}:{node.name}"
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                funcs.append((name, length, cc.get((name, node.lineno), 1)))
    longest = max(funcs, key=lambda t: t[1])
    worst = max(funcs, key=lambda t: t[2])
    biggest = max((len(f.read_text().splitlines()), f.name) for f in files)
    return {
        "files": len(files),
        "lines": lines,
        "largest_file": f"{biggest[1]} ({biggest[0]} lines)",
        "longest_function": f"{longest[0]} ({longest[1]} lines, complexity {longest[2]})",
        "most_complex_function": f"{worst[0]} (complexity {worst[2]}, {worst[1]} lines)",
        "functions_over_complexity_10": sum(1 for t in funcs if t[2] > 10),
    }


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["dse/interop/cloudai"]:
        print(arg)
        for k, v in measure(Path(arg)).items():
            print(f"  {k}: {v}")
