"""A warm worker returns to its starting memory after each trial: 20 real Megatron-Core
trials on CPU (gloo, one rank) in one worker, the tensors still reachable after each release
counted (``DSE_WORKER_COUNT_TENSORS``) and its resident set read. Before the release cleared
megatron-core's ``RotaryEmbedding.forward`` ``lru_cache``, every trial left its rotary module
and embedding tensor behind (on an H200 the worker's memory crept from 22 to 440 MiB over 15
trials)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dse.runners import Launch
from tests.runners.test_warm_workers import OWNER, _events, _run, _runner
from tests.workloads.test_megatron_trainer import make_spec, needs_megatron

pytestmark = [pytest.mark.slow, needs_megatron]

TRIALS = 20


def _launch(root: Path, tid: int, params: dict[str, Any]) -> Launch:
    d = root / f"trial-{tid:05d}"
    d.mkdir(parents=True)
    spec = make_spec(d, "metrics", params, semantics={"steps": 2, "warmup_steps": 1})
    (d / "trial.json").write_text(spec.model_dump_json())
    return Launch(trial_id=tid, number=tid, argv=[sys.executable], trial_dir=d,
                  metrics_path=Path(spec.metrics_path), log_path=d / "log.txt", world_size=1,
                  device="cpu", env={"DSE_TRIAL_OWNER": OWNER}, spec=spec, timeout_s=300.0,
                  hang_timeout_s=200.0)  # fmt: skip


def _released(root: Path) -> list[dict[str, Any]]:
    return [e for e in _events(root) if e["event"] == "released"]


def test_worker_memory_flat_over_20_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSE_WORKER_COUNT_TENSORS", "1")
    r = _runner(tmp_path)
    r.prepare(OWNER)
    configs = [{}, {"micro_batch_size": 2}, {"attention_backend": "sdpa"}, {"recompute": "full"}]
    try:
        done = [
            _run(r, _launch(tmp_path, i + 1, configs[i % len(configs)])) for i in range(TRIALS)
        ]
        deadline = time.monotonic() + 60  # the last trial's release (after its final line)
        while len(_released(tmp_path)) < TRIALS and time.monotonic() < deadline:
            r.poll()
            time.sleep(0.05)
    finally:
        r.close()
    assert all(f.outcome.ok for f in done), [f.outcome for f in done if not f.outcome.ok]
    assert len({f.worker["pid"] for f in done}) == 1  # type: ignore[index]  # one worker
    rel = _released(tmp_path)
    assert len(rel) == TRIALS
    live = [int(e["release"]["live_cpu_n"]) for e in rel]
    rss = [float(e["memory_mib"]) for e in rel]
    # after the first round of configurations, a trial leaves nothing reachable behind
    assert max(live[len(configs) :]) <= live[len(configs) - 1], live
    # and the resident set stays where the first round left it (allocator noise only)
    assert max(rss[len(configs) :]) - rss[len(configs) - 1] < 24.0, rss
