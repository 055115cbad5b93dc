"""An export whose trials are not configurations of its own space file (a knob the space does
not have, a value outside a knob's domain) is refused at import, naming the trial and the
parameter; nothing is stored. Such a study could never be resumed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dse.cli.main import main
from dse.core.exceptions import StudyFormatError, StudyNotFoundError
from dse.space.searchspace import params_key
from dse.storage import open_storage
from tests.api.seed import create_study, ok


def _export(tmp_path: Path) -> dict[str, Any]:
    st = open_storage(f"sqlite:///{tmp_path / 'src.db'}")
    try:
        sid = create_study(st, "src")
        for tp, mbs in ((1, 1), (2, 4)):
            params = {"tensor_model_parallel_size": tp, "micro_batch_size": mbs,
                      "use_distributed_optimizer": True}  # fmt: skip
            t = st.claim_trial(
                study_id=sid, params=params, params_key=params_key(params), budget=10
            )
            assert t is not None
            st.start_trial(t.id, runner="r", host="h", log_path=None, metrics_path=None)
            st.finish_trial(t.id, ok(100.0 * tp, 30.0), value=100.0 * tp)
        return json.loads(json.dumps(st.export_study("src")))
    finally:
        st.close()


def _edit(doc: dict[str, Any], name: str, value: Any, *, rename: str | None = None) -> Any:
    out = copy.deepcopy(doc)
    params = out["trials"][1]["params"]
    if rename:
        params[rename] = params.pop(name)
    else:
        params[name] = value
    return out


CASES = {
    "a knob of another space": (
        {"name": "micro_batch_size", "value": None, "rename": "mbs"},
        "trials[number=1].params.mbs: not a knob of its space_yaml",
    ),
    "a value outside the domain": (
        {"name": "micro_batch_size", "value": 3},
        "trials[number=1].params.micro_batch_size: 3 is not a value",
    ),
    "true for an int knob": (
        {"name": "tensor_model_parallel_size", "value": True},
        "params.tensor_model_parallel_size: True is not a value",
    ),
    "a list value": (
        {"name": "tensor_model_parallel_size", "value": [1]},
        "params.tensor_model_parallel_size: [1] is not a value",
    ),
}


def test_an_export_of_its_own_space_imports(tmp_path: Path) -> None:
    st = open_storage(f"sqlite:///{tmp_path / 'dst.db'}")
    try:
        rec = st.import_study(_export(tmp_path), name="copy")
        assert len(st.list_trials(rec.id)) == 2
    finally:
        st.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_trials_of_another_space_are_refused(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, message = CASES[case]
    doc = _edit(_export(tmp_path), **edit)
    url = f"sqlite:///{tmp_path / 'dst.db'}"
    st = open_storage(url)
    try:
        with pytest.raises(StudyFormatError, match="trials of another space") as e:
            st.import_study(doc, name="copy")
        assert message in str(e.value)
        with pytest.raises(StudyNotFoundError):
            st.get_study("copy")
    finally:
        st.close()
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(doc))
    assert main(["import", str(f), "--storage", url]) == 2
    assert message in capsys.readouterr().err
