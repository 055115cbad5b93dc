"""``best_payload`` and ``render_best`` (what ``dse best`` and ``GET .../best`` print), on a
real SQLite storage."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from dse.exceptions import DSEError
from dse.export import best_payload, render_best
from dse.records import BEST_FORMATS, Outcome, StudyRecord
from dse.space import load_space
from dse.storage import Storage, open_storage
from tests.conftest import EXAMPLES

SPACE = EXAMPLES / "tiny_gpt_cpu.yaml"
BEST = {
    "tensor_model_parallel_size": 2, "micro_batch_size": 4, "recompute": "full",
    "attention_backend": "unfused", "use_distributed_optimizer": True,
}  # fmt: skip


@pytest.fixture
def storage() -> Iterator[Storage]:
    with open_storage("sqlite:///:memory:") as st:
        yield st


def study(storage: Storage) -> StudyRecord:
    space = load_space(SPACE)
    rec = storage.create_study(space_yaml=SPACE.read_text(), **space.study_fields())
    return rec


def finish(storage: Storage, rec: StudyRecord, params: dict, out: Outcome, value: float | None):
    t = storage.claim_trial(
        study_id=rec.id, params=params, params_key=json.dumps(params, sort_keys=True), budget=9
    )
    assert t is not None
    storage.finish_trial(t.id, out, value=value)


def ok(tflops: float) -> Outcome:
    return Outcome(
        "ok", {"tflops_per_gpu": tflops, "peak_mem_gib": 0.2, "step_time_s": 0.1, "loss": 6.9}
    )


def test_no_complete_trial_yet_is_an_error_naming_the_study(storage: Storage) -> None:
    rec = study(storage)
    finish(storage, rec, {"micro_batch_size": 2}, Outcome.failure("oom", "CUDA OOM"), None)
    with pytest.raises(DSEError, match="'tiny-gpt-cpu' has no complete trial yet"):
        best_payload(storage, rec)


def test_the_payload_is_the_best_feasible_trial_with_every_knob(storage: Storage) -> None:
    rec = study(storage)
    finish(storage, rec, {"micro_batch_size": 1}, ok(2.0), 2.0)
    finish(storage, rec, BEST, ok(3.5), 3.5)
    finish(storage, rec, {"micro_batch_size": 2}, Outcome.failure("oom", "x"), None)
    p = best_payload(storage, rec)
    assert p["trial"] == 1 and p["study"] == "tiny-gpt-cpu"
    assert p["objective"] == {"metric": "tflops_per_gpu", "direction": "maximize", "value": 3.5}
    assert p["params"] == BEST
    assert p["metrics"]["tflops_per_gpu"] == 3.5 and p["metrics"]["peak_reserved_gib"] is None
    assert p["source"] == "measured" and p["hardware"]["device"] == "cpu"


@pytest.fixture
def payload(storage: Storage) -> dict:
    rec = study(storage)
    finish(storage, rec, BEST, ok(3.5), 3.5)
    return best_payload(storage, rec)


def test_json_and_yaml_round_trip(payload: dict) -> None:
    assert json.loads(render_best(payload, "json")) == payload
    assert yaml.safe_load(render_best(payload, "yaml")) == payload


def test_launcher_formats(payload: dict) -> None:
    assert render_best(payload, "megatron", 4) == (
        "--tensor-model-parallel-size 2 --micro-batch-size 4 --recompute-granularity full "
        "--recompute-method uniform --recompute-num-layers 1 --transformer-impl local "
        "--attention-backend unfused --use-distributed-optimizer"
    )
    bridge = render_best(payload, "bridge").split()
    assert bridge[:2] == ["model.tensor_model_parallel_size=2", "train.micro_batch_size=4"]
    assert "ddp.use_distributed_optimizer=true" in bridge
    nemo = render_best(payload, "nemo").split()
    assert nemo[:2] == ["trainer.strategy.tensor_model_parallel_size=2", "data.micro_batch_size=4"]


def test_every_format_renders_and_an_unknown_one_is_refused(payload: dict) -> None:
    for fmt in BEST_FORMATS:
        assert render_best(payload, fmt, 4).strip()
    with pytest.raises(ValueError, match="unknown format 'toml'; known formats: json, yaml"):
        render_best(payload, "toml")  # type: ignore[arg-type]
