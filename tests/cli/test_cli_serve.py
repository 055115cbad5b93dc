"""``dse serve`` prints where it serves; a port in use is exit 1 with a message saying so;
hints for a missing extra name the distribution dse is published under; ``--workers N``
processes answer alike."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest

from dse import DISTRIBUTION, install_hint
from dse.cli.main import listen_socket, main
from dse.storage import open_storage


def test_serve_prints_its_url_and_serves_there(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "serve", "--port", "0", "--storage", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dse: serving the dashboard at http://127.0.0.1:"), line
        base = line.split(" at ", 1)[1].split("/ ", 1)[0]
        docs = line.split("API docs: ", 1)[1].split(")", 1)[0]
        assert docs == base + "/api/v1/docs"
        with urllib.request.urlopen(base + "/api/v1/health", timeout=20) as r:
            assert json.load(r)["status"] == "ok"
        with urllib.request.urlopen(docs, timeout=20) as r:
            assert r.status == 200 and b"swagger" in r.read().lower()
        with urllib.request.urlopen(base + "/", timeout=20) as r:
            assert b'id="study-list"' in r.read()
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def test_a_port_in_use_is_exit_1_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["serve", "--port", str(port), "--storage", f"sqlite:///{tmp_path / 's.db'}"])
    assert rc == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "pick another with --port" in err


def test_served_connections_send_without_delay() -> None:
    """Connections accepted on the socket ``dse serve`` listens on have TCP_NODELAY (asyncio
    sets it only for a TCP-proto socket): a response written as headers, then body, is not
    held back until the client's delayed ACK (40 ms per request on a kept-alive
    connection)."""
    sock = listen_socket("127.0.0.1", 0)
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            port = sock.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(run())
    assert seen and seen[0] != 0


def test_install_hints_name_the_distribution() -> None:
    assert DISTRIBUTION != "dse"  # another project owns that name on PyPI
    assert install_hint("api") == f"pip install '{DISTRIBUTION}[api]'"
    from importlib.metadata import distribution

    dist = distribution(DISTRIBUTION)  # the installed distribution has that name
    assert dist.entry_points.select(group="console_scripts", name="dse")
    extras = dist.metadata.get_all("Provides-Extra") or []
    assert "api" in extras
    root = Path(__file__).resolve().parents[2]
    for path in [*root.glob("dse/**/*.py"), *root.glob("api/**/*"), root / "README.md"]:
        if path.is_file() and path.suffix in (".py", ".js", ".html", ".md"):
            assert "'dse[" not in path.read_text() and '"dse[' not in path.read_text(), path
            assert "(dse[" not in path.read_text(), path


def test_readme_demo_installs_what_dse_serve_needs_and_links_the_real_docs() -> None:
    import re
    import tomllib

    from dse.api import create_app

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    demo = next(line for line in readme.splitlines() if "dse start --space examples/" in line)
    installed = re.search(r'-e "\.\[([a-z,]+)\]"', demo)
    assert installed is not None, demo
    wanted = installed.group(1).split(",")
    assert "api" in wanted and set(wanted) <= set(extras)
    assert "dse serve" in demo
    docs = create_app(storage_url="sqlite://").docs_url
    assert docs == "/api/v1/docs"
    assert f"http://127.0.0.1:8000{docs}" in readme
    assert re.search(r"[(\s]/docs\b", readme) is None  # no bare /docs: it is not served


# --- several worker processes ---------------------------------------------------------------


def _workers_of(pid: int) -> list[int]:
    """The worker processes of the ``dse serve`` at ``pid``."""
    kids = [
        int(c)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for c in (task / "children").read_text().split()
    ]
    return [k for k in kids if b"_serve_worker" in _cmdline(k) or b"spawn_main" in _cmdline(k)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _connections_of(pid: int, port: int) -> int:
    """Established TCP connections to ``port`` that process ``pid`` holds."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01":
                inodes.add(f[9])
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        n += link.startswith("socket:[") and link[8:-1] in inodes
    return n


