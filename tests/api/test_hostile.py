"""Hostile input to the API: slow or explosive space files, 500s, secrets in child processes."""

from __future__ import annotations

import json
import logging
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dse.api import Settings, create_app
from dse.api.deps import SpaceChecker
from dse.api.spawn import SubprocessSpawner, controller_command
from dse.cli.main import build_parser
from tests.api.conftest import TOKEN, make_client
from tests.api.live import serve
from tests.api.seed import space_dict, space_yaml

V1 = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"}


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hostile.db'}"


def _health_while(base: str, busy: threading.Thread, events: list[str]) -> None:
    """Sequential ``/health`` requests while ``busy`` runs, each answer noted in ``events``
    ("health") in the order it came (no wall time: the order is what a stall would change)."""
    with httpx.Client(base_url=base, timeout=60) as c:
        while busy.is_alive():
            assert c.get(f"{V1}/health").status_code == 200
            events.append("health")
            time.sleep(0.05)


def _post_in_thread(
    base: str, body: str, events: list[str]
) -> tuple[threading.Thread, dict[str, Any]]:
    """POST ``body`` in a thread; its answer goes to ``events`` ("post") when it comes."""
    result: dict[str, Any] = {}

    def post() -> None:
        r = httpx.post(f"{base}{V1}/studies", headers=AUTH, content=body, timeout=120)
        result.update(status=r.status_code, detail=r.json().get("detail"))
        events.append("post")

    t = threading.Thread(target=post)
    t.start()
    time.sleep(0.2)  # let the validation begin
    return t, result


def _answered_meanwhile(events: list[str]) -> int:
    """How many ``/health`` answers came before the POST's answer. A server that stalls
    while it checks the space answers none (or the one already in flight) before it."""
    assert "post" in events, events
    return events.index("post")


def test_slow_space_does_not_stall_other_clients(tmp_path: Path) -> None:
    """A space whose constraint takes long to evaluate (7**10**7): the request ends with a
    422 naming the constraint or the time limit, and other clients are answered before it."""
    data = space_dict("slow")
    data["constraints"] = ["7**10**7 > 0"]
    events: list[str] = []
    with serve(_sqlite(tmp_path), api_token=TOKEN, validate_timeout_s=2) as base:
        t, result = _post_in_thread(base, yaml.safe_dump(data), events)
        _health_while(base, t, events)
        t.join()
    assert result["status"] == 422, result
    assert "constraints[0]" in result["detail"] or "s limit" in result["detail"], result
    if "s limit" in result["detail"]:  # it ran to the limit: others were answered meanwhile
        assert _answered_meanwhile(events) >= 2, events


def test_validation_time_limit(tmp_path: Path) -> None:
    """A check that never ends is stopped at the limit: 422 naming the limit, the server
    keeps answering."""
    app = create_app(settings=Settings(storage=_sqlite(tmp_path), api_token=TOKEN))
    app.state.space_checker = SpaceChecker(1.0, 512, target="tests.api.slow_space:spin")
    events: list[str] = []
    with serve("", app=app) as base:
        t, result = _post_in_thread(base, space_yaml("spins"), events)
        _health_while(base, t, events)
        t.join()
        studies = httpx.get(f"{base}{V1}/studies").json()
    assert result["status"] == 422, result
    assert "longer than the 1 s limit" in result["detail"]  # stopped at the limit, not run out
    assert result["detail"].startswith("request body")
    assert _answered_meanwhile(events) >= 2, events
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
    """A 1.8 KB alias chain in ``runner.options`` (9**9 elements once expanded): the server
    still answers (it used to abort with a 4 GiB allocation). Whether the space is refused
    (422: the parser bounds aliases, or the check ran out of memory in its child process) or
    accepted (201: nothing expands it any more) depends on the parser; never a crash."""
    data = space_dict("bomb")
    text = yaml.safe_dump(data) + _alias_bomb()
    assert len(text.encode()) < 3000
    with make_client(_sqlite(tmp_path)) as c:
        r = c.post(f"{V1}/studies", headers=AUTH, content=text)
        assert r.status_code in (201, 422), r.text
        if r.status_code == 422:
            assert r.json()["detail"].startswith("request body")
        assert c.get(f"{V1}/health").status_code == 200
        count = c.get(f"{V1}/studies").json()["count"]
        assert count == (1 if r.status_code == 201 else 0)


def test_body_too_large_is_413(tmp_path: Path) -> None:
    with make_client(_sqlite(tmp_path)) as c:
        body = space_yaml("big") + "#" + "x" * (1024 * 1024)
        r = c.post(f"{V1}/studies", headers=AUTH, content=body)
        assert r.status_code == 413
        assert "at most" in r.json()["detail"]


@pytest.mark.parametrize(
    "constraint",
    ["1 // 0 == 0", "tensor_model_parallel_size + 'a' > 0", "micro_batch_size > 100", "1 +"],
)
def test_constraint_errors_are_422(tmp_path: Path, constraint: str) -> None:
    """Each names the constraint by where it is (``constraints[1]``) and its text."""
    data = space_dict("c")
    data["constraints"] = ["micro_batch_size >= 1", constraint]
    with make_client(_sqlite(tmp_path)) as c:
        r = c.post(f"{V1}/studies", headers=AUTH, content=yaml.safe_dump(data))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith("request body")
        assert "constraints[1]" in detail and repr(constraint) in detail


# --- a bug answers a JSON 500 on a connection that stays open, logged once ------------------


