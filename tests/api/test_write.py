"""Write endpoints: auth, creating a study from a space file (and starting it), stopping."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dse.api.deps import get_spawner
from dse.api.spawn import Spawned, SubprocessSpawner, controller_command
from dse.storage import has_password, open_storage
from tests.api.conftest import TOKEN, make_client
from tests.api.seed import create_study, space_yaml

V1 = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
YAML = {"Content-Type": "application/yaml"}


class RecordingSpawner:
    """Stands in for the subprocess spawner: records what it was asked to start."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *, study: str, storage_url: str, workdir: str) -> Spawned:
        self.calls.append({"study": study, "storage_url": storage_url, "workdir": workdir})
        argv, _ = controller_command(study, storage_url)
        return Spawned(pid=4242, command=argv, log_path=f"{workdir}/{study}/controller.log")


# --- auth ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"), [("post", "/studies"), ("post", "/studies/some-study/stop")]
)
def test_writes_disabled_without_token(writable_url: str, method: str, path: str) -> None:
    with make_client(writable_url, token=None) as c:
        r = c.request(method, V1 + path, headers={**AUTH, **YAML}, content=space_yaml("s"))
        assert r.status_code == 403
        assert "DSE_API_TOKEN" in r.json()["detail"]
        assert c.get(f"{V1}/health").json()["writes_enabled"] is False
        # reads still work
        assert c.get(f"{V1}/studies").status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer "},
    ],
)
def test_writes_need_the_token(writable_url: str, headers: dict[str, str]) -> None:
    with make_client(writable_url) as c:
        for path in ("/studies", "/studies/x/stop"):
            r = c.post(V1 + path, headers={**headers, **YAML}, content=space_yaml("s"))
            assert r.status_code in (401, 403), r.text
            assert r.json()["detail"]
            if r.status_code == 401:
                assert r.headers["www-authenticate"] == "Bearer"
        assert c.get(f"{V1}/studies").json()["count"] == 0


# --- create ----------------------------------------------------------------------------------


def test_create_study(writable_url: str) -> None:
    with make_client(writable_url) as c:
        text = space_yaml("created-by-api")
        r = c.post(f"{V1}/studies", headers={**AUTH, **YAML}, content=text)
        assert r.status_code == 201, r.text
        s = r.json()
        assert s["name"] == "created-by-api" and s["state"] == "created"
        assert s["launch"] is None
        assert s["space_yaml"] == text
        assert s["counts"]["total"] == 0
        assert s["hardware"] == {
            "gpu": "NVIDIA H200", "gpu_memory_gib": 141.0, "world_size": 2, "device": "cuda",
        }  # fmt: skip
        assert c.get(f"{V1}/studies/created-by-api").json()["space_hash"] == s["space_hash"]
        # the same name again
        r = c.post(f"{V1}/studies", headers={**AUTH, **YAML}, content=text)
        assert r.status_code == 409
        assert "already exists" in r.json()["detail"]
    # the study is what `dse start` would have created: the CLI resumes it by name
    storage = open_storage(writable_url)
    try:
        rec = storage.get_study("created-by-api")
        assert rec.metric == "tflops_per_gpu" and rec.direction == "maximize"
        assert rec.model["num_layers"] == 4
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (space_yaml("s").replace("hidden_size: 64", "hidden_size: -1"), "model.hidden_size"),
        (space_yaml("s").replace("micro_batch_size:", "micro_batch_sise:"), "micro_batch_sise"),
        (space_yaml("s").replace("steps: 4", "steps: 4\n  stepz: 1"), "semantics.stepz"),
        ("study: [unclosed", "not valid YAML at line 1"),
        ("- a\n- b\n", "must be a mapping"),
        ("", "empty"),
        ("just a string", "must be a mapping"),
        (space_yaml("a/b"), "must not contain '/'"),
        (space_yaml("..."), None),  # a fine name
    ],
)
def test_create_study_validation(writable_url: str, body: str, words: str | None) -> None:
    with make_client(writable_url) as c:
        r = c.post(f"{V1}/studies", headers={**AUTH, **YAML}, content=body)
        if words is None:
            assert r.status_code == 201
            return
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert isinstance(detail, str) and words in detail, detail
        assert detail.startswith("request body")
        assert c.get(f"{V1}/studies").json()["count"] == 0


def test_create_study_rejects_binary_body(writable_url: str) -> None:
    with make_client(writable_url) as c:
        r = c.post(f"{V1}/studies", headers=AUTH, content=b"\xff\xfe\x00junk")
        assert r.status_code == 422
        assert "UTF-8" in r.json()["detail"]


