"""What a newcomer's next commands say (issue 29): one ``dse:`` prefix on the tie line, a
malformed storage URL and a misspelt space field are bad input (exit 2, with a hint), an
unknown ``--study`` lists the studies there are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from dse.storage import open_storage
from tests.conftest import EXAMPLES
from tests.loop.test_loss_parity_replay import _noise_table, _run, _space


@pytest.fixture
def tied_db(tmp_path: Path) -> str:
    """A study whose best is tied within noise (two configurations, re-measured)."""
    url = f"sqlite:///{tmp_path / 'tied.db'}"
    with open_storage(url) as st:
        _run(_space(_noise_table(tmp_path), "noisy", tmp_path, budget={"remeasure": 2}), st)
    return url


def test_the_tie_line_has_one_prefix(tied_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["best", "--storage", tied_db, "--format", "megatron"]) == 0
    err = capsys.readouterr().err
    assert "dse: tied within noise: trial" in err and "dse: dse:" not in err


def test_an_unknown_study_lists_the_studies_there_are(
    tied_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["best", "--storage", tied_db, "--study", "noisey"]) == 2
    err = capsys.readouterr().err
    assert "no study named 'noisey'" in err and "its studies: noisy" in err


def test_a_storage_url_with_two_slashes_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--storage", "sqlite://dse.db"]) == 2
    assert "sqlite://dse.db" in capsys.readouterr().err
    space = tmp_path / "s.yaml"
    space.write_text((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    assert main(["start", "--space", str(space), "--storage", "sqlite://dse.db"]) == 2
    assert not list(tmp_path.glob("*.db"))  # nothing created, nothing run


def test_a_misspelt_section_gets_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    d["budjet"] = d.pop("budget")
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(d))
    assert main(["validate", str(p)]) == 2
    assert "budjet: Extra inputs are not permitted (did you mean 'budget'?)" in (
        capsys.readouterr().err
    )
