"""The loss-parity arithmetic (dse.stats.numerics) and the ``loss_parity`` section of a space
file."""

from __future__ import annotations

from typing import Any

import pytest

from dse.core.exceptions import SpaceError
from dse.core.records import StepMetrics, TrialRecord
from dse.space.searchspace import parse_space
from dse.stats.numerics import (
    DEFAULT_REL_TOLERANCE,
    floor_of,
    judge,
    loss_drift,
    losses_of,
    tolerance_of,
)

#: Losses of the measured H200 table's baseline row (bf16, llama 1B, examples/tables).
H200 = [10.77427, 10.78199, 10.7834, 10.75606, 10.71542, 10.66171]


def _curve(scale: float = 1.0, n: int = len(H200)) -> dict[int, float]:
    return {i: x * scale for i, x in enumerate(H200[:n])}


def test_drift_is_the_largest_relative_difference_on_the_steps_both_ran() -> None:
    base = {0: 10.0, 1: 9.0, 2: 8.0}
    drift, n = loss_drift(base, {0: 10.0, 1: 9.09, 5: 1.0})
    assert n == 2 and drift == pytest.approx(0.01)
    assert loss_drift(base, {7: 1.0}) == (None, 0)


def test_bf16_execution_noise_passes_and_a_one_percent_drift_is_flagged() -> None:
    """GPU fact: across execution knobs a bf16 loss of ~10.7 moves by up to ~0.02."""
    tol = tolerance_of(floor_of(None, "bf16"), 3.0, [])
    assert tol.value == DEFAULT_REL_TOLERANCE["bf16"] == 0.005
    knob = {i: x + (0.02 if i % 2 else -0.02) for i, x in _curve().items()}
    ok = judge(knob, _curve(), baseline_trial=0, tol=tol)
    assert ok["status"] == "ok" and ok["drift"] == pytest.approx(0.02 / 10.66171, rel=1e-6)
    bad = judge(_curve(1.01), _curve(), baseline_trial=0, tol=tol)
    assert bad == {
        "status": "changed",
        "drift": pytest.approx(0.01),
        "tolerance": 0.005,
        "baseline_trial": 0,
        "steps_compared": 6,
    }


def test_shorter_runs_are_compared_on_the_steps_both_ran() -> None:
    tol = tolerance_of(0.005, 3.0, [])
    v = judge(_curve(1.0001, n=3), _curve(), baseline_trial=4, tol=tol)
    assert v["status"] == "ok" and v["steps_compared"] == 3 and v["baseline_trial"] == 4


def test_without_a_reference_or_a_loss_the_trial_is_unchecked() -> None:
    tol = tolerance_of(0.001, 3.0, [])
    assert judge(_curve(), None, baseline_trial=None, tol=tol)["status"] == "unchecked"
    v = judge({}, _curve(), baseline_trial=0, tol=tol)
    assert v["status"] == "unchecked" and v["baseline_trial"] == 0 and v["steps_compared"] == 0


def test_the_tolerance_follows_the_measured_noise_above_its_floor() -> None:
    assert tolerance_of(0.001, 3.0, [0.0002]).value == 0.001  # noise below the floor
    t = tolerance_of(0.001, 3.0, [0.0004, 0.002])
    assert t.value == pytest.approx(0.006) and t.noise == 0.002 and t.pairs == 2
    assert floor_of(0.02, "bf16") == 0.02 and floor_of(None, "fp32") == 0.001


def test_losses_come_from_the_stored_steps_else_the_summary() -> None:
    steps = tuple(
        StepMetrics(i, 0.1, 1.0, 1.0, 1.0, loss) for i, loss in enumerate([7.0, float("nan")])
    )
    t = TrialRecord(1, 1, 0, "complete", {}, "k", {"losses": [1.0, 2.0]}, steps=steps)
    assert losses_of(t) == {0: 7.0}  # NaN dropped, the steps win
    bare = TrialRecord(1, 1, 0, "complete", {}, "k", {"losses": [1.0, 2.0]})
    assert losses_of(bare) == {0: 1.0, 1: 2.0}


def _space(**loss_parity: Any) -> dict[str, Any]:
    return {
        "study": "lp",
        "model": {
            "num_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "ffn_hidden_size": 128,
            "vocab_size": 1024,
        },  # fmt: skip
        "semantics": {"global_batch_size": 8, "seq_length": 64},
        "knobs": {"micro_batch_size": {"values": [1, 2]}},
        "loss_parity": loss_parity,
    }


def test_the_space_file_section_has_defaults_and_clear_errors() -> None:
    lp = parse_space(_space(), "s.yaml").loss_parity
    assert lp.enabled and lp.rel_tolerance is None and lp.noise_factor == 3.0
    assert lp.baseline_repeats == 0 and not lp.allow_changed_in_best
    given = parse_space(_space(rel_tolerance=0.01, allow_changed_in_best=True), "s.yaml")
    assert given.loss_parity.rel_tolerance == 0.01
    bad = {
        "rel_tolerance": (1.5, "s.yaml: loss_parity.rel_tolerance: Input should be less than 1"),
        "noise_factor": (0.5, "loss_parity.noise_factor: Input should be greater than or equal"),
        "enabled": ("maybe", "loss_parity.enabled: Input should be a valid boolean"),
        "tolerance": (0.1, "loss_parity.tolerance: Extra inputs are not permitted"),
    }
    for field, (value, msg) in bad.items():
        with pytest.raises(SpaceError, match=msg.replace(".", r"\.")):
            parse_space(_space(**{field: value}), "s.yaml")
    with pytest.raises(SpaceError, match="baseline_repeats needs loss_parity.enabled: true"):
        parse_space(_space(enabled=False, baseline_repeats=1), "s.yaml")
    with pytest.raises(SpaceError, match=r"budget\.remeasure: Input should be greater than"):
        parse_space({**_space(), "budget": {"remeasure": -1}}, "s.yaml")


def test_new_settings_keep_the_digest_of_earlier_spaces() -> None:
    plain = parse_space(_space(), "s.yaml")
    data = _space()
    del data["loss_parity"]
    assert parse_space(data, "s.yaml").digest() == plain.digest()
    changed = parse_space(_space(rel_tolerance=0.01), "s.yaml")
    assert changed.digest() != plain.digest()
