"""Storage speaks the vocabulary of dse.core.records: its states are the records' states (a trial
``pruned`` among them: stopped early, dominated), and a row holding a value no dse writes (a
trial ``abandoned``, a study ``paused``) still loads."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from sqlalchemy import create_engine, text

from dse.core.records import FINISHED_STATES, STUDY_STATES, TRIAL_STATES, TrialState
from dse.storage import has_password, is_ephemeral, open_storage, safe_url


def test_states_are_the_vocabularys(tmp_path: Path) -> None:
    st = open_storage(f"sqlite:///{tmp_path / 's.db'}")
    try:
        s = st.create_study(
            name="s", space_yaml="knobs: {}\n", space_hash="h", direction="maximize",
            metric="tflops_per_gpu", model={}, hardware={},
        )  # fmt: skip
        assert set(st.count_trials(s.id)) == {*get_args(TrialState), "total"}
        assert "pruned" in FINISHED_STATES and st.count_trials(s.id)["pruned"] == 0
        assert "abandoned" not in TRIAL_STATES and "paused" not in STUDY_STATES
        assert "interrupted" in STUDY_STATES  # the controller stopped on an error
        with pytest.raises(ValueError, match="trial state must be one of"):
            st.list_trials(s.id, state="abandoned")
        with pytest.raises(ValueError, match="study state must be one of"):
            st.set_study_state("s", "paused")
    finally:
        st.close()


def test_a_dropped_value_in_a_stored_row_still_loads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    st = open_storage(url)
    s = st.create_study(
        name="s", space_yaml="knobs: {}\n", space_hash="h", direction="maximize",
        metric="tflops_per_gpu", model={}, hardware={},
    )  # fmt: skip
    t = st.claim_trial(study_id=s.id, params={"a": 1}, params_key='{"a": 1}', budget=5)
    assert t is not None
    st.close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE trials SET state = 'abandoned', failure_class = 'lost'"))
        conn.execute(text("UPDATE studies SET state = 'paused'"))
    engine.dispose()
    st = open_storage(url)
    try:
        assert st.get_study("s").state == "paused"
        row = st.get_trial(t.id)
        assert row.state == "abandoned" and row.failure_class == "lost"
        assert st.count_trials(s.id)["abandoned"] == 1 and st.count_trials(s.id)["total"] == 1
        assert [p.state for p in st.list_trial_points(s.id)] == ["abandoned"]
    finally:
        st.close()


@pytest.mark.parametrize(
    ("url", "shown", "ephemeral", "password"),
    [
        ("sqlite:///:memory:", "sqlite:///:memory:", True, False),
        ("sqlite://", "sqlite://", True, False),
        ("sqlite:///dse_runs/s.db", "sqlite:///dse_runs/s.db", False, False),
        ("postgresql+psycopg://u:secret@db/s", "postgresql+psycopg://u:***@db/s", False, True),
        ("not a url", "not a url", False, False),
    ],
)
def test_urls_are_storages_business(url: str, shown: str, ephemeral: bool, password: bool) -> None:
    assert safe_url(url) == shown
    assert is_ephemeral(url) is ephemeral
    assert has_password(url) is password


def test_an_open_storage_shows_its_url_without_password() -> None:
    with open_storage("sqlite:///:memory:") as st:
        assert st.display_url == "sqlite:///:memory:" and st.is_ephemeral
        assert repr(st) == "Storage('sqlite:///:memory:')"
