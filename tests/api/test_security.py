"""The trust model (docs/SECURITY.md): who reads, who writes, safe defaults of `dse serve`."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from dse.api import Settings, create_app
from dse.api.config import bind_warnings, is_loopback
from dse.cli.main import main as cli_main
from dse.space.searchspace import params_key
from dse.storage import open_storage
from tests.api.conftest import TestClient
from tests.api.live import free_port
from tests.api.seed import create_study, ok, space_yaml

V1 = "/api/v1"
TOKEN = "security-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'sec.db'}"
    storage = open_storage(url)
    try:
        create_study(storage, "s1")
    finally:
        storage.close()
    return url


def test_protected_reads_need_the_token(tmp_path: Path) -> None:
    url = _db(tmp_path)
    app = create_app(settings=Settings(storage=url, api_token=TOKEN, protect_reads=True))
    with TestClient(app) as c:
        for path in ("/studies", "/studies/s1", "/studies/s1/trials", "/trials/1", "/best?gpu=x"):
            r = c.get(V1 + path)
            assert r.status_code == 401, (path, r.text)
            assert "protects reads" in r.json()["detail"]
            assert c.get(V1 + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get(f"{V1}/studies", headers=AUTH).json()["count"] == 1
        assert c.get(f"{V1}/studies/s1", headers=AUTH).status_code == 200
        # liveness stays open, without the database URL
        health = c.get(f"{V1}/health")
        assert health.status_code == 200 and health.json()["storage"] == "sqlite"


def test_protected_reads_need_a_configured_token() -> None:
    with pytest.raises(ValidationError, match="DSE_PROTECT_READS needs a token"):
        Settings(storage="sqlite://", api_token=None, protect_reads=True)


def test_open_reads_by_default(tmp_path: Path) -> None:
    with TestClient(create_app(settings=Settings(storage=_db(tmp_path), api_token=TOKEN))) as c:
        assert c.get(f"{V1}/studies").json()["count"] == 1


def test_readers_never_see_a_database_password_of_a_space_file(tmp_path: Path) -> None:
    """A space file posted with its database URL (password included) is kept and shown with
    the password masked, to readers with or without the token."""
    body = space_yaml("pw") + "storage: postgresql+psycopg://dse:db-secret-1@db:5432/dse\n"
    url = f"sqlite:///{tmp_path / 'pw.db'}"
    with TestClient(create_app(settings=Settings(storage=url, api_token=TOKEN))) as c:
        r = c.post(f"{V1}/studies", content=body, headers={**AUTH, "Content-Type": "text/yaml"})
        assert r.status_code == 201, r.text
        for headers in ({}, AUTH):
            for path in ("/studies/pw", "/studies"):
                got = c.get(f"{V1}{path}", headers=headers)
                assert got.status_code == 200 and "db-secret-1" not in got.text
        shown = c.get(f"{V1}/studies/pw").json()["space_yaml"]
        assert "storage: postgresql+psycopg://dse:***@db:5432/dse" in shown


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.org", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_bind_policy() -> None:
    none = Settings(storage="sqlite://", api_token=None)
    token = Settings(storage="sqlite://", api_token=TOKEN)
    protected = Settings(storage="sqlite://", api_token=TOKEN, protect_reads=True)
    assert bind_warnings("127.0.0.1", none, public_reads=False) == []
    with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0"):
        bind_warnings("0.0.0.0", none, public_reads=False)
    assert "reads are public" in bind_warnings("0.0.0.0", none, public_reads=True)[0]
    assert "reads are public" in bind_warnings("0.0.0.0", token, public_reads=False)[0]
    assert "need the token" in bind_warnings("0.0.0.0", protected, public_reads=False)[0]


@pytest.mark.parametrize("token", ["a", "dse", "   short-token  ", "x" * 15])
def test_a_guessable_token_is_refused_off_loopback(
    token: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token is what keeps code execution (a write starts trial processes) from everyone
    who reaches the port: off loopback it must not be guessable. On loopback any goes."""
    settings = Settings(storage="sqlite://", api_token=token)
    with pytest.raises(ValueError, match="needs at least 16"):
        bind_warnings("0.0.0.0", settings, public_reads=True)
    assert bind_warnings("127.0.0.1", settings, public_reads=False) == []
    assert bind_warnings("0.0.0.0", Settings(storage="sqlite://", api_token="y" * 16),
                         public_reads=False)  # fmt: skip
    monkeypatch.setenv("DSE_API_TOKEN", token)
    rc = cli_main(["serve", "--storage", "sqlite://", "--host", "0.0.0.0", "--port", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0" in err and "token_urlsafe" in err
    assert "x" * 15 not in err  # the token is not echoed


def test_serve_off_loopback_without_token_refuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DSE_API_TOKEN", raising=False)
    monkeypatch.delenv("DSE_PUBLIC_READS", raising=False)
    rc = cli_main(["serve", "--storage", "sqlite://", "--host", "0.0.0.0", "--port", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0" in err and "--public-reads" in err


def test_serve_with_public_reads_warns_and_serves(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "serve", "--storage", _db(tmp_path), "--host",
         "0.0.0.0", "--port", str(port), "--public-reads"],
        stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        deadline, up = time.time() + 30, False
        while time.time() < deadline and not up and proc.poll() is None:
            try:
                up = httpx.get(f"http://127.0.0.1:{port}{V1}/health", timeout=1).is_success
            except httpx.HTTPError:
                time.sleep(0.1)
        assert up, "dse serve --public-reads did not come up"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert b"warning: serving on 0.0.0.0: reads are public" in err


# --- cross-study /best: implausible values do not win -------------------------------------


def _finish(storage: Any, study_id: int, n: int, value: float) -> None:
    params = {
        "tensor_model_parallel_size": 1,
        "micro_batch_size": n,
        "use_distributed_optimizer": False,
    }
    t = storage.claim_trial(
        study_id=study_id, params=params, params_key=params_key(params), budget=100,
        allow_repeat=True, runner="t:1:x",
    )  # fmt: skip
    storage.start_trial(t.id, runner="t:1:x", host="h", log_path="l", metrics_path="m")
    storage.finish_trial(t.id, ok(min(value, 1e300), 50.0), value=value)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_cross_best_ignores_implausible_values(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A study with 1e308, inf and 50,000 TFLOP/s on an H200 (peak 989 dense BF16) does not
    win the cross-study /best; the honest study does."""
    from tests.api.conftest import new_url

    url = new_url(backend, request, tmp_path)
    storage = open_storage(url)
    try:
        honest = create_study(storage, "honest")
        _finish(storage, honest, 1, 350.0)
        poisoned = create_study(storage, "poisoned")
        for n, v in enumerate([1e308, math.inf, 50_000.0, 300.0], start=1):
            _finish(storage, poisoned, n, v)
    finally:
        storage.close()
    with TestClient(create_app(settings=Settings(storage=url, api_token=None))) as c:
        r = c.get(f"{V1}/best", params={"num_layers": 4, "gpu": "NVIDIA H200"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert sorted(body["matched"]) == ["honest", "poisoned"]
        assert body["best"]["study"] == "honest"
        assert body["best"]["objective"]["value"] == 350.0


# --- the shipped image and compose file ---------------------------------------------------

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_compose_ships_no_password_and_publishes_on_loopback() -> None:
    import yaml

    text = (DOCKER / "compose.yaml").read_text()
    compose = yaml.safe_load(text)
    db_env = compose["services"]["db"]["environment"]
    api_env = compose["services"]["api"]["environment"]
    # secrets are required variables (compose refuses to start without them), never literals
    assert db_env["POSTGRES_PASSWORD"].startswith("${DSE_DB_PASSWORD:?")
    assert api_env["DSE_API_TOKEN"].startswith("${DSE_API_TOKEN:?")
    assert "${DSE_DB_PASSWORD:?" in api_env["DSE_STORAGE"]
    assert "dse:dse@" not in text
    assert all(str(p).startswith("127.0.0.1:") for p in compose["services"]["api"]["ports"])


def test_image_bakes_in_no_credentials() -> None:
    text = (DOCKER / "Dockerfile.controller").read_text()
    assert "DSE_STORAGE=" not in text and "DSE_API_TOKEN=" not in text
    assert "@db:" not in text
