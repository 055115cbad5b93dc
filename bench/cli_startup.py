"""CPU time of ``python -m dse --help`` (or another dse command line) in one or more checkouts.

The runs of the checkouts alternate (A, B, A, B, ...) so that a busy machine weighs on each
alike; each run's CPU time (user + system of the child process) is what is compared, the wall
time printed beside it. A checkout without ``dse/__main__.py`` runs ``python -m dse.cli``.

    python bench/cli_startup.py --root OLD --root NEW -n 15
    python bench/cli_startup.py --root . -n 10 -- validate --help
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one_run(root: Path, argv: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one ``python -m dse ARGV`` in ``root``."""
    module = "dse" if (root / "dse" / "__main__.py").exists() else "dse.cli"
    env = {**os.environ, "PYTHONPATH": str(root)}  # the warm-up run writes the bytecode
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", module, *argv], cwd=root, env=env,
                   stdout=subprocess.DEVNULL, check=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, action="append", required=True, help="a checkout")
    ap.add_argument("-n", type=int, default=15, help="runs per checkout (default 15)")
    ap.add_argument("command", nargs="*", help="the dse command line (default: --help)")
    args = ap.parse_args(argv)
    command = args.command or ["--help"]
    roots = [r.resolve() for r in args.root]
    for r in roots:  # one warm-up run each (bytecode caches, the page cache)
        one_run(r, command)
    runs: dict[Path, list[tuple[float, float]]] = {r: [] for r in roots}
    for _ in range(args.n):
        for r in roots:
            runs[r].append(one_run(r, command))
    print(f"python -m dse {' '.join(command)}: {args.n} runs each, alternating; load "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    for i, r in enumerate(roots):
        cpu = sorted(c for c, _ in runs[r])
        wall = sorted(w for _, w in runs[r])
        print(f"  checkout {i + 1}: CPU s median {statistics.median(cpu):.3f} "
              f"(min {cpu[0]:.3f}, max {cpu[-1]:.3f}); wall s median "
              f"{statistics.median(wall):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
