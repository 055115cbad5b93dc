"""The megatron_lm launcher end to end on CPU: the built-in trainer behind a Megatron-LM
command line, launched, parsed and classified like a user's recipe (slow: real training)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.cli.main import main
from dse.storage import open_storage
from tests.conftest import EXAMPLES


def _space(tmp_path: Path, name: str, **upd: Any) -> Path:
    data = yaml.safe_load((EXAMPLES / name).read_text())
    data["knobs"] = {"micro_batch_size": {"values": [1, 4], "baseline": 1}}
    data["agent"] = {"name": "grid", "seed": 0}
    data["budget"].update(n_trials=2, remeasure=0)  # one trial per configuration
    data["runner"]["workdir"] = str(tmp_path / "runs")
    data["env"] = {"fixed": {"NCCL_DEBUG": "WARN"}, "node_steps": ["vboost"]}
    for k, v in upd.items():
        data["workload"]["launcher"][k] = v
    p = tmp_path / f"{name}"
    p.write_text(yaml.safe_dump(data))
    return p


def _trials(url: str, study: str) -> dict[int, Any]:
    st = open_storage(url)
    try:
        rec = st.get_study(study)
        return {t.params["micro_batch_size"]: t for t in st.list_trials(rec.id)}
    finally:
        st.close()


@pytest.mark.slow
def test_megatron_lm_launcher_gives_the_built_in_figures(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    built_in = _space(tmp_path, "tiny_gpt_cpu.yaml")
    launched = _space(tmp_path, "tiny_gpt_cpu_megatron_lm.yaml")
    assert main(["start", "--space", str(built_in), "--storage", url]) == 0
    assert main(["start", "--space", str(launched), "--storage", url]) == 0
    a, b = _trials(url, "tiny-gpt-cpu"), _trials(url, "tiny-gpt-cpu-mlm")
    assert set(a) == set(b) == {1, 4}
    for mbs in (1, 4):
        ma, mb = a[mbs].metrics, b[mbs].metrics
        assert a[mbs].state == b[mbs].state == "complete"
        assert mb["launcher"] == "megatron_lm" and mb["log_format"] == "megatron"
        assert mb["tflops_source"] == "computed" and mb["env"] == {"NCCL_DEBUG": "WARN"}
        assert mb["tflops_per_gpu_log"] > 0  # the log's own figure, beside dse's
        # no GPU driver here: the vboost node step is skipped with a note in both workloads
        assert any(n.startswith("node step vboost") for n in ma["notes"])
        assert any(n.startswith("node step vboost") for n in mb["notes"])
        # same model FLOPs; the same losses (printed by the log to 7 digits)
        assert mb["model_flops_per_step"] == ma["model_flops_per_step"]
        assert mb["losses"] == pytest.approx(ma["losses"], rel=1e-6)
        # the figures each read is consistent with its own step time (speed itself is not
        # compared here: on a shared 2-core machine one configuration varies up to 3x between
        # runs; bench/launcher_vs_builtin.py interleaves the two, and the GPU figure is in
        # docs/BENCHMARKS.md section 7)
        for m in (ma, mb):
            expect = m["model_flops_per_step"] / m["step_time_s"] / 2 / 1e12  # 2 CPU ranks
            assert m["tflops_per_gpu"] == pytest.approx(expect, rel=0.05)
        assert mb["peak_mem_gib"] == pytest.approx(ma["peak_mem_gib"], rel=0.25)


@pytest.mark.slow
def test_invalid_override_recorded_invalid_with_megatrons_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    space = _space(tmp_path, "tiny_gpt_cpu_megatron_lm.yaml",
                   overrides={"--expert-model-parallel-size": 2})  # fmt: skip
    data = yaml.safe_load(space.read_text())
    data["budget"]["n_trials"] = 1
    space.write_text(yaml.safe_dump(data))
    assert main(["start", "--space", str(space), "--storage", url]) == 0
    (t,) = _trials(url, "tiny-gpt-cpu-mlm").values()
    assert t.state == "infeasible" and t.failure_class == "invalid"
    assert "expert parallelism needs" in t.reason and "ep=2" in t.reason
    # the reason recorded is the message of the assertion the Megatron-LM-format log ends in
    log = Path(t.log_path).read_text()
    assert f"AssertionError: {t.reason}" in log
