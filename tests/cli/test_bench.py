"""``dse bench`` on a small synthetic table."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from dse.cli import bench
from tests.conftest import REPLAY_TABLE

MODEL = {
    "num_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "ffn_hidden_size": 512,
    "vocab_size": 1024,
    "seq_length": 128,
    "global_batch_size": 8,
    "gated_linear_unit": True,
    "normalization": "RMSNorm",
    "precision": "bf16",
}


def _table(path: Path) -> Path:
    """mbs x recompute x fusion; mbs 8 without recompute OOMs, one row is invalid, one combo
    has no row."""
    lines = []
    for mbs, rec, fus in itertools.product(
        [1, 2, 4, 8], ["none", "selective", "full"], [False, True]
    ):
        p = {"micro_batch_size": mbs, "recompute": rec, "bias_activation_fusion": fus}
        if (mbs, rec, fus) == (1, "full", True):
            continue  # no row
        mem = 10 + 8 * mbs * {"none": 1.0, "selective": 0.6, "full": 0.2}[rec]
        row: dict[str, Any] = {"params": p, "world_size": 1, "model": MODEL,
                               "hardware": {"gpu": "H200", "gpu_memory_gib": 70.0}}  # fmt: skip
        if (mbs, rec, fus) == (2, "full", False):
            row.update(status="invalid", metrics={"error": "refused"})
        elif mem > 70:
            row.update(status="oom", metrics={"peak_mem_gib": 68.0})
        else:
            t = 100 + 5 * mbs + {"none": 30, "selective": 20, "full": 0}[rec] + 2 * fus
            m = {"tflops_per_gpu": t, "step_time_s": 1.0, "peak_mem_gib": mem, "loss": [1.0, 0.9]}
            row.update(status="ok", metrics=m)
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    bench.register(sub)
    return ap.parse_args(["bench", *argv])


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = _table(tmp_path / "t.jsonl")
    args = _args("--table", str(t), "--agents", "tpe,nsga2,random,grid", "--seeds", "2", "--json")
    assert args.fn is bench.run
    assert bench.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    # 24 combos - 1 without row - 1 invalid row = 22 valid (the OOM rows count: they run)
    assert out["n_valid"] == 22 and out["budget"] == 22
    assert out["best_value"] == 100 + 5 * 8 + 20 + 2  # mbs 8, selective recompute, fused
    assert set(out["agents"]) == {"tpe", "nsga2", "random", "grid"}
    for a in out["agents"].values():
        assert len(a["trials_to_target"]) == 2
        assert 0.0 <= a["reached_fraction"] <= 1.0
        reached = [x for x in a["trials_to_target"] if x is not None]
        assert all(1 <= x <= 22 for x in reached)
        if a["reached_fraction"] == 1.0:
            assert a["median_trials_to_target"] == sum(reached) / 2
        for key in (
            "oom_trials_run",
            "prescreen_rejections",
            "prescreen_saved",
            "rule_rejections",
        ):
            assert isinstance(a[key], int)


def test_readable_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = _table(tmp_path / "t.jsonl")
    assert bench.run(_args("--table", str(t), "--agents", "random", "--seeds", "2")) == 0
    out = capsys.readouterr().out
    assert "22 valid configurations" in out and "\nrandom " in out
    assert "memory hint on" in out


def test_memory_hint_switch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = _table(tmp_path / "t.jsonl")
    for flag, on in (([], True), (["--no-memory-hint"], False)):
        args = _args("--table", str(t), "--agents", "tpe", "--seeds", "2", "--json", *flag)
        assert bench.run(args) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["memory_hint"] is on
        assert out["agents"]["tpe"]["reached_fraction"] == 1.0


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--table", "missing.jsonl"], "missing.jsonl"),
        (["--agents", "tpe,annealing"], "unknown agent"),
        (["--seeds", "0"], "--seeds"),
        (["--target-gap", "1.5"], "--target-gap"),
    ],
)
def test_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    t = _table(tmp_path / "t.jsonl")
    full = argv if argv[0] == "--table" else ["--table", str(t), *argv]
    assert bench.run(_args(*full)) == 2
    assert match in capsys.readouterr().err


def test_prescreen_with_the_cost_model(capsys: pytest.CaptureFixture[str]) -> None:
    """The real cost model on the measured H200 table: it rejects only configurations the
    table measured as OOM, and no OOM is launched."""
    argv = ["--table", str(REPLAY_TABLE), "--agents", "grid", "--seeds", "2", "--prescreen"]
    assert bench.run(_args(*argv, "--json")) == 0
    a = json.loads(capsys.readouterr().out)["agents"]["grid"]
    assert a["oom_trials_run"] == 0
    assert a["prescreen_rejections"] > 0
    assert a["prescreen_saved"] == a["prescreen_rejections"]  # every rejection was an OOM