def _start_serving(url: str, workers: int, env: dict[str, str]) -> tuple[Any, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "serve", "--port", "0", "--storage", url,
         "--workers", str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("dse: serving the dashboard at http://127.0.0.1:"), (
        line + proc.stderr.read() if proc.poll() is not None and proc.stderr else line
    )
    assert f", {workers} worker processes)" in line
    return proc, line.split(" at ", 1)[1].split("/ ", 1)[0]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_several_workers_answer_alike_right_after_each_write(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``dse serve --workers 2``: two processes, the kernel spreads 12 kept-alive connections
    over both; after a write by another process (and one through the API) every connection
    answers with it at once, whichever worker holds it and whatever it kept."""
    from tests.api.conftest import new_url
    from tests.api.seed import create_study, ok, space_yaml

    url = new_url(backend, request, tmp_path)
    with open_storage(url) as storage:
        sid = create_study(storage, "s")
    token = "workers-token"
    env = {**os.environ, "DSE_API_TOKEN": token}
    proc, base = _start_serving(url, 2, env)
    clients = [httpx.Client(base_url=base + "/api/v1", timeout=60) for _ in range(12)]
    try:
        for c in clients:  # one connection each, made one after the other
            assert c.get("/health").json()["status"] == "ok"
        workers = _workers_of(proc.pid)
        assert len(workers) == 2
        port = int(base.rsplit(":", 1)[1])
        held = [_connections_of(w, port) for w in workers]
        assert sum(held) == 12 and min(held) >= 1, held  # both workers hold connections
        with open_storage(url) as storage:
            for k in range(3):
                for c in clients:  # every answer kept in both workers
                    assert c.get("/studies/s/trials").json()["count"] == k
                params = {"tensor_model_parallel_size": 1, "micro_batch_size": k + 1,
                          "use_distributed_optimizer": False}  # fmt: skip
                t = storage.claim_trial(study_id=sid, params=params, params_key=str(k),
                                        budget=100, runner="t:1:x")  # fmt: skip
                assert t is not None
                storage.start_trial(t.id, runner="t:1:x", host="h", log_path=None,
                                    metrics_path=None)  # fmt: skip
                storage.finish_trial(t.id, ok(300.0 + k, 50.0), value=300.0 + k,
                                     gpu_seconds=1.0)  # fmt: skip
                for c in clients:
                    assert c.get("/studies/s/trials").json()["count"] == k + 1
                    assert c.get("/studies/s/best").json()["objective"]["value"] == 300.0 + k
        created = clients[0].post(
            "/studies", content=space_yaml("new"), headers={"Authorization": f"Bearer {token}"}
        )
        assert created.status_code == 201, created.text
        for c in clients:
            assert c.get("/studies/new").json()["state"] == "created"
            assert [s["name"] for s in c.get("/studies").json()["data"]] == ["s", "new"]
    finally:
        for c in clients:
            c.close()
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert all(not Path(f"/proc/{w}").exists() for w in workers)  # stopped with it


def test_a_worker_that_dies_is_replaced(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc, base = _start_serving(url, 2, dict(os.environ))
    try:
        (first, second) = _workers_of(proc.pid)
        os.kill(first, signal.SIGKILL)
        deadline = time.time() + 60
        while (
            time.time() < deadline
            and first in _workers_of(proc.pid)
            or len(_workers_of(proc.pid)) < 2
        ):
            time.sleep(0.2)
        now = _workers_of(proc.pid)
        assert len(now) == 2 and first not in now and second in now
        for _ in range(10):  # new connections, to either worker
            with httpx.Client(base_url=base, timeout=60) as c:
                assert c.get("/api/v1/health").status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert f"worker process {first} exited (-9); restarting it" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "2", "--storage", "sqlite://"], "needs a file or server database"),
        (["--workers", "0", "--storage", "sqlite:///x.db"], "--workers must be 1..64, got 0"),
        (["--workers", "65", "--storage", "sqlite:///x.db"], "--workers must be 1..64, got 65"),
    ],
)
def test_bad_workers_are_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--port", "0", *args]) == 2
    assert message in capsys.readouterr().err


def test_workers_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSE_SERVE_WORKERS", "3")
    assert main(["serve", "--port", "0", "--storage", "sqlite://"]) == 2
    assert "--workers 3 needs a file or server database" in capsys.readouterr().err
    monkeypatch.setenv("DSE_SERVE_WORKERS", "0")
    assert main(["serve", "--port", "0", "--storage", "sqlite://"]) == 2
    err = capsys.readouterr().err
    assert "DSE_SERVE_WORKERS: Input should be greater than or equal to 1" in err
