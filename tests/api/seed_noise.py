"""Studies whose runs are noisy, through the real storage API: one configuration measured
three times (a re-measure among them), configurations within noise of it, one clearly
slower, one with a slow step among its measured steps; a second study of the same model on
another GPU count (the comparison view). Each run's per-step times spread like a GPU's."""

from __future__ import annotations

import random
from typing import Any

from dse.core.records import Outcome, StepMetrics
from dse.space.searchspace import params_key
from dse.storage import Storage
from tests.api.seed import create_study

#: Work per step and GPU (TFLOP): a run's TFLOP/s is this over its step time.
WORK = 50.0
#: The runs of study ``noise-a``: (knobs, steady step time of the run, slow step or None).
RUNS_A: list[tuple[dict[str, Any], float, float | None]] = [
    ({"tensor_model_parallel_size": 1, "micro_batch_size": 2}, 0.500, None),
    ({"tensor_model_parallel_size": 1, "micro_batch_size": 4}, 0.506, None),  # within noise
    ({"tensor_model_parallel_size": 2, "micro_batch_size": 1}, 0.700, None),  # clearly slower
    ({"tensor_model_parallel_size": 1, "micro_batch_size": 2}, 0.492, None),  # re-measure
    ({"tensor_model_parallel_size": 2, "micro_batch_size": 2}, 0.560, 2.4),  # one slow step
    ({"tensor_model_parallel_size": 1, "micro_batch_size": 2}, 0.503, None),  # re-measure
]
RUNS_B: list[tuple[dict[str, Any], float, float | None]] = [
    ({"tensor_model_parallel_size": 1, "micro_batch_size": 1}, 0.600, None),
    ({"tensor_model_parallel_size": 2, "micro_batch_size": 4}, 0.450, None),
]


def knobs(p: dict[str, Any]) -> dict[str, Any]:
    return {"use_distributed_optimizer": False, **p}


def noisy_run(step_s: float, slow: float | None, seed: int, n: int = 8) -> Outcome:
    """A run of ``n`` steps after one warm-up step, about ``step_s`` each (+-0.5 %); the
    fifth measured step takes ``slow`` s when given. Its figures are the median's."""
    rng = random.Random(seed)
    times = [step_s * 3] + [step_s * (1 + rng.gauss(0, 0.005)) for _ in range(n)]
    if slow is not None:
        times[5] = slow
    steps = tuple(
        StepMetrics(
            step=i + 1,
            step_time_s=t,
            tflops_per_gpu=WORK / t,
            peak_mem_gib=20.0,
            peak_reserved_gib=22.0,
            loss=7.0 - 0.05 * i,
            grad_norm=1.0,
        )  # fmt: skip
        for i, t in enumerate(times)
    )
    measured = sorted(times[1:])
    med = (measured[len(measured) // 2 - 1] + measured[len(measured) // 2]) / 2
    return Outcome(
        "ok",
        {
            "tflops_per_gpu": WORK / med,
            "step_time_s": med,
            "peak_mem_gib": 20.0,
            "peak_reserved_gib": 22.0,
            "loss": 6.7,
            "measurement": {"mode": "fixed", "warmup_steps": 1, "measured_steps": n},
            # the trial's own linear interval, as an old runner recorded it: from 0
            "step_time_ci_s": [0.0, med * 2],
        },
        steps=steps,
    )


def _fill(storage: Storage, name: str, runs: list[tuple[dict[str, Any], float, float | None]],
          seed: int, **kw: Any) -> None:  # fmt: skip
    sid = create_study(storage, name, **kw)
    first: dict[str, int] = {}
    for i, (p, step_s, slow) in enumerate(runs):
        params = knobs(p)
        key = params_key(params)
        t = storage.claim_trial(
            study_id=sid, params=params, params_key=key, budget=1000, allow_repeat=True,
            runner="seed:1:x", remeasure_of=first.get(key),
        )  # fmt: skip
        assert t is not None
        first.setdefault(key, t.number)
        storage.start_trial(t.id, runner="seed:1:x", host="node-1", log_path=None,
                            metrics_path=None)  # fmt: skip
        out = noisy_run(step_s, slow, seed * 100 + i)
        storage.finish_trial(t.id, out, value=out.metrics["tflops_per_gpu"], gpu_seconds=10.0)
    storage.set_study_state(name, "complete")


def seed_noise(storage: Storage) -> None:
    _fill(storage, "noise-a", RUNS_A, 1)
    _fill(storage, "noise-b", RUNS_B, 2, world_size=4)
