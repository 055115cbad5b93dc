"""Storage queries the REST API relies on: GPU-seconds per study, the 'stopping' state."""

from __future__ import annotations

import pytest

from dse.records import Outcome
from dse.storage import Storage


def _study(storage: Storage, name: str) -> int:
    return storage.create_study(
        name=name, space_yaml="{}", space_hash="h", direction="maximize",
        metric="tflops_per_gpu", model={}, hardware={},
    ).id  # fmt: skip


def _finish(storage: Storage, study_id: int, n: int, gpu_seconds: float | None) -> None:
    params = {"micro_batch_size": n}
    t = storage.claim_trial(
        study_id=study_id, params=params, params_key=str(n), budget=100, runner="r"
    )
    assert t is not None
    storage.start_trial(t.id, runner="r", host="h", log_path=None, metrics_path=None)
    storage.finish_trial(
        t.id, Outcome("ok", {"tflops_per_gpu": 1.0}), value=1.0, gpu_seconds=gpu_seconds
    )


def test_gpu_seconds_sums_a_study(storage: Storage) -> None:
    a, b = _study(storage, "a"), _study(storage, "b")
    assert storage.gpu_seconds(a) == 0.0
    _finish(storage, a, 1, 120.5)
    _finish(storage, a, 2, None)  # CPU trials record none
    _finish(storage, a, 3, 30.0)
    _finish(storage, b, 1, 1000.0)
    assert storage.gpu_seconds(a) == pytest.approx(150.5)
    assert storage.gpu_seconds(b) == pytest.approx(1000.0)
    assert storage.gpu_seconds(999) == 0.0


def test_stopping_is_a_study_state(storage: Storage) -> None:
    _study(storage, "s")
    storage.set_study_state("s", "running")
    storage.set_study_state("s", "stopping")
    assert storage.get_study("s").state == "stopping"
