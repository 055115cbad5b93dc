"""``dse start --space examples/nemotron_omni.yaml --workload sim``: a full study on the cost
model, every figure labelled an estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dse.cli.main import main

OMNI = Path(__file__).resolve().parents[2] / "examples" / "nemotron_omni.yaml"


@pytest.mark.slow
def test_omni_study_on_the_cost_model(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'omni.db'}"
    rc = main(
        ["start", "--space", str(OMNI), "--workload", "sim", "--n-trials", "6",
         "--storage", db, "--workdir", str(tmp_path / "runs")]
    )  # fmt: skip
    assert rc == 0
    err = capsys.readouterr().err
    assert "every figure is an estimate" in err  # the file's workload is bridge
    assert "tflops_per_gpu=" in err and " estimate)" in err
    assert main(["status", "--storage", db, "--format", "json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state"] == "complete"
    done = [t for t in st["trials"] if t["state"] == "complete"]
    assert done and all(t["value"] > 0 for t in done)
    # the baseline (prior recipe) is trial 0, the hand-tuned configuration trial 1
    assert st["trials"][1]["params"]["recompute_modules"] == "moe,layernorm"
