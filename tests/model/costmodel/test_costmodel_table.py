"""The figures on the measured H200 table (shipped in examples/tables/: a missing table is an
error, never a skip)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dse.model.costmodel.table import TableError, evaluate_rows, load_table, spearman, summarize


def test_uncalibrated_figures_on_the_shared_table(shared_table):
    s = summarize(evaluate_rows(load_table(shared_table)))
    assert s["judged_rows"] >= 40
    assert s["fits_accuracy"] >= 0.95
    assert s["median_abs_rel_error"] <= 0.10
    assert s["tflops_spearman"] >= 0.8


def test_sequentially_calibrated_figures_on_the_shared_table(shared_table):
    s = summarize(evaluate_rows(load_table(shared_table), calibrate=True))
    assert s["fits_accuracy"] >= 0.95
    assert s["median_abs_rel_error"] <= 0.10
    assert s["max_abs_rel_error"] <= 0.15


def test_rows_with_other_hardware_get_their_own_capacity(tmp_path, shared_table):
    rows = [json.loads(line) for line in shared_table.read_text().splitlines()[:2]]
    rows[1]["hardware"] = {"gpu": "NVIDIA A100-SXM4-40GB", "gpu_memory_gib": 39.4}
    t = tmp_path / "t.jsonl"
    t.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = evaluate_rows(load_table(t))
    assert res[0].predicted_fits and not res[1].predicted_fits


def test_bad_tables(tmp_path):
    with pytest.raises(TableError, match="cannot read"):
        load_table(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(TableError, match=":1: not JSON"):
        load_table(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TableError, match="no rows"):
        load_table(empty)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert spearman([1, 2], [1, 2]) is None


#: Peak memory (torch.cuda.max_memory_allocated) and step time of Megatron-Core 0.16.1
#: local-spec GPTs (the shared table's 0.9B Llama model, bf16, grad_reduce_in_fp32, torch
#: Adam) measured for this cost model on one and two H200 GPUs: TP2, DP2 with and without
#: the distributed optimizer, PP2 (1F1B), each recompute, unfused and SDPA attention.
PROBE_TABLE = Path(__file__).resolve().parent / "data" / "h200_mcore016_probe.jsonl"


def test_physics_against_megatron_measurements():
    results = evaluate_rows(load_table(PROBE_TABLE))
    s = summarize(results)
    assert s["ok_rows"] == 16
    assert s["median_abs_rel_error"] <= 0.02
    assert s["max_abs_rel_error"] <= 0.03
    assert s["tflops_spearman"] >= 0.9


#: dse's trainer on 2 H200s: TP1 (DP2) / TP2 x MBS x recompute (docs/BENCHMARKS.md).
TWO_GPU_TABLE = (
    Path(__file__).resolve().parents[3] / "examples/tables/h200_llama1b_unfused_2gpu.jsonl"
)


def test_tensor_parallel_memory_against_the_two_gpu_table():
    """The terms TP does not shard without SP, and the unfused attention's per-rank buffers,
    against peaks measured at TP 1 and TP 2 (uncalibrated)."""
    results = evaluate_rows(load_table(TWO_GPU_TABLE))
    s = summarize(results)
    assert s["fits_accuracy"] == 1.0 and s["judged_rows"] == 23
    assert s["median_abs_rel_error"] <= 0.02
    assert s["max_abs_rel_error"] <= 0.03
    tp2 = [r for r in results if r.status == "ok" and r.index < 12]  # the TP 2 rows come first
    assert len(tp2) == 11
    for r in tp2:
        assert r.measured_peak_mem_gib is not None
        assert r.predicted_peak_mem_gib >= 0.98 * r.measured_peak_mem_gib
