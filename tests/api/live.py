"""A real uvicorn server in a thread, headless Chromium and PNG checks for browser tests.

The fixtures of the dashboard's browser tests (``browser``, ``page``) are in conftest.py."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from dse.api import Settings, create_app
from tests.conftest import free_port, require_part

CHROMIUM = os.environ.get("DSE_TEST_CHROMIUM", "/usr/bin/chromium")
#: Playwright's default wait of a browser test's page (a hang guard, not a timing: CI's 2-core
#: machine at load 12 took over 20 s to draw a page).
TIMEOUT_MS = 60_000
#: Flags that keep Chromium off the (closed) network and working as root in a container.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def serve(url: str, *, app: Any = None, **settings: Any) -> Iterator[str]:
    """Serve the app on ``url``'s database over HTTP on a free port; yields the base URL.
    (``app``: serve this app instead of a new one.)"""
    app = app if app is not None else create_app(settings=Settings(storage=url, **settings))
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def require_chromium() -> str:
    """The Chromium executable (skip without it; fail when ``CI`` is set)."""
    if not Path(CHROMIUM).exists():
        require_part("Chromium", f"no executable at {CHROMIUM} (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        require_part("Chromium", "Playwright for Python is not installed (the dev extra)")
    return CHROMIUM


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium driven by Playwright (skip without it; fail when ``CI`` is set)."""
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# --- PNG decoding (zlib only; no imaging library) -----------------------------------------


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG (what Chromium writes): (width, height, rows of RGB(A))."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, bytearray()
    width = height = depth = ctype = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    if depth != 8 or ctype not in (2, 6):
        raise ValueError(f"unsupported PNG (bit depth {depth}, color type {ctype})")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(bytes(idat))
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        ftype, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xFF
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def colors(data: bytes) -> dict[tuple[int, int, int], int]:
    """Pixel count per RGB color of a PNG."""
    width, _, rows = png_pixels(data)
    bpp = len(rows[0]) // width if rows else 3
    out: dict[tuple[int, int, int], int] = {}
    for row in rows:
        for i in range(0, len(row), bpp):
            key = (row[i], row[i + 1], row[i + 2])
            out[key] = out.get(key, 0) + 1
    return out


def has_color(
    hist: dict[tuple[int, int, int], int], rgb: tuple[int, int, int], tol: int = 40
) -> int:
    """How many pixels are within ``tol`` (per channel) of ``rgb``."""
    return sum(n for c, n in hist.items() if all(abs(c[k] - rgb[k]) <= tol for k in range(3)))


def api_get(base: str, path: str) -> Any:
    """The JSON answer of ``GET {base}/api/v1{path}`` from a local server of :func:`serve`."""
    with urllib.request.urlopen(f"{base}/api/v1{path}") as r:  # noqa: S310 - the local server
        return json.loads(r.read())


def open_study(page: Any, base: str, study: str) -> None:
    """Opens a study's page in the dashboard and waits for it and its best panel to draw."""
    page.goto(f"{base}/#study={study}")
    page.wait_for_selector(f'#study-view[data-study="{study}"][data-rendered="true"]')
    page.wait_for_selector('#best-panel[data-state="shown"]')
