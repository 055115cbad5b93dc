"""Hostile input to the API: slow or explosive space files, 500s, secrets in child processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dse.api import Settings, create_app
from dse.api.deps import SpaceChecker
from tests.api.conftest import TOKEN, make_client
from tests.api.live import serve
from tests.api.seed import space_dict, space_yaml

V1 = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"}


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hostile.db'}"


def _health_while(base: str, busy: threading.Thread) -> list[float]:
    """Seconds per ``/health`` request, sequential, while ``busy`` runs."""
    out: list[float] = []
    with httpx.Client(base_url=base, timeout=30) as c:
        while busy.is_alive():
            t0 = time.perf_counter()
            assert c.get(f"{V1}/health").status_code == 200
            out.append(time.perf_counter() - t0)
            time.sleep(0.05)
    return out


def _post_in_thread(base: str, body: str) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def post() -> None:
        t0 = time.perf_counter()
        r = httpx.post(f"{base}{V1}/studies", headers=AUTH, content=body, timeout=120)
        result.update(status=r.status_code, detail=r.json().get("detail"))
        result["s"] = time.perf_counter() - t0

    t = threading.Thread(target=post)
    t.start()
    time.sleep(0.2)  # let the validation begin
    return t, result


def test_slow_space_does_not_stall_other_clients(tmp_path: Path) -> None:
    """A space whose constraint takes long to evaluate (7**10**7): other clients are
    answered meanwhile, and the request ends with a 422 within the time limit."""
    data = space_dict("slow")
    data["constraints"] = ["7**10**7 > 0"]
    with serve(_sqlite(tmp_path), api_token=TOKEN, validate_timeout_s=2) as base:
        t, result = _post_in_thread(base, yaml.safe_dump(data))
        times = _health_while(base, t)
        t.join()
    assert result["status"] == 422, result
    assert result["s"] < 10, result
    assert times and max(times) < 1.0, times


def test_validation_time_limit(tmp_path: Path) -> None:
    """A check that never ends is stopped at the limit: 422 naming the limit, the server
    keeps answering."""
    app = create_app(settings=Settings(storage=_sqlite(tmp_path), api_token=TOKEN))
    app.state.space_checker = SpaceChecker(1.0, 512, target="tests.api.slow_space:spin")
    with serve("", app=app) as base:
        t, result = _post_in_thread(base, space_yaml("spins"))
        times = _health_while(base, t)
        t.join()
        studies = httpx.get(f"{base}{V1}/studies").json()
    assert result["status"] == 422, result
    assert "longer than the 1 s limit" in result["detail"]
    assert result["detail"].startswith("request body")
    assert result["s"] < 5
    assert times and max(times) < 1.0, times
    assert studies["count"] == 0


def test_validation_memory_limit(tmp_path: Path) -> None:
    app = create_app(settings=Settings(storage=_sqlite(tmp_path), api_token=TOKEN))
    app.state.space_checker = SpaceChecker(20.0, 256, target="tests.api.slow_space:allocate")
    with make_client(_sqlite(tmp_path)) as c:
        c.app.state.space_checker = app.state.space_checker  # type: ignore[attr-defined]
        r = c.post(f"{V1}/studies", headers=AUTH, content=space_yaml("grows"))
        assert r.status_code == 422, r.text
        assert "256 MiB memory limit" in r.json()["detail"]
        assert c.get(f"{V1}/health").status_code == 200


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["    l0: &l0 [" + ", ".join(["1"] * width) + "]"]
    for i in range(1, levels):
        refs = ", ".join([f"*l{i - 1}"] * width)
        lines.append(f"    l{i}: &l{i} [{refs}]")
    return "runner:\n  options:\n" + "\n".join(lines) + "\n"


def test_yaml_alias_bomb_does_not_kill_the_server(tmp_path: Path) -> None:
    """A 1.8 KB alias chain in ``runner.options`` (9**9 elements once expanded): a 422, and
    the server still answers (it used to abort with a 4 GiB allocation)."""
    data = space_dict("bomb")
    text = yaml.safe_dump(data) + _alias_bomb()
    assert len(text.encode()) < 3000
    with make_client(_sqlite(tmp_path)) as c:
        r = c.post(f"{V1}/studies", headers=AUTH, content=text)
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("request body")
        assert c.get(f"{V1}/health").status_code == 200
        assert c.get(f"{V1}/studies").json()["count"] == 0


def test_body_too_large_is_413(tmp_path: Path) -> None:
    with make_client(_sqlite(tmp_path)) as c:
        body = space_yaml("big") + "#" + "x" * (1024 * 1024)
        r = c.post(f"{V1}/studies", headers=AUTH, content=body)
        assert r.status_code == 413
        assert "at most" in r.json()["detail"]


@pytest.mark.parametrize("constraint", ["1 // 0 == 0", "tensor_model_parallel_size + 'a' > 0"])
def test_constraint_errors_are_422(tmp_path: Path, constraint: str) -> None:
    data = space_dict("c")
    data["constraints"] = [constraint]
    with make_client(_sqlite(tmp_path)) as c:
        r = c.post(f"{V1}/studies", headers=AUTH, content=yaml.safe_dump(data))
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("request body")
