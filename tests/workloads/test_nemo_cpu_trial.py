"""NeMo 2.0's own trainer as a dse trial on the CPU (examples/tiny_gpt_cpu_nemo.yaml):
NeMo's llm.llama3_8b recipe, shrunk by overrides, run by ``dse start`` through the NeMo
launcher and dse's module :mod:`dse.workloads.megatron.nemo_cpu`, in the interpreter that has
NeMo 2.0 (``DSE_NEMO_PYTHON``; skipped without it). The rendering runs everywhere."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from dse.space.searchspace import load_space
from dse.storage import open_storage
from dse.workloads.launchers._core import launcher_for
from dse.workloads.launchers.nemo_installed import CPU_ENTRY_MODULE, PYTHON_ENV
from tests.conftest import EXAMPLES

SPACE = EXAMPLES / "tiny_gpt_cpu_nemo.yaml"

needs_nemo = pytest.mark.skipif(
    not os.environ.get(PYTHON_ENV),
    reason="NeMo 2.0 is not installed beside dse (set DSE_NEMO_PYTHON to an interpreter that "
    "has the nemo extra: nemo-toolkit 2.7.3, megatron-core 0.15.3)",
)


def test_the_cpu_entry_runs_in_the_interpreter_that_has_nemo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    space = load_space(SPACE)
    monkeypatch.setenv(PYTHON_ENV, "/opt/nemo-env/bin/python")
    argv = launcher_for(space).render(space.baseline(), python="dse-python").argv
    assert argv[:3] == ["/opt/nemo-env/bin/python", "-m", CPU_ENTRY_MODULE]
    assert argv[3:6] == ["--factory", "llama3_8b", "-y"]
    assert "trainer.accelerator=cpu" in argv and "trainer.devices=1" in argv
    monkeypatch.delenv(PYTHON_ENV)
    assert (
        launcher_for(space).render(space.baseline(), python="dse-python").argv[0] == "dse-python"
    )
    # a space that names its interpreter keeps it
    monkeypatch.setenv(PYTHON_ENV, "/opt/nemo-env/bin/python")
    data = yaml.safe_load(SPACE.read_text())
    data["workload"]["launcher"]["python"] = "/srv/python"
    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump(data))
    space = load_space(named)
    assert launcher_for(space).render(space.baseline(), python="/srv/python").argv[0] == (
        "/srv/python"
    )


@pytest.mark.slow
@needs_nemo
def test_a_nemo_trial_trains_on_the_cpu_with_nemos_own_trainer(tmp_path: Path) -> None:
    data = yaml.safe_load(SPACE.read_text())
    data["knobs"] = {"micro_batch_size": {"values": [2], "baseline": 2}}
    data["budget"].update(n_trials=1, remeasure=0)
    data["runner"]["workdir"] = str(tmp_path / "runs")
    space = tmp_path / SPACE.name
    space.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path}/s.db"
    assert main(["start", "--space", str(space), "--storage", url]) == 0
    st = open_storage(url)
    try:
        (t,) = st.list_trials(st.get_study("tiny-gpt-cpu-nemo").id)
    finally:
        st.close()
    assert t.state == "complete", (t.failure_class, t.reason)
    m = t.metrics
    assert m["launcher"] == "nemo" and m["log_format"] == "nemo"
    assert m["steps"] == 4 and len(m["losses"]) == 4
    assert all(math.isfinite(x) and 5.0 < x < 8.0 for x in m["losses"])  # ~ln(1024) at start
    assert m["step_time_s"] > 0 and m["tflops_source"] == "computed"
    # the overrides were resolved through NeMo before the recipe started, all as asked
    assert m["resolved_check"].startswith("resolved-configuration check: ")
    assert "fields as asked" in m["resolved_check"]
    log = Path(t.log_path).read_text()
    # NeMo's own trainer ran: its factory recipe, its progress lines, on the CPU with gloo
    assert "running NeMo's llm.llama3_8b.pretrain_recipe" in log
    assert "distributed_backend=gloo" in log
    assert "Training epoch 0, iteration 3/3" in log
    spec = json.loads((Path(t.log_path).parent / "trial.json").read_text())
    assert "data.micro_batch_size=2" in spec["workload"]["rendered"]["argv"]
