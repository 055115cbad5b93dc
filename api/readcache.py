"""Answers of the hot read endpoints, built once and shared for a short time.

Under load (a writer adding trials, many dashboards polling) the same answers were rebuilt
for every request: database round trips, JSON columns decoded, models validated twice. A
:class:`ReadCache` keeps each answer's bytes: for ``ttl_s`` seconds (``DSE_READ_CACHE_S``,
0 by default: see below) a request is answered on the event loop
without touching the database. Past that, the first request starts one rebuild in a worker
thread and, like every request until the rebuild is done, gets the previous answer
(stale-while-revalidate, at most :data:`MAX_STALE_S` old); without a previous answer,
requests wait for that one build (single flight) instead of starting their own. At most
``builders`` builds run at once (40, the thread pool's size): the database drivers release the
GIL while the database works, so parallel builds use both cores and the waits on PostgreSQL
(in-process, 50 clients: 4 builders served 40 trial pages/s, 16 or 40 about 65-70). Writes
through this API (create, stop) clear the cache; writes by controllers (other processes) show
within ``ttl_s`` plus one rebuild. Errors are not kept (a failed rebuild drops the answer, so
the next request sees the error).

The reuse is off by default (``ttl_s=0``: concurrent requests for the same answer still share
one build): the dashboard refetches a study's pages only when ``/studies`` shows a change, so
a page reused from before that change would stay on its screen until the next one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

__all__ = ["ReadCache", "TimedMemo", "MAX_STALE_S"]

log = logging.getLogger("dse.api")

T = TypeVar("T")

#: The oldest answer served while its rebuild runs; older ones wait for the rebuild.
MAX_STALE_S = 10.0


class ReadCache:
    """Response bodies by key, fresh for ``ttl_s`` seconds (0: every request rebuilds)."""

    def __init__(self, ttl_s: float, size: int = 512, builders: int = 40) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._data: OrderedDict[Hashable, tuple[float, bytes]] = OrderedDict()
        self._inflight: dict[Hashable, asyncio.Future[bytes]] = {}
        self._builders = builders
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()
        self.builds = 0  # answers built (for tests and benchmarks)

    async def get(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        """The body for ``key``: kept if fresh, else ``build()`` run in a worker thread."""
        with self._lock:
            hit = self._data.get(key)
        age = None if hit is None else time.monotonic() - hit[0]
        if hit is not None and age is not None and age < self.ttl_s:
            return hit[1]
        pending = self._inflight.get(key)
        if hit is not None and age is not None and age < MAX_STALE_S and self.ttl_s > 0:
            if pending is None:  # refresh in the background; answer what we have
                task = asyncio.get_running_loop().create_task(self._background(key, build))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return hit[1]
        if pending is not None:  # another request is building it: share its answer
            return await asyncio.shield(pending)
        return await self._build(key, build)

    async def _background(self, key: Hashable, build: Callable[[], bytes]) -> None:
        try:
            await self._build(key, build)
        except Exception as e:  # noqa: BLE001 - the next request rebuilds and sees it
            log.debug("refreshing %r failed: %s", key, e)

    async def _build(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        future.add_done_callback(_consume)
        self._inflight[key] = future
        if self._slots is None or self._slots[0] is not loop:  # one per event loop
            self._slots = (loop, asyncio.Semaphore(self._builders))
        try:
            async with self._slots[1]:
                started = time.monotonic()
                body = await run_in_threadpool(build)
            self.builds += 1
            with self._lock:
                self._data[key] = (started, body)
                self._data.move_to_end(key)
                while len(self._data) > self.size:
                    self._data.popitem(last=False)
            future.set_result(body)
            return body
        except BaseException as e:
            with self._lock:
                self._data.pop(key, None)
            future.set_exception(e)
            raise
        finally:
            del self._inflight[key]

    def clear(self) -> None:
        """Forget every answer (after a write through this API)."""
        with self._lock:
            self._data.clear()


def _consume(future: asyncio.Future[bytes]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "never retrieved" warning when nobody waited


class TimedMemo(Generic[T]):
    """A value per key computed at most once per ``ttl_s`` seconds (thread-safe; for parts
    that many answers share, e.g. a study's trial counts for every page)."""

    def __init__(self, ttl_s: float, size: int = 256) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._data: OrderedDict[Hashable, tuple[float, T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self._lock:
            hit = self._data.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
            return hit[1]
        started = time.monotonic()
        value = compute()
        with self._lock:
            self._data[key] = (started, value)
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
