"""Calibration: recovers known coefficients from synthetic observations; OOM bounds; state."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest

from dse.model.costmodel import Calibrator, Coefficients, CostModel, estimate_memory
from dse.space.searchspace import ModelSpec, Resources, Semantics

MODEL = ModelSpec(
    num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
    ffn_hidden_size=5632, vocab_size=32000,
)  # fmt: skip
SEM = Semantics(global_batch_size=8, seq_length=4096)
RES = Resources(world_size=1, gpu="NVIDIA H200", gpu_memory_gib=139.8, features=[])
TRUE = Coefficients(activation_scale=1.2, static_offset_gib=0.8, fragmentation=0.1)

CONFIGS = [
    {"micro_batch_size": mbs, "recompute": rc, "attention_backend": att,
     "bias_activation_fusion": fuse}
    for mbs, rc, att, fuse in itertools.product(
        (1, 2, 4), ("none", "selective", "full"), ("unfused", "sdpa"), (False, True)
    )
]  # fmt: skip


def _truth(params: dict) -> float:
    return estimate_memory(MODEL, SEM, RES, params, TRUE).allocated_gib


def _median_error(cm: CostModel, configs: list[dict]) -> float:
    return statistics.median(
        abs(cm.predict_memory(p).allocated_gib - _truth(p)) / _truth(p) for p in configs
    )


def test_calibration_recovers_known_coefficients():
    cm = CostModel(MODEL, SEM, RES)
    fitting = [p for p in CONFIGS if _truth(p) < 130][:10]
    held_out = [p for p in CONFIGS if p not in fitting and _truth(p) < 130]
    before = _median_error(cm, held_out)
    assert before > 0.05  # the defaults are off by construction
    for p in fitting:
        cm.observe(p, _truth(p), oom=False)
    after = _median_error(cm, held_out)
    assert after < before / 5
    assert after < 0.01
    co = cm.coefficients
    assert co.activation_scale == pytest.approx(1.2, abs=0.03)
    assert co.static_offset_gib == pytest.approx(0.8, abs=0.3)
    assert cm.calibration_error is not None and cm.calibration_error < 0.01


def test_margin_shrinks_with_the_error_but_not_below_the_floor():
    cm = CostModel(MODEL, SEM, RES)
    assert cm.margin(0.25) == 0.25  # nothing observed
    for p in CONFIGS[:2]:
        cm.observe(p, _truth(p), oom=False)
    assert cm.margin(0.25) == 0.25  # fewer than three trials: keep the initial margin
    for p in CONFIGS[2:8]:
        cm.observe(p, _truth(p), oom=False)
    m = cm.margin(0.25)
    assert 0.03 <= m < 0.25
    assert m == pytest.approx(max(0.03, min(0.25, 2 * cm.calibration_error * 8 / 6)))


def test_oom_observation_is_a_lower_bound():
    cm = CostModel(MODEL, SEM, RES)
    p = {"micro_batch_size": 8, "recompute": "selective", "attention_backend": "unfused"}
    fits, pred = cm.fits(p, 0.0)
    assert fits and pred < 139.8
    # an OOM that the model thought would fit: the calibrated model must not fit it anymore
    cm.observe(p, 120.0, oom=True)
    fits_after, pred_after = cm.fits(p, 0.0)
    assert not fits_after
    assert pred_after >= 139.8 - 1e-6
    assert cm.predict_memory(p).allocated_gib >= 120.0 - 1e-6


def test_fragmentation_moves_only_as_far_as_the_observations_demand():
    cm = CostModel(MODEL, SEM, RES)
    ok = {"micro_batch_size": 1, "recompute": "none", "attention_backend": "unfused"}
    cm.observe(ok, cm.predict_memory(ok).allocated_gib, oom=False)
    assert cm.coefficients.fragmentation == pytest.approx(0.10)


def test_state_round_trips_through_json():
    cm = CostModel(MODEL, SEM, RES)
    for p in CONFIGS[:5]:
        cm.observe(p, _truth(p), oom=False)
    cm.observe(CONFIGS[-1], 130.0, oom=True)
    state = json.loads(json.dumps(cm.calibration()))
    assert state["n_ok"] == 5 and state["n_oom"] == 1
    assert set(state["coefficients"]) == {
        "activation_scale",
        "static_offset_gib",
        "fragmentation",
        "context_gib",
        "elastic_gib",
    }
    again = CostModel(MODEL, SEM, RES)
    again.load_calibration(state)
    assert again.coefficients == cm.coefficients
    assert again.margin(0.25) == cm.margin(0.25)
    cal = Calibrator.from_dict(state, lambda q, co: estimate_memory(MODEL, SEM, RES, q, co), 139.8)
    assert cal.to_dict()["coefficients"] == state["coefficients"]


def test_everything_fits_without_a_capacity():
    res = Resources(world_size=1, features=[])
    cm = CostModel(MODEL, SEM, res)
    fits, pred = cm.fits({"micro_batch_size": 64}, 0.0)
    assert fits and pred > 1000


def test_rejects_bad_peaks():
    cm = CostModel(MODEL, SEM, RES)
    with pytest.raises(ValueError):
        cm.observe({"micro_batch_size": 1}, float("nan"), oom=False)


def test_prediction_at_or_above_a_measured_oom_does_not_fit() -> None:
    """Once an OOM was measured, anything the model ranks at least as large is rejected,
    even with a generous margin (the model's order is trusted before its level)."""
    from dse.model.costmodel import CostModel
    from dse.space.searchspace import ModelSpec, Resources, Semantics

    model = ModelSpec(
        num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
        ffn_hidden_size=5632, vocab_size=32000,
    )  # fmt: skip
    cm = CostModel(
        model,
        Semantics(global_batch_size=8, seq_length=4096),
        Resources(world_size=1, gpu_memory_gib=139.8, features=[]),
    )
    small = {"micro_batch_size": 2, "recompute": "none", "attention_backend": "unfused"}
    big = {**small, "micro_batch_size": 4}
    bigger = {**small, "micro_batch_size": 8}
    assert cm.fits(big, margin=10.0)[0]  # a huge margin lets everything through ...
    cm.observe(big, 139.0, oom=True)
    assert not cm.fits(big, margin=10.0)[0]  # ... until an OOM at or below it was measured
    assert not cm.fits(bigger, margin=10.0)[0]
    assert cm.fits(small, margin=10.0)[0]


def test_peak_error_counts_only_trials_that_ran() -> None:
    cm = CostModel(MODEL, SEM, RES)
    assert cm.peak_error is None
    cm.observe(CONFIGS[0], 139.8, True)  # an OOM: no peak to compare with
    assert cm.peak_error is None and cm.calibration_error is not None
    for p, f in zip(CONFIGS[1:6], (1.0, 1.1, 0.9, 1.0, 1.3), strict=True):
        cm.observe(p, f * _truth(p), False)
    errs = [
        abs(cm.predict_memory(p).allocated_gib - f * _truth(p)) / (f * _truth(p))
        for p, f in zip(CONFIGS[1:6], (1.0, 1.1, 0.9, 1.0, 1.3), strict=True)
    ]
    assert cm.peak_error == pytest.approx(statistics.median(errs), rel=1e-6)


def _qp_by_every_vertex(a, b, g, h):
    """Reference: every candidate of the two-unknown problem (unconstrained minimum, the
    minimum on each constraint line, each pair of lines' intersection); best feasible."""
    import numpy as np

    q, c = a.T @ a, a.T @ b
    cands = [np.linalg.lstsq(a, b, rcond=None)[0]]
    for j in range(len(h)):
        kkt = np.zeros((3, 3))
        kkt[:2, :2], kkt[:2, 2], kkt[2, :2] = q, -g[j], g[j]
        cands.append(np.linalg.solve(kkt, np.array([c[0], c[1], h[j]]))[:2])
        for k in range(j + 1, len(h)):
            m = np.array([g[j], g[k]])
            if abs(np.linalg.det(m)) > 1e-12:
                cands.append(np.linalg.solve(m, np.array([h[j], h[k]])))
    feasible = [x for x in cands if (g @ x - h >= -1e-9).all()]
    return min(feasible, key=lambda x: float((a @ x - b) @ (a @ x - b))) if feasible else None


def test_qp_matches_the_exhaustive_solution() -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(400):
        m = int(rng.integers(0, 10))
        a = rng.normal(size=(int(rng.integers(2, 8)), 2))
        b = rng.normal(size=a.shape[0])
        g = np.vstack([rng.normal(size=(m, 2)), [[1, 0], [-1, 0], [0, 1], [0, -1]]])
        h = np.concatenate([rng.normal(size=m) * 0.5, [-3, -3, -3, -3]])
        ref = _qp_by_every_vertex(a, b, g, h)
        got = Calibrator._qp(a, b, g, h)
        if ref is None:
            continue
        checked += 1
        assert (g @ got - h >= -1e-7).all()
        r_got, r_ref = a @ got - b, a @ ref - b
        assert float(r_got @ r_got) <= float(r_ref @ r_ref) + 1e-7
    assert checked > 100
