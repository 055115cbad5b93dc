"""Error contract: JSON ``{"detail": message}``; dse errors -> 4xx/503; only bugs -> 500."""

from __future__ import annotations

import logging

import pytest

from dse.api import Settings, create_app
from dse.api.deps import get_storage
from dse.api.errors import status_of
from dse.core.exceptions import (
    DSEError,
    DuplicatedStudyError,
    SchemaVersionError,
    SpaceError,
    StorageError,
    StudyNotFoundError,
    TrialNotFoundError,
)
from tests.api.conftest import TestClient
from tests.conftest import free_port

V1 = "/api/v1"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (StudyNotFoundError("x"), 404),
        (TrialNotFoundError("x"), 404),
        (DuplicatedStudyError("x"), 409),
        (SpaceError("x"), 422),
        (SchemaVersionError("x"), 503),
        (StorageError("x"), 503),
        (DSEError("x"), 400),
    ],
)
def test_status_of_dse_errors(exc: DSEError, code: int) -> None:
    assert status_of(exc) == code


def test_unreachable_database_is_503(caplog: pytest.LogCaptureFixture) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    token = {"Authorization": "Bearer t0ken"}
    with caplog.at_level(logging.WARNING, logger="dse.api"):
        with TestClient(create_app(settings=Settings(storage=url, api_token="t0ken"))) as c:
            for path in ("/health", "/studies", "/studies/x", "/trials/1"):
                r = c.get(V1 + path, headers=token)
                assert r.status_code == 503, (path, r.text)
                assert "127.0.0.1" in r.json()["detail"]  # names the server it tried
                # a reader without the token is not told where the database is
                r = c.get(V1 + path)
                assert r.status_code == 503, (path, r.text)
                assert "127.0.0.1" not in r.text and "cannot be reached" in r.text
            assert c.get("/").status_code == 200  # the dashboard still loads
    assert "not available yet" in caplog.text


def test_a_bug_is_a_logged_500(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(settings=Settings(storage="sqlite:///:memory:", api_token=None))

    def broken() -> None:
        raise RuntimeError("a bug")

    app.dependency_overrides[get_storage] = broken
    with caplog.at_level(logging.ERROR, logger="dse.api"):
        with TestClient(app, raise_server_exceptions=False) as c:
            r = c.get(f"{V1}/studies")
    assert r.status_code == 500
    assert r.json() == {"detail": "internal server error (logged)"}
    assert "a bug" in caplog.text and "unhandled error on GET /api/v1/studies" in caplog.text


def test_unknown_routes_and_methods_are_json() -> None:
    with TestClient(create_app(settings=Settings(storage="sqlite:///:memory:"))) as c:
        r = c.get(f"{V1}/nothing")
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
        r = c.delete(f"{V1}/studies")
        assert r.status_code == 405 and "detail" in r.json()


def test_storage_url_argument_wins_over_settings() -> None:
    app = create_app(
        storage_url="sqlite:///:memory:", settings=Settings(storage="sqlite:///elsewhere.db")
    )
    assert app.state.settings.storage == "sqlite:///:memory:"


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSE_STORAGE", "sqlite:///from-env.db")
    monkeypatch.setenv("DSE_API_TOKEN", "s3cret")
    s = Settings()
    assert s.storage == "sqlite:///from-env.db"
    assert s.writes_enabled and s.api_token is not None
    assert "s3cret" not in repr(s)
    monkeypatch.setenv("DSE_API_TOKEN", "")
    assert not Settings().writes_enabled
