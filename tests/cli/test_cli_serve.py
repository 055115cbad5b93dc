"""``dse serve`` prints where it serves; a port in use is exit 1 with a message saying so;
hints for a missing extra name the distribution dse is published under."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from dse import DISTRIBUTION, install_hint
from dse.cli import listen_socket, main


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
