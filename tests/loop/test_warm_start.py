"""A study warm-started from an earlier study of the same model: the agent knows the earlier
trials, so the new study measures the baseline and then only configurations not seen before."""

from __future__ import annotations

from pathlib import Path

import yaml

from dse.cli.main import main
from dse.space.searchspace import params_key
from dse.storage import open_storage
from tests.conftest import EXAMPLES


def _space(tmp_path: Path, study: str, n: int, warm: str | None) -> Path:
    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    d["study"] = study
    d["workload"]["table"] = str(EXAMPLES / "tables" / "h200_llama1b_unfused_1gpu.jsonl")
    d["workload"]["delay_s"] = 0.0
    d["budget"] = {"n_trials": n}
    d["prescreen"] = {"enabled": False}
    d["agent"] = {"name": "random", "seed": 3, **({"warm_start_study": warm} if warm else {})}
    d["runner"] = {"name": "local", "max_parallel": 2, "workdir": str(tmp_path / "runs")}
    p = tmp_path / f"{study}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_warm_start_from_earlier_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["start", "--space", str(_space(tmp_path, "first", 12, None)),
                 "--storage", url]) == 0  # fmt: skip
    assert main(["start", "--space", str(_space(tmp_path, "second", 8, "first")),
                 "--storage", url]) == 0  # fmt: skip
    st = open_storage(url)
    try:
        first = st.list_trials(st.get_study("first").id)
        second = st.list_trials(st.get_study("second").id)
    finally:
        st.close()
    baseline = first[0].params_key
    assert second[0].params_key == baseline  # the baseline is measured again
    seen = {t.params_key for t in first}
    assert len(second) == 8
    # apart from the baseline, nothing the earlier study measured is measured again
    assert not ({t.params_key for t in second[1:]} & seen)
    assert baseline == params_key(first[0].params)
