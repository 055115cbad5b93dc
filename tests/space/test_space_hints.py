"""A misspelt space field gets a "did you mean" with the field it resembles, at any depth;
a malformed storage URL is bad input (:class:`StorageURLError`, exit 2 in the CLI)."""

from __future__ import annotations

import pytest
import yaml

from dse.core.exceptions import SpaceError, StorageURLError
from dse.space.searchspace import parse_space
from dse.storage import open_storage
from tests.conftest import EXAMPLES


def _tiny() -> dict:
    return yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())


def test_a_misspelt_top_level_field_names_the_one_it_resembles() -> None:
    d = _tiny()
    d["budjet"] = d.pop("budget")
    with pytest.raises(SpaceError) as e:
        parse_space(d, "s.yaml")
    want = "s.yaml: budjet: Extra inputs are not permitted (did you mean 'budget'?)"
    assert want in str(e.value)


def test_a_misspelt_nested_field_names_its_sibling() -> None:
    d = _tiny()
    d["budget"]["n_trails"] = d["budget"].pop("n_trials")
    d["semantics"]["seq_lenght"] = d["semantics"].pop("seq_length")
    with pytest.raises(SpaceError) as e:
        parse_space(d, "s.yaml")
    assert "budget.n_trails: Extra inputs are not permitted (did you mean 'n_trials'?)" in str(
        e.value
    )
    assert "(did you mean 'seq_length'?)" in str(e.value)


def test_no_hint_where_nothing_resembles() -> None:
    d = _tiny()
    d["zzzzqqq"] = 1
    with pytest.raises(SpaceError) as e:
        parse_space(d, "s.yaml")
    assert "zzzzqqq: Extra inputs are not permitted" in str(e.value)
    assert "did you mean" not in str(e.value)


def test_a_sqlite_url_with_two_slashes_is_a_url_error() -> None:
    with pytest.raises(StorageURLError, match="sqlite://dse.db"):
        open_storage("sqlite://dse.db")
