"""``dse estimate``: registered on a plain ArgumentParser, JSON shapes, bad input -> 2."""

from __future__ import annotations

import argparse
import json

import pytest

from dse.model.costmodel import cli
from dse.space.knobs import get_knob

SPACE = """\
study: t
model: {num_layers: 16, hidden_size: 2048, num_attention_heads: 16, num_query_groups: 8,
        ffn_hidden_size: 5632, vocab_size: 32000}
semantics: {global_batch_size: 8, seq_length: 4096}
resources: {world_size: 1, gpu: NVIDIA H200, gpu_memory_gib: 139.8, features: []}
knobs:
  micro_batch_size: {values: [1, 2, 4, 8]}
  recompute: {values: [none, selective, full]}
  attention_backend: {values: [unfused, sdpa]}
"""

ROW = {
    "params": {"attention_backend": "unfused", "micro_batch_size": 1, "recompute": "none"},
    "status": "ok",
    "metrics": {"peak_mem_gib": 48.9, "tflops_per_gpu": 120.0},
    "world_size": 1,
    "model": {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 16,
              "num_query_groups": 8, "ffn_hidden_size": 5632, "vocab_size": 32000,
              "seq_length": 4096, "global_batch_size": 8, "gated_linear_unit": True,
              "activation": "swiglu", "normalization": "RMSNorm", "precision": "bf16"},
    "hardware": {"gpu": "NVIDIA H200", "gpu_memory_gib": 139.8},
}  # fmt: skip


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dse")
    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(argv)
    return int(args.fn(args))


@pytest.fixture
def space(tmp_path):
    p = tmp_path / "space.yaml"
    p.write_text(SPACE)
    return str(p)


@pytest.fixture
def table(tmp_path):
    rows = [ROW, {**ROW, "params": {**ROW["params"], "micro_batch_size": 8},
                  "status": "oom", "metrics": {"peak_mem_gib": 115.0}}]  # fmt: skip
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(p)


def test_space_json(space, capsys):
    assert _run(["estimate", "--space", space, "--set", "micro_batch_size=2",
                 "--set", "recompute=selective", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "estimate"
    assert out["params"]["micro_batch_size"] == 2 and out["params"]["recompute"] == "selective"
    assert out["params"]["attention_backend"] == "unfused"  # the baseline
    assert out["fits"] is True and out["capacity_gib"] == 139.8
    mem = out["memory"]
    for key in ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib",
                "attention_scores_gib", "logits_gib", "transient_gib", "total_gib"):  # fmt: skip
        assert isinstance(mem[key], float)
    assert out["throughput"]["source"] == "estimate"


def test_space_text(space, capsys):
    assert _run(["estimate", "--space", space]) == 0
    text = capsys.readouterr().out
    assert "estimate" in text and "total" in text and "TFLOP/s" in text


@pytest.mark.parametrize("calibrate", [False, True])
def test_table_json(table, capsys, calibrate):
    argv = ["estimate", "--table", table, "--json"] + (["--calibrate"] if calibrate else [])
    assert _run(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["index"] for r in rows] == [0, 1]
    for r in rows:
        assert {"index", "predicted_peak_mem_gib", "predicted_fits", "status",
                "measured_peak_mem_gib"} <= set(r)  # fmt: skip
        assert isinstance(r["predicted_fits"], bool)
    assert rows[0]["predicted_fits"] is True and rows[1]["predicted_fits"] is False
    assert rows[1]["status"] == "oom"


def test_table_text(table, capsys):
    assert _run(["estimate", "--table", table]) == 0
    assert "fits_accuracy" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "micro_batchsize=2"], "unknown knob"),
        (["--set", "micro_batch_size=two"], "expected an integer"),
        (["--set", "recompute=sometimes"], "expected one of"),
        (["--set", "micro_batch_size"], "KNOB=VALUE"),
        (["--calibrate"], "--calibrate applies to --table"),
    ],
)
def test_bad_space_input_returns_2(space, capsys, extra, message):
    assert _run(["estimate", "--space", space, *extra]) == 2
    assert message in capsys.readouterr().err


def test_missing_files_return_2(tmp_path, capsys):
    assert _run(["estimate", "--space", str(tmp_path / "no.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert _run(["estimate", "--table", str(tmp_path / "no.jsonl"), "--json"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_set_needs_a_space(table, capsys):
    assert _run(["estimate", "--table", table, "--set", "micro_batch_size=2"]) == 2
    assert "--set applies to --space" in capsys.readouterr().err


def test_parse_value():
    assert cli.parse_value("true") is True and cli.parse_value("False") is False
    assert cli.parse_value("4") == 4 and cli.parse_value("none") is None
    assert cli.parse_value("selective") == "selective"


def test_set_takes_a_choice_spelled_none(space, capsys):
    """``recompute=none`` is the choice "none", not a missing value."""
    assert _run(["estimate", "--space", space, "--set", "recompute=none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"]["recompute"] == "none"
    assert cli.parse_value("none") is None  # without a knob: null
    assert cli.parse_value(" full ", get_knob("recompute")) == "full"


def test_estimate_applies_the_rules(tmp_path, capsys):
    """TP 4 on 2 ranks is rejected with the rule's text (exit 2), not estimated to fit."""
    p = tmp_path / "s2.yaml"
    p.write_text(
        SPACE.replace("world_size: 1", "world_size: 2").replace(
            "knobs:\n", "knobs:\n  tensor_model_parallel_size: {values: [1, 2]}\n"
        )
    )
    assert _run(["estimate", "--space", str(p), "--set", "tensor_model_parallel_size=2"]) == 0
    capsys.readouterr()
    assert _run(["estimate", "--space", str(p), "--set", "tensor_model_parallel_size=4"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert "world_divisible: world size must be divisible by TP*PP*CP" in cap.err
    assert "world_size=2, tp=4" in cap.err
