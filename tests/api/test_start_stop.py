"""End to end: a study created and started through the API runs as a detached ``dse resume``
(replay workload, real study loop) and stops when asked through the API."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.api.conftest import TOKEN, make_client
from tests.conftest import REPO

pytestmark = pytest.mark.slow

V1 = "/api/v1"
#: The study's budget: far more trials than run before the stop.
BUDGET = 40
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _wait(fn: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_start_then_stop_through_the_api(tmp_path: Path) -> None:
    """Stopped after its first complete trial: the study ends ``stopped`` (not complete),
    nothing runs, and no trial starts after the controller saw the stop. The budget (40 of
    the table's 48 configurations, 1 s each, one at a time) is far beyond the stop, so the
    stop never races the budget; what is asserted is order and outcome, not time."""
    space = yaml.safe_load((REPO / "examples" / "replay_llama1b.yaml").read_text())
    space["study"] = "api-started"
    table = REPO / "examples" / "tables" / Path(space["workload"]["table"]).name
    space["workload"].update({"table": str(table), "delay_s": 1.0})
    space["runner"].update({"workdir": str(tmp_path / "runs"), "max_parallel": 1})
    space["budget"]["n_trials"] = BUDGET
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    with make_client(url) as c:
        r = c.post(
            f"{V1}/studies", params={"start": True}, content=yaml.safe_dump(space),
            headers={**AUTH, "Content-Type": "application/yaml"},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        launch = r.json()["launch"]
        assert launch["command"][-2:] == ["--storage", url]
        log = Path(launch["log_path"])

        def study() -> dict[str, Any]:
            return dict(c.get(f"{V1}/studies/api-started").json())

        _wait(
            lambda: study()["state"] == "running" and study()["counts"]["complete"] >= 1,
            f"the controller to run a trial (log: {log.read_text() if log.exists() else ''})",
        )
        r = c.post(f"{V1}/studies/api-started/stop", headers=AUTH)
        assert r.status_code == 202 and r.json()["state"] == "stopping"
        final = _wait(lambda: (s := study())["state"] == "stopped" and s, "the study to stop")
        assert final["counts"]["total"] < BUDGET  # stopped, not spent
        assert final["counts"]["complete"] >= 1
        assert final["counts"]["running"] == 0
        assert c.get(f"{V1}/studies/api-started/best").status_code == 200
    text = log.read_text()
    assert "stop requested" in text, text
    after = text[text.index("stop requested") :]
    assert re.search(r"trial \d+ started", after) is None, after  # nothing started after it
