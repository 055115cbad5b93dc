"""Estimates that know their range: one model schema for every table reader, the usable
capacity, the loss's working set, the trust label of every estimate and the sim's verdict."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from dse.model.costmodel import CostModel
from dse.model.costmodel.basis import assess, basis_entries
from dse.model.costmodel.memory import estimate_memory
from dse.model.costmodel.model import HEADROOM_GIB, headroom_from_oom_messages
from dse.model.costmodel.table import evaluate_rows, load_table, row_problem, summarize
from dse.model.rules import check
from dse.results.trust import trust_summary
from dse.space.catalog import catalog
from dse.space.searchspace import ModelSpec, Resources, Semantics, load_space
from dse.space.tablemodel import (
    RowModelError,
    model_row,
    space_model_fields,
    unknown_model_fields,
)
from dse.space.tablemodel import row_problem as table_row_problem
from dse.stats.table import TableError, read_table
from dse.workloads.replay import ReplayTable

ROOT = Path(__file__).resolve().parents[3]
TABLES = sorted((ROOT / "examples" / "tables").glob("*.jsonl")) + sorted(
    (ROOT / "examples" / "studies").glob("*.jsonl")
)
HYBRID = ROOT / "examples" / "studies" / "h200_hybrid_proxy_study_1gpu.jsonl"
OMNI = ROOT / "examples" / "nemotron_omni.yaml"


def _example_spaces() -> list[Path]:
    out = []
    for p in sorted((ROOT / "examples").glob("*.yaml")):
        try:
            load_space(p)
        except Exception:  # noqa: BLE001 - a space that needs a table path or a recipe
            continue
        out.append(p)
    return out


# --- one model schema -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(catalog()))
def test_every_catalog_model_round_trips_through_the_table_schema(name: str) -> None:
    model = ModelSpec.model_validate(catalog()[name].model)
    sem = Semantics(global_batch_size=64, seq_length=4096)
    res = Resources(world_size=8, gpu="NVIDIA H100", gpu_memory_gib=79.6, features=[])
    row = json.loads(json.dumps(model_row(model, sem)))  # as a table file holds it
    back, sem2, _ = table_row_problem(row, 8, {"gpu": "NVIDIA H100", "gpu_memory_gib": 79.6})
    # the row's seq_length is the semantics' (the catalog's is the model's longest)
    assert back.model_dump(exclude={"seq_length"}) == model.model_dump(exclude={"seq_length"})
    assert sem2.seq_length == sem.seq_length
    a = estimate_memory(model, sem, res, {})
    b = estimate_memory(back, sem2, res, {})
    assert a.total_gib == b.total_gib


def test_every_example_space_round_trips_with_the_identical_estimate() -> None:
    spaces = _example_spaces()
    assert len(spaces) >= 8
    for p in spaces:
        sp = load_space(p)
        row = json.loads(json.dumps(model_row(sp.model, sp.semantics)))
        hw = {"gpu": sp.resources.gpu, "gpu_memory_gib": sp.resources.gpu_memory_gib}
        model, sem, _ = table_row_problem(row, sp.resources.world_size, hw)
        assert model.model_dump(exclude={"seq_length"}) == sp.model.model_dump(
            exclude={"seq_length"}
        ), p.name
        params = sp.full_params(sp.baseline())
        a = CostModel(sp.model, sp.semantics, sp.resources).predict_memory(params)
        b = CostModel(model, sem, sp.resources).predict_memory(params)
        assert a.total_gib == b.total_gib, p.name


def test_a_hybrid_row_keeps_its_mamba_fields_and_a_missing_one_is_an_error() -> None:
    row = read_table(HYBRID)[0]
    fields = space_model_fields(row.model)
    assert fields["hybrid_layer_pattern"] == "MEMEM*EMEMEM*"
    assert fields["mamba_num_heads"] == 64
    broken = {k: v for k, v in row.model.items() if k != "mamba_state_dim"}
    with pytest.raises(RowModelError, match="mamba_state_dim"):
        space_model_fields(broken)
    # a field that is not part of the model is named, not fatal
    assert unknown_model_fields({**row.model, "init_method_std": 0.02}) == ["init_method_std"]
    assert space_model_fields({**row.model, "init_method_std": 0.02}) == fields
    # Megatron derives the Mamba heads from the hidden size where a row leaves them out
    no_heads = {k: v for k, v in row.model.items() if k != "mamba_num_heads"}
    assert "mamba_num_heads" not in space_model_fields(no_heads)


def test_a_bad_row_model_is_a_table_error_naming_the_line(tmp_path: Path) -> None:
    rec = json.loads(HYBRID.read_text().splitlines()[0])
    del rec["model"]["mamba_num_groups"]
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    with pytest.raises(TableError, match=r"line 1.*mamba_num_groups"):
        row_problem(load_table(p)[0])


def test_the_hybrid_table_replays_as_a_hybrid_space_whose_rows_pass_the_rules() -> None:
    table = ReplayTable.load(HYBRID)
    space = table.to_space()
    assert space.model.is_hybrid
    assert "mamba_ssm" in space.resources.features
    for r in table.rows:
        assert not check(space, space.full_params(r.params)), r.line


# --- memory: every measured table ----------------------------------------------------------------


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_every_measured_table_fits_right_and_within_ten_percent(path: Path) -> None:
    s = summarize(evaluate_rows(load_table(path)))
    assert s["fits_accuracy"] == 1.0
    assert s["median_abs_rel_error"] <= 0.10


def test_native_fused_cross_entropy_keeps_a_second_fp32_logits_copy() -> None:
    sp = load_space(ROOT / "examples" / "nemotron_h_proxy_h200.yaml")
    base = sp.full_params({**sp.baseline(), "micro_batch_size": 16})
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    fused = cm.predict_memory({**base, "cross_entropy_loss_fusion": True})
    plain = cm.predict_memory({**base, "cross_entropy_loss_fusion": False})
    vt = 16 * 4096 * sp.model.vocab_size
    assert fused.logits_gib - plain.logits_gib == pytest.approx(4 * vt / 2**30)


def test_a_prediction_within_the_headroom_of_the_capacity_is_not_fits() -> None:
    sp = load_space(ROOT / "examples" / "llama_2b_h200.yaml")
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    params = sp.full_params(sp.baseline())
    total = cm.predict_memory(params).total_gib
    cm.resources = sp.resources.model_copy(update={"gpu_memory_gib": total + 0.02})
    assert cm.fits(params, 0.0)[0] is False  # 20 MiB under the capacity is not "fits"
    cm.resources = sp.resources.model_copy(update={"gpu_memory_gib": total + HEADROOM_GIB + 0.01})
    assert cm.fits(params, 0.0)[0] is True


def test_the_headroom_is_derived_from_the_tables_oom_messages() -> None:
    msgs = [
        str(r.metrics.get("error", "")) for p in TABLES for r in read_table(p) if r.status == "oom"
    ]
    assert headroom_from_oom_messages(msgs) == HEADROOM_GIB
    assert headroom_from_oom_messages(["nothing"]) is None
    sp = load_space(ROOT / "examples" / "llama_2b_h200.yaml")
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    cm.observe(
        sp.full_params(sp.baseline()),
        130.0,
        True,
        "GPU 0 has a total capacity of 139.80 GiB of which 512.00 MiB is free.",
    )
    assert cm.headroom_gib == pytest.approx(0.5)


# --- trust ------------------------------------------------------------------------------------


def test_the_packaged_basis_is_what_the_measured_data_give() -> None:
    r = subprocess.run(
        [sys.executable, "scripts/derive_estimate_basis.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    names = {e["name"] for e in basis_entries()}
    assert {p.relative_to(ROOT).as_posix() for p in TABLES} <= names


def test_omni_tp1_is_extrapolated_and_the_published_layouts_are_not() -> None:
    sp = load_space(OMNI)
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    tp1 = cm.trust(sp.full_params({**sp.baseline(), "tensor_model_parallel_size": 1}))
    assert tp1.label == "extrapolated" and "tp=1 outside the measured 2..4" in tp1.why
    assert tp1.speed_band is None
    assert cm.trust(sp.full_params(sp.baseline())).label == "calibrated"
    between = sp.full_params(
        {**sp.baseline(), "micro_batch_size": 2, "tensor_model_parallel_size": 2}
    )
    t = cm.trust(between)
    assert t.label == "interpolated" and t.speed_band is not None
    measured = [sp.full_params({**sp.baseline(), "tensor_model_parallel_size": 1})]
    assert cm.trust(measured[0], measured).label == "calibrated"


def test_a_family_never_measured_on_a_gpu_is_extrapolated() -> None:
    sp = load_space(ROOT / "examples" / "llama3_8b.yaml")
    t = assess(sp.model, sp.semantics, sp.resources, sp.full_params(sp.baseline()), entries=[])
    assert t.label == "extrapolated" and "no measured dense model" in t.why


def test_an_extrapolated_best_is_named_beside_the_best_within_the_measured_range() -> None:
    def trial(n: int, v: float, label: str) -> dict:
        metrics = {"tflops_per_gpu": v, "trust": {"label": label, "why": "w"}}
        return {"number": n, "state": "complete", "params": {"x": n}, "metrics": metrics}

    s = trust_summary(
        [
            trial(0, 100, "calibrated"),
            trial(1, 250, "extrapolated"),
            trial(2, 180, "interpolated"),
        ],
        "tflops_per_gpu",
        "maximize",
    )
    assert s is not None
    assert s["best"]["number"] == 1 and s["best"]["label"] == "extrapolated"
    assert s["trusted_best"] is not None and s["trusted_best"]["number"] == 2
    only = trust_summary([trial(1, 250, "extrapolated")], "tflops_per_gpu", "maximize")
    assert only is not None and only["trusted_best"] is None
    assert (
        trust_summary([{"number": 0, "state": "complete", "metrics": {}}], "t", "maximize") is None
    )


# --- the sim and the pre-screen: one verdict ------------------------------------------------


def test_the_sim_and_the_prescreen_agree_on_memory() -> None:
    from dse.core.records import TrialSpec
    from dse.loop.proposer import cost_model_prescreen
    from dse.workloads.sim import simulate

    sp = load_space(OMNI)
    sp = sp.model_copy(update={"workload": sp.workload.model_copy(update={"name": "sim"})})
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    screen = cost_model_prescreen(sp, cm)
    assert screen is not None
    rng = random.Random(0)
    passed = 0
    for _ in range(60):
        raw = {n: rng.choice(k.values()) for n, k in sp.knobs.items()}
        params = sp.full_params(sp.apply_conditions(raw))
        if check(sp, params, None):
            continue
        if screen(params) is not None:
            continue
        passed += 1
        spec = TrialSpec(
            study="s", trial_number=0, params=params, model=sp.model.model_dump(),
            semantics=sp.semantics.model_dump(), world_size=sp.resources.world_size,
            device="cuda", gpu=sp.resources.gpu, gpu_memory_gib=sp.resources.gpu_memory_gib,
            metrics_path="/dev/null", workload={"name": "sim"},
        )  # fmt: skip
        lines = simulate(spec)
        assert lines[-1].type == "summary", lines[-1]
        assert lines[-1].model_dump()["trust"]["label"] in (
            "calibrated",
            "interpolated",
            "extrapolated",
        )
    assert passed >= 5
