"""Polls of ``/best`` while heavy answers are built: what a read-thread count costs the polls.

    python bench/api_heavy_read.py --trials 10000 --pollers 10 --duration 30 [--threads 1]
    python bench/api_heavy_read.py --trials 50000 --db /tmp/b50k.db --duration 30

``--db PATH``: the database file, built there when it does not exist and kept (a 50,000-trial
build takes minutes; before/after runs then read the same file). The first insights request
is the cold one (nothing of the study kept yet): its time is printed on its own line.

Builds the SQLite database of ``bench/api_latency.py`` (``--trials`` trials), starts the real
server (``dse serve``; ``--threads`` sets ``DSE_READ_THREADS``, unset: the server's
default), then for ``--duration`` seconds runs ``--pollers`` clients that poll
``/api/v1/studies/bench/best`` back to back (answered from the read cache while the study
does not change) and one client that asks for the study's insights (PED-ANOVA importance,
slices, GPU-hours) over and over, each with another ``cost_per_gpu_hour`` so that every
request is a fresh build, the heaviest read answer there is. It prints the insights build
times and the ``/best`` latency percentiles: with one read thread a poll that needs no build
still waits on the event loop only, but a build it needs waits behind the insights.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_latency import STUDY, build_database, pct, start_server  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.api.live import free_port  # noqa: E402


async def _load(base: str, pollers: int, duration: float) -> tuple[list[float], list[float]]:
    best: list[float] = []
    heavy: list[float] = []
    deadline = time.perf_counter() + duration
    limits = httpx.Limits(max_connections=pollers + 2)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:

        async def poll() -> None:
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                r = await client.get(f"/api/v1/studies/{STUDY}/best")
                r.raise_for_status()
                best.append((time.perf_counter() - t) * 1000)

        async def insights() -> None:
            k = 0
            while time.perf_counter() < deadline:
                k += 1
                t = time.perf_counter()
                r = await client.get(
                    f"/api/v1/studies/{STUDY}/insights", params={"cost_per_gpu_hour": 1 + k}
                )
                r.raise_for_status()
                heavy.append((time.perf_counter() - t) * 1000)

        await asyncio.gather(insights(), *(poll() for _ in range(pollers)))
    return best, heavy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10000)
    ap.add_argument("--pollers", type=int, default=10)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=None, help="DSE_READ_THREADS (unset: default)")
    ap.add_argument("--db", type=Path, default=None, help="the SQLite file (built if missing)")
    args = ap.parse_args(argv)
    if args.threads is None:
        os.environ.pop("DSE_READ_THREADS", None)
    else:
        os.environ["DSE_READ_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory() as d:
        db = args.db or Path(d) / "bench.db"
        url = f"sqlite:///{db}"
        if not db.exists():
            build_database(url, args.trials)
        port = free_port()
        load0 = os.getloadavg()[0]
        proc = start_server(url, port, Path(d) / "server.log")
        try:
            best, heavy = asyncio.run(_load(f"http://127.0.0.1:{port}", args.pollers,
                                            args.duration))  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        load1 = os.getloadavg()[0]
        with sqlite3.connect(db) as con:
            n_trials = con.execute("SELECT count(*) FROM trials").fetchone()[0]
    threads = args.threads if args.threads is not None else "default"
    print(f"sqlite, {n_trials} trials, read threads {threads}, {args.pollers} pollers, "
          f"{args.duration:.0f} s")  # fmt: skip
    print(f"load average {load0:.2f} -> {load1:.2f}")
    print(f"cold insights (the first request): {heavy[0]:.0f} ms")
    print(f"insights builds: {len(heavy)}, median {statistics.median(heavy):.0f} ms, "
          f"max {max(heavy):.0f} ms")  # fmt: skip
    rate = len(best) / args.duration
    print(f"/best polls: {len(best)} ({rate:.0f}/s), p50 {pct(best, 50):.1f} ms, "
          f"p99 {pct(best, 99):.1f} ms, max {max(best):.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