def test_a_500_keeps_the_connection_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings=Settings(storage=_sqlite(tmp_path), api_token=None))

    def broken() -> None:
        raise RuntimeError("a bug on purpose")

    app.add_api_route("/boom", broken)
    with caplog.at_level(logging.ERROR), serve("", app=app) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            stream = sock.makefile("rb")
            sock.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = _read_response(stream)
            assert status == 500 and json.loads(body) == {
                "detail": "internal server error (logged)"
            }
            assert headers.get("connection", "").lower() != "close"
            # the same connection answers the next request
            sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = _read_response(stream)
            assert status == 200 and json.loads(body)["status"] == "ok"
    tracebacks = [
        r for r in caplog.records if r.exc_info and "a bug on purpose" in str(r.exc_info[1])
    ]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]


def _read_response(stream: Any) -> tuple[int, dict[str, str], bytes]:
    status = int(stream.readline().split()[1])
    headers = {}
    while (line := stream.readline().strip()) != b"":
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = stream.read(int(headers.get("content-length", "0")))
    return status, headers, body


# --- a client that leaves mid-body: one log line, no traceback, nothing created -----------


def test_client_disconnecting_mid_body_is_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = _sqlite(tmp_path)
    body = space_yaml("left").encode()
    with caplog.at_level(logging.INFO, logger="dse.api"), serve(url, api_token=TOKEN) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            head = (
                f"POST {V1}/studies HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/yaml\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body[: len(body) // 2])
        # the server sees the disconnect when it reads on: wait for what it logs of it
        deadline = time.monotonic() + 120
        while not any(r.name == "dse.api" for r in caplog.records):
            assert time.monotonic() < deadline, "nothing logged of the disconnect"
            time.sleep(0.05)
        with httpx.Client(base_url=base, timeout=60) as c:  # the server answers on
            assert c.get(f"{V1}/health").status_code == 200
            assert c.get(f"{V1}/studies").json()["count"] == 0  # nothing created
    ours = [r for r in caplog.records if r.name == "dse.api"]
    assert [r.levelno for r in ours] == [logging.INFO], [r.getMessage() for r in ours]
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records]
    # (how much of the half sent the server read before it saw the disconnect varies)
    said = rf"the client disconnected after \d+ of {len(body)} bytes"
    assert re.search(said, ours[0].getMessage())


# --- what a started controller gets -------------------------------------------------------


@pytest.mark.parametrize("name", ["-rf", "--help", "-", "--storage=x", "a b", "ü"])
def test_controller_command_takes_any_study_name(name: str) -> None:
    """A name starting with '-' is the study's name, not an option of `dse resume`."""
    argv, _ = controller_command(name, "sqlite:///x.db")
    assert argv[1:3] == ["-m", "dse.cli"]
    args = build_parser().parse_args(argv[3:])
    assert args.study == name and args.storage == "sqlite:///x.db"


def test_controller_does_not_inherit_the_api_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "env.json"
    code = (
        "import json, os, pathlib; "
        f"pathlib.Path({str(out)!r}).write_text(json.dumps(dict(os.environ)))"
    )

    def command(study: str, storage_url: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", code], {"DSE_STORAGE": storage_url}

    monkeypatch.setenv("DSE_API_TOKEN", "secret-token-of-the-api")
    monkeypatch.setenv("DSE_SOMETHING_ELSE", "kept")
    monkeypatch.setattr("dse.api.spawn.controller_command", command)
    SubprocessSpawner()(study="s", storage_url="sqlite:///x.db", workdir=str(tmp_path))
    deadline = time.time() + 30
    while time.time() < deadline and not (out.exists() and out.read_text()):
        time.sleep(0.05)
    env = json.loads(out.read_text())
    assert "DSE_API_TOKEN" not in env
    assert env["DSE_SOMETHING_ELSE"] == "kept" and env["DSE_STORAGE"] == "sqlite:///x.db"


# --- fuzz: mutated space files as POST /studies bodies -----------------------------------

_HOSTILE_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        ["\x00", "\x1b[2J", "../x", "-rf", "a/b", "", " ", "1e999", "!!python/object"]
    ),
    st.lists(st.integers(), max_size=5),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
    st.none(),
    st.booleans(),
)


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(d, dict):
        for k, v in d.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    return out


@st.composite
def _mutated_space(draw: st.DrawFn) -> str:
    data = space_dict("fuzzed")
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(data)))
        node = data
        for k in path[:-1]:
            node = node[k] if isinstance(node, dict) else {}
        if isinstance(node, dict):
            if draw(st.booleans()):
                node[path[-1]] = draw(_HOSTILE_VALUES)
            else:
                node.pop(path[-1], None)
    return yaml.safe_dump(data, allow_unicode=True)


_BODIES = st.one_of(
    _mutated_space(),
    st.text(max_size=300),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
)


def test_fuzz_space_bodies_never_5xx(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Mutated space files (hostile values at random fields, fields removed) and random text:
    every answer is 201, 409 or 422 with a message that names the request body."""
    url = _sqlite(tmp_path_factory.mktemp("fuzz"))
    with make_client(url) as c:

        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
        @given(body=_BODIES)
        def check(body: str) -> None:
            r = c.post(f"{V1}/studies", headers=AUTH, content=body.encode("utf-8", "replace"))
            assert r.status_code in (201, 409, 422), (r.status_code, r.text, body)
            detail = r.json().get("detail")
            if r.status_code == 422:
                assert isinstance(detail, str) and detail.startswith("request body"), detail

        check()
