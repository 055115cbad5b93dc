"""``dse estimate --set``: a conditional knob whose ``when:`` does not hold is said to be
inactive, with its condition and the values that break it (it was silently ignored); the
device-peak line says what it is when the need exceeds the capacity (it said "at most the
capacity" beside a figure above it)."""

from __future__ import annotations

import json

import pytest

from dse.cli.main import main
from tests.conftest import EXAMPLES

OMNI = str(EXAMPLES / "nemotron_omni.yaml")


def test_an_inactive_conditional_knob_is_named_with_its_condition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["estimate", "--space", OMNI, "--set", "recompute_modules=moe,layernorm",
                 "--set", "recompute=none"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "note: recompute_modules='moe,layernorm' is inactive" in out
    assert "when: recompute = 'selective'" in out and "(recompute='none')" in out
    # active once its condition holds: no note
    assert main(["estimate", "--space", OMNI, "--set", "recompute_modules=moe,layernorm",
                 "--set", "recompute=selective"]) == 0  # fmt: skip
    assert "inactive" not in capsys.readouterr().out
    # JSON: the same reason, under not_taken
    assert main(["estimate", "--space", OMNI, "--json", "--set",
                 "recompute_modules=moe,layernorm"]) == 0  # fmt: skip
    got = capsys.readouterr()
    assert "inactive" in json.loads(got.out)["not_taken"]["recompute_modules"]
    assert "inactive" in got.err


def test_the_device_peak_line_of_a_configuration_that_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["estimate", "--space", OMNI, "--set", "tensor_model_parallel_size=1",
                 "--set", "micro_batch_size=4"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "usable of 79.6 GiB: NO" in out
    line = next(x for x in out.splitlines() if "device peak" in x)
    peak = float(line.split()[2])
    assert peak > 79.6 and "at most the capacity" not in line
    assert "the need alone exceeds the capacity 79.6" in line
