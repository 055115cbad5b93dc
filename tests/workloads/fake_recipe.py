"""A stand-in recipe for the launcher tests: prints Megatron-LM's ``training_log`` iteration
line (the line structure of tests/fixtures/logs/megatron_mixtral_16xh100.log) for each of
``--iters`` iterations, with a slow first step and seeded noise in the logged step time, and
keeps a child process (``sleep``) running in its process group, whose pid it writes to
``--pidfile``: stopping the recipe must end the whole group."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--cv", type=float, default=0.01)
    ap.add_argument("--tflops", type=float, default=200.0, help="at the steady step time")
    ap.add_argument("--sleep", type=float, default=0.02, help="wall seconds per iteration")
    ap.add_argument("--pidfile", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exit-hang", type=float, default=0.0, help="seconds before exiting")
    a = ap.parse_args()
    child = subprocess.Popen(["sleep", "600"])
    with open(a.pidfile, "w") as f:
        f.write(str(child.pid))
    rng = random.Random(a.seed)
    for it in range(1, a.iters + 1):
        head = {1: 9.0, 2: 1.0}.get(it, 0.0)  # allocation, then first kernels
        ms = a.step_ms * (1 + head) * (1 + rng.gauss(0, a.cv))
        tf = a.tflops * a.step_ms / ms
        print(
            f" [2024-04-06 03:02:12] iteration {it:8d}/{a.iters:8d} | consumed samples: "
            f"{it * 8:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU "
            f"(TFLOP/s/GPU): {tf:.1f} | learning rate: 1.000000E-04 | global batch size:     8"
            f" | lm loss: {7.0 - it * 0.001:.6E} | loss scale: 1.0 |",
            flush=True,
        )
        time.sleep(a.sleep)
    print("[after training is done]", flush=True)
    time.sleep(a.exit_hang)  # upstream Megatron-LM's slow exit after its last step
    child.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
