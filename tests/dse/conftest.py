"""A real replay study of the measured H200 table (examples/replay_llama1b.yaml), run once per
module through ``dse start``: what the export and report tests read."""

from __future__ import annotations

from pathlib import Path

import pytest

from dse.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def replay_study(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The storage URL of a finished replay study ``replay-llama1b``."""
    d = tmp_path_factory.mktemp("replay")
    url = f"sqlite:///{d / 'dse.db'}"
    rc = main(["start", "--space", str(EXAMPLES / "replay_llama1b.yaml"), "--storage", url,
               "--workdir", str(d / "runs")])  # fmt: skip
    assert rc == 0
    return url