def test_create_and_start(writable_url: str, tmp_path: Path) -> None:
    spawner = RecordingSpawner()
    with make_client(writable_url) as c:
        c.app.dependency_overrides[get_spawner] = lambda: spawner  # type: ignore[attr-defined]
        body = space_yaml("started").replace(
            "version: 1", f"version: 1\nrunner:\n  workdir: {tmp_path}"
        )
        r = c.post(
            f"{V1}/studies", params={"start": "true"}, headers={**AUTH, **YAML}, content=body
        )
        assert r.status_code == 201, r.text
        launch = r.json()["launch"]
        assert launch["pid"] == 4242
        assert spawner.calls == [
            {"study": "started", "storage_url": writable_url, "workdir": str(tmp_path)}
        ]
        cmd = launch["command"]
        assert cmd[1:5] == ["-m", "dse.cli", "resume", "--study=started"]
        if has_password(writable_url):  # the URL travels in the environment, not argv
            assert "--storage" not in cmd and writable_url not in cmd
            assert controller_command("started", writable_url)[1] == {"DSE_STORAGE": writable_url}
        else:
            assert cmd[-2:] == ["--storage", writable_url]


def test_start_needs_a_shared_database() -> None:
    with make_client("sqlite:///:memory:") as c:
        r = c.post(
            f"{V1}/studies", params={"start": True}, headers={**AUTH, **YAML},
            content=space_yaml("mem"),
        )  # fmt: skip
        assert r.status_code == 409
        assert "in-memory" in r.json()["detail"]


def test_controller_command_keeps_passwords_off_the_command_line() -> None:
    argv, env = controller_command("s", "postgresql+psycopg://dse:secret@db/dse")
    assert "secret" not in " ".join(argv)
    assert env == {"DSE_STORAGE": "postgresql+psycopg://dse:secret@db/dse"}
    argv, env = controller_command("s", "sqlite:///x.db")
    assert argv[-3:] == ["--study=s", "--storage", "sqlite:///x.db"] and env == {}
    assert argv[0] == sys.executable


def test_subprocess_launcher_detaches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real spawner: its own session, output in the study's controller.log."""
    marker = tmp_path / "ran"
    code = f"import os, pathlib; pathlib.Path({str(marker)!r}).write_text(str(os.getsid(0)))"

    def fake_command(study: str, storage_url: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", code + "; print('controller says hi')"], {}

    monkeypatch.setattr("dse.api.spawn.controller_command", fake_command)
    spawned = SubprocessSpawner()(study="s1", storage_url="sqlite:///x.db", workdir=str(tmp_path))
    deadline = time.time() + 30
    log = Path(spawned.log_path or "")
    while time.time() < deadline and not (marker.exists() and log.exists() and log.read_text()):
        time.sleep(0.05)
    assert marker.read_text() == str(spawned.pid)  # session leader: detached from us
    assert spawned.pid != os.getpid()
    assert log == tmp_path / "s1" / "controller.log"
    assert "controller says hi" in log.read_text()


# --- stop ------------------------------------------------------------------------------------


def test_stop(writable_url: str) -> None:
    storage = open_storage(writable_url)
    try:
        create_study(storage, "to-stop")
        storage.set_study_state("to-stop", "running")
        create_study(storage, "finished")
        storage.set_study_state("finished", "complete")
        create_study(storage, "never-started")
    finally:
        storage.close()
    with make_client(writable_url) as c:
        r = c.post(f"{V1}/studies/to-stop/stop", headers=AUTH)
        assert r.status_code == 202, r.text
        assert r.json()["state"] == "stopping"
        assert c.get(f"{V1}/studies/to-stop").json()["state"] == "stopping"
        assert c.post(f"{V1}/studies/to-stop/stop", headers=AUTH).status_code == 202
        for name in ("finished", "never-started"):
            r = c.post(f"{V1}/studies/{name}/stop", headers=AUTH)
            assert r.status_code == 409
            assert "is not running" in r.json()["detail"]
        r = c.post(f"{V1}/studies/nope/stop", headers=AUTH)
        assert r.status_code == 404


def test_pareto_follows_new_trials(writable_url: str) -> None:
    """The Pareto answer is cached per study signature: a new trial shows at once."""
    from tests.api.seed import _run, ok

    storage = open_storage(writable_url)
    try:
        sid = create_study(storage, "live")
        _run(storage, sid, {"micro_batch_size": 1}, ok(100.0, 50.0))
        with make_client(writable_url) as c:
            first = c.get(f"{V1}/studies/live/pareto").json()
            assert [p["number"] for p in first["front"]] == [0]
            assert c.get(f"{V1}/studies/live/pareto").json() == first  # cached, same answer
            _run(storage, sid, {"micro_batch_size": 2}, ok(200.0, 40.0))  # dominates trial 0
            second = c.get(f"{V1}/studies/live/pareto").json()
            assert [p["number"] for p in second["front"]] == [1]
            assert len(second["points"]) == 2
            storage.add_rejection(
                study_id=sid, params={"micro_batch_size": 8}, params_key="8",
                kind="predicted_oom", rule="costmodel", reason="too big", values={},
            )  # fmt: skip
            third = c.get(f"{V1}/studies/live/pareto").json()
            assert [p["kind"] for p in third["points"]][-1] == "predicted_oom"
    finally:
        storage.close()
