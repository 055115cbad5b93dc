"""dse/model/space_check.py on its own: a space file validated in a child process bounded in time
and memory, every failure a SpaceError naming the source and the cause, the API token never
passed to the child (the API tests reach it through POST /studies)."""

from __future__ import annotations

import pytest

from dse.core.exceptions import SpaceError
from dse.model.space_check import CheckedSpace, check_space_text
from tests.conftest import EXAMPLES

T = "tests.model.space_check_targets"


def test_a_valid_space_gives_the_study_fields() -> None:
    text = (EXAMPLES / "replay_llama1b.yaml").read_text()
    got = check_space_text(text, "replay.yaml")
    assert isinstance(got, CheckedSpace)
    assert got.name == got.fields["name"] == "replay-llama1b"
    assert got.workdir == "dse_runs"
    assert got.fields["name"] in text


def test_an_invalid_space_names_the_source_and_the_field() -> None:
    text = (EXAMPLES / "replay_llama1b.yaml").read_text().replace("budget:", "budjet:")
    with pytest.raises(SpaceError, match="^posted.yaml") as info:
        check_space_text(text, "posted.yaml")
    assert "budjet" in str(info.value)


def test_the_api_token_is_not_passed_to_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSE_API_TOKEN", "secret-token")
    got = check_space_text("the text", "src", target=f"{T}:environment")
    assert got.fields == {"name": "the text", "token": None}
    assert got.workdir == "src"


def test_the_time_limit_stops_the_child() -> None:
    with pytest.raises(SpaceError, match="^s.yaml: validating the space took longer than the 1 s"):
        check_space_text("x", "s.yaml", timeout_s=1.0, target="tests.api.slow_space:spin")


def test_the_memory_limit_is_the_childs() -> None:
    with pytest.raises(SpaceError, match="more than the 256 MiB memory limit"):
        check_space_text("x", "m.yaml", memory_mib=256, target="tests.api.slow_space:allocate")


@pytest.mark.parametrize(
    "target,message",
    [
        ("not_a_number", "^v.yaml: unusable values"),
        ("value_error", "^v.yaml: the space cannot be validated: ValueError: a value the check"),
        ("crash", "^v.yaml: the space check failed"),
    ],
)
def test_what_the_child_cannot_answer_is_named(target: str, message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        check_space_text("x", "v.yaml", target=f"{T}:{target}")
