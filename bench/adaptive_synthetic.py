"""The adaptive stopping rule on seeded synthetic step-time series with a known steady state.

    python bench/adaptive_synthetic.py --reps 500 --baseline-rev b859976

Each scenario draws ``--reps`` series of ``--max-steps`` steps: a slow head (5x, 2x, 1.3x,
1.1x the steady step time, as after a cold start), Gaussian jitter of the given relative
standard deviation around a steady step time of 1, and, per scenario, spikes: ``k`` steps of
5-50x at random positions among the 20 steps after the head (``early``) or anywhere after it
(``any``), with ``k`` from 1 to 3; or every step after the head slow with probability ``p``
by 1.2-3x (``frequent``: a heavy tail rather than rare spikes). Each rule runs on each series
until it stops (``min_steps`` 10, ``max_steps`` 50, +-1% at 95% unless told), and the table
gives the share of runs that converged, the median number of steps, and the coverage: the
share of runs whose interval contains 1, the centre of the jitter.

Rules: ``trim T`` is :class:`dse.stats.measure.StepSeries` of this checkout with its location the
T-trimmed mean (0: the mean; the warm-up detection is this checkout's either way);
``--baseline-rev REV`` adds the rule of ``dse/stats/measure.py`` at git revision REV (loaded from
``git show``), e.g. the mean with MSER on the raw series.

Synthetic, seeded: what the rule does on series of a known shape, not a measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dse.stats import measure

HEAD = (4.0, 1.0, 0.3, 0.1)  # the head's slowdown over the steady step time


def draw(
    rng: np.random.Generator, n: int, cv: float, spikes: str, k_max: int = 3, p: float = 0.1
) -> list[float]:
    """One series of a scenario (see the module docstring)."""
    x = 1.0 + rng.normal(0.0, cv, n)
    x[: len(HEAD)] *= 1.0 + np.asarray(HEAD)
    h = len(HEAD)
    if spikes in ("early", "any"):
        k = int(rng.integers(1, k_max + 1))
        pool = np.arange(h, h + 20) if spikes == "early" else np.arange(h, n)
        at = rng.choice(pool, k, replace=False)
        x[at] *= rng.uniform(5.0, 50.0, k)
    elif spikes == "frequent":
        slow = rng.random(n) < p
        slow[:h] = False
        x[slow] *= rng.uniform(1.2, 3.0, int(slow.sum()))
    return [float(v) for v in x]


def _module_at(rev: str) -> ModuleType:
    """``dse/stats/measure.py`` as it was at ``rev``, imported under another name."""
    src = subprocess.run(
        ["git", "show", f"{rev}:dse/stats/measure.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"measure_{rev}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _runner(mod: ModuleType, spec_kw: dict[str, Any], **kw: Any) -> Callable[[list[float]], Any]:
    spec = mod.MeasurementSpec(mode="adaptive", **spec_kw)

    def run(xs: list[float]) -> tuple[int, Any]:
        s = mod.StepSeries(spec, steps=6, warmup_steps=2, **kw)
        for x in xs:
            if s.add(x) is not None:
                break
        return len(s.times), s.result()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-steps", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=50)
    ap.add_argument("--rel-halfwidth", type=float, default=0.01)
    ap.add_argument("--trims", default="0,0.1,0.2", help="comma-separated trimmed fractions")
    ap.add_argument("--baseline-rev", default=None, help="also the rule at this git revision")
    args = ap.parse_args(argv)
    spec_kw = {
        "min_steps": args.min_steps,
        "max_steps": args.max_steps,
        "rel_halfwidth": args.rel_halfwidth,
    }
    rules: dict[str, Callable[[list[float]], Any]] = {}
    if args.baseline_rev:
        rules[f"rev {args.baseline_rev}"] = _runner(_module_at(args.baseline_rev), spec_kw)
    for t in (float(v) for v in args.trims.split(",")):
        rules[f"trim {t:g}"] = _runner(measure, spec_kw, trim=t)
    scenarios = [
        ("no spikes", 0.01, "none"),
        ("no spikes", 0.02, "none"),
        ("1-3 spikes 5-50x, early", 0.01, "early"),
        ("1-3 spikes 5-50x, early", 0.02, "early"),
        ("1-3 spikes 5-50x, early", 0.03, "early"),
        ("1-3 spikes 5-50x, anywhere", 0.01, "any"),
        ("1-3 spikes 5-50x, anywhere", 0.02, "any"),
        ("10% of steps 1.2-3x", 0.01, "frequent"),
        ("10% of steps 1.2-3x", 0.02, "frequent"),
    ]
    print(
        f"{args.reps} series per scenario, {args.min_steps}-{args.max_steps} steps, "
        f"+-{args.rel_halfwidth:.0%} at 95%; cells: converged / median steps / coverage of 1"
    )
    print("| scenario | jitter | " + " | ".join(rules) + " |")
    print("|---|---:|" + "---:|" * len(rules))
    for name, cv, kind in scenarios:
        cells = []
        for run in rules.values():
            rng = np.random.default_rng(args.seed)  # the same series for every rule
            conv, steps, hits = 0, [], 0
            for _ in range(args.reps):
                n, r = run(draw(rng, args.max_steps, cv, kind))
                conv += r.stop_reason == "converged"
                steps.append(n)
                ci = r.step_time_ci_s
                hits += ci is not None and ci[0] <= 1.0 <= ci[1]
            cells.append(
                f"{conv / args.reps:.2f} / {statistics.median(steps):g} / {hits / args.reps:.3f}"
            )
        print(f"| {name} | {cv:.0%} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
