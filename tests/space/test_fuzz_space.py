"""Fuzz: hostile space files (mutated fields, hostile constraints, YAML tricks, bytes that are
not UTF-8) are accepted or refused with a SpaceError naming the file and the field (CLI: exit
2); never a traceback, never a hang (each example is bounded by the parse and check limits)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings

from dse.cli.main import main
from dse.core.exceptions import SpaceError
from dse.model.rules import check_space
from dse.space.searchspace import parse_space_text
from tests.hostile import assert_clean_message, space_bytes, space_texts

SOURCE = "fuzz.yaml"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=space_texts())
def test_parse_space_text(text: str) -> None:
    try:
        space = parse_space_text(text, SOURCE)
        check_space(space, SOURCE)
    except SpaceError as e:
        message = str(e)
        assert_clean_message(message, SOURCE)
        for line in message.splitlines():
            assert line.startswith(f"{SOURCE}: "), message  # each problem names the file ...
            assert len(line) > len(SOURCE) + 8, message  # ... and says what
        return
    assert len(space.digest()) == 64  # what an accepted space is hashed with stays bounded


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(raw=space_bytes())
def test_cli_validate(tmp_path: Path, raw: bytes, capsys: object) -> None:
    p = tmp_path / "fuzz.yaml"
    p.write_bytes(raw)
    rc = main(["validate", str(p)])
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert rc in (0, 2), err
    if rc == 2:
        assert_clean_message(err, str(p))
