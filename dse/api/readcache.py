"""Answers of the read endpoints, reused while the data they show has not changed.

Every write of a study's trials, rejections, state or attributes moves the study's version
(``studies.version``) in the same transaction (:mod:`dse.storage`), whichever process
writes: a controller, an importer, this API. An answer is kept with the version it was
built at and reused only while that is still the current one, so it is never older than
the last committed write, on SQLite and PostgreSQL, across processes:

* :class:`StudyVersions` reads every study's ``(id, version)`` for each request, by a query
  that *started after the request arrived* (a write committed before the request is in
  it). Concurrent requests share such queries: while one runs, every request that
  arrives waits for the next, which starts when it ends; so there is at most one in flight
  and one waiting, however many clients poll.
* :class:`ReadCache` keeps, per answer (a study's best, a trial page, ...), the newest
  version's bytes; a request with the same version gets them on the event loop, one with
  a newer version builds the answer once in a worker thread (concurrent requests for it
  share that build) and replaces the old one. An answer built after the version was read
  may show later writes too: it is never older than its version, only sometimes newer.
* :class:`RowFragments` keeps the serialized rows of pages with the stored row each was
  made from: a page built for a new version reads its rows (one query) and serializes only
  those that differ from the kept ones. The rows are read by the build, so a fragment is
  exactly as fresh as the page.

Several server processes (``dse serve --workers N``) each keep their own answers; as the
versions are read from the database for every request, each answers as fresh as the others.

Database work runs in worker threads of three thread pools, never on the event loop: builds
share ``builders`` threads (more wait in the pool's queue, not in threads), heavy builds (a
whole study's insights or timeline) have one thread of their own, so that they queue behind
each other and never behind or in front of a poll's build, and the version reads have a
thread of their own, so a slow build never delays them (nor ``/health``, which is answered
by one). Errors are not kept.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

__all__ = ["ReadCache", "RowFragments", "StudyVersions", "VersionMemo", "Versions"]

T = TypeVar("T")

#: Every study's id and change counters by name: ``(id, version, best_version)``
#: (:meth:`dse.storage.Storage.study_change_counters`).
Versions = Mapping[str, tuple[int, ...]]


class StudyVersions:
    """Every study's ``(id, version)``, read fresh for each caller (see the module doc).

    ``read`` runs in a worker thread of its own (one query at a time).
    """

    def __init__(self, read: Callable[[], Versions]) -> None:
        self._read = read
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dse-versions")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: asyncio.Future[Versions] | None = None  # the next query's callers
        self._running = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.reads = 0  # queries made (for tests and benchmarks)

    async def get(self) -> Versions:
        """The versions as read by a query that started after this call.

        Raises:
            StorageError: the database cannot be read (503).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests start several): start afresh
            self._loop, self._waiting, self._running = loop, None, False
        future = self._waiting
        if future is None:
            future = self._waiting = loop.create_future()
            future.add_done_callback(_consume)
            if not self._running:
                self._start()
        return await asyncio.shield(future)

    def _start(self) -> None:
        future, self._waiting = self._waiting, None
        assert future is not None and self._loop is not None
        self._running = True
        task = self._loop.create_task(self._query(future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _query(self, future: asyncio.Future[Versions]) -> None:
        try:
            self.reads += 1
            versions = await asyncio.get_running_loop().run_in_executor(self._pool, self._read)
        except Exception as e:  # noqa: BLE001 - handed to every caller of this query
            future.set_exception(e)
        except BaseException:
            future.cancel()
            raise
        else:
            future.set_result(versions)
        finally:
            self._running = False
            if self._waiting is not None:  # callers that came while this one ran
                self._start()


class ReadCache:
    """Answer bodies by key, each kept with the version it was built at.

    Args:
        builders: how many builds run at once (in worker threads).
        max_bytes: the most answer bytes kept (least recently used dropped first).
    """

    def __init__(self, *, builders: int = 8, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[Hashable, tuple[Hashable, bytes]] = OrderedDict()
        self._bytes = 0
        self._inflight: dict[tuple[Hashable, Hashable], asyncio.Future[bytes]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # a plain thread pool: builds beyond ``builders`` wait in its queue, not in threads
        # (anyio's to_thread cost several times more CPU per hand-over under load)
        self._pool = ThreadPoolExecutor(builders, thread_name_prefix="dse-reads")
        # heavy builds (a whole study's insights or timeline: up to seconds each) have a
        # thread of their own, so however many are asked for at once they never hold the
        # ``builders`` threads that the polls' builds (a best, a page) need
        self._heavy_pool = ThreadPoolExecutor(1, thread_name_prefix="dse-heavy-reads")
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()
        self.builds = 0  # answers built (for tests and benchmarks)
        self.hits = 0

    async def get(
        self,
        key: Hashable,
        version: Hashable,
        build: Callable[[], bytes],
        *,
        heavy: bool = False,
    ) -> bytes:
        """The body of ``key`` at ``version``: kept, or ``build()`` in a worker thread.

        ``version`` None: nothing to compare with (e.g. no such study yet): built, not kept.
        ``heavy``: built in the one thread of the heavy builds (one at a time, the others
        queued), never in one of the ``builders`` threads.
        """
        loop = asyncio.get_running_loop()
        pool = self._heavy_pool if heavy else self._pool
        if version is None:
            return await loop.run_in_executor(pool, build)
        if self._loop is not loop:
            self._loop, self._inflight = loop, {}
        with self._lock:
            hit = self._data.get(key)
            if hit is not None and hit[0] == version:
                self._data.move_to_end(key)
                self.hits += 1
                return hit[1]
        future = self._inflight.get((key, version))
        if future is None:  # else another request is building it: share its answer
            future = loop.create_future()
            future.add_done_callback(_consume)
            self._inflight[(key, version)] = future
            task = loop.create_task(self._build(key, version, build, future, pool))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(future)

    async def _build(
        self,
        key: Hashable,
        version: Hashable,
        build: Callable[[], bytes],
        future: asyncio.Future[bytes],
        pool: ThreadPoolExecutor,
    ) -> None:
        # a task of its own: a client that goes away does not cancel the others' answer
        try:
            body = await asyncio.get_running_loop().run_in_executor(pool, build)
        except Exception as e:  # noqa: BLE001 - handed to every request waiting for it
            future.set_exception(e)
            return
        except BaseException:
            future.cancel()
            raise
        finally:
            self._inflight.pop((key, version), None)
        self.builds += 1
        self._keep(key, version, body)
        future.set_result(body)

    def warm_heavy(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the heavy builds' thread now (e.g. import what they use, a second
        of CPU, at start-up instead of in the first request); its errors are dropped."""
        self._heavy_pool.submit(fn).add_done_callback(lambda f: f.exception())

    def _keep(self, key: Hashable, version: Hashable, body: bytes) -> None:
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= len(old[1])
            if len(body) > self.max_bytes:
                return
            self._data[key] = (version, body)
            self._bytes += len(body)
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._data.popitem(last=False)
                self._bytes -= len(dropped)

    def clear(self) -> None:
        """Forget every answer."""
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)


class RowFragments:
    """Serialized rows of pages (a trial's JSON object in a trial page), each kept with the
    stored row it was made from and reused while the row read for a page is equal to it:
    a row that changed is made again, whatever else changed. Most rows of a page never change
    once their trial has finished, so a page after a write re-serializes only what changed.
    Thread-safe (called from the builds' worker threads).

    Args:
        max_bytes: the most memory kept, as estimated from the rows' and fragments' sizes
            (least recently used dropped first; 0: nothing kept).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[Hashable, tuple[tuple[Any, ...], bytes, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.made = 0  # fragments made (for tests and benchmarks)
        self.reused = 0

    def get(self, key: Hashable, row: tuple[Any, ...], make: Callable[[], bytes]) -> bytes:
        """The fragment of ``row`` (kept under ``key``): reused while the row is equal."""
        return self.get_many([(key, row)], lambda _: make())[0]

    def get_many(
        self,
        rows: Sequence[tuple[Hashable, tuple[Any, ...]]],
        make: Callable[[tuple[Any, ...]], bytes],
    ) -> list[bytes]:
        """The fragments of ``rows`` (``(key, row)`` pairs, in order): each kept one reused
        while its row is equal, the others ``make(row)`` and kept."""
        out: list[bytes | None] = []
        with self._lock:
            data = self._data
            for key, row in rows:
                hit = data.get(key)
                if hit is not None and hit[0] == row:
                    data.move_to_end(key)
                    out.append(hit[1])
                else:
                    out.append(None)
        made = 0
        for i, (key, row) in enumerate(rows):
            if out[i] is not None:
                continue
            fragment = out[i] = make(row)
            made += 1
            self._keep(key, row, fragment)
        self.made += made
        self.reused += len(rows) - made
        return cast(list[bytes], out)

    def _keep(self, key: Hashable, row: tuple[Any, ...], fragment: bytes) -> None:
        size = len(fragment) + sum(len(v) for v in row if isinstance(v, str)) + _ROW_OVERHEAD
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            if size > self.max_bytes:
                return
            self._data[key] = (row, fragment, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, _, dropped) = self._data.popitem(last=False)
                self._bytes -= dropped

    def __len__(self) -> int:
        return len(self._data)


#: What a kept row costs beyond its strings and fragment (tuple, numbers, dict entry).
_ROW_OVERHEAD = 400


class VersionMemo:
    """Values that many answers of a study share (its record, its trial counts), computed
    once per study version (thread-safe; called from the builds' worker threads). Threads
    that want the same key at the same version while it is being computed wait for that
    computation instead of repeating it (after a write, every page build in flight wants
    the new counts at once)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._data: OrderedDict[Hashable, tuple[Hashable, Any]] = OrderedDict()
        self._inflight: dict[tuple[Hashable, Hashable], threading.Event] = {}
        self._lock = threading.Lock()
        self.computed = 0  # compute() calls (for tests and benchmarks)

    def get(self, key: Hashable, version: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``'s value for ``key`` at ``version`` (None: computed, not kept).

        A failed ``compute()`` is not kept: the threads that waited for it try again (one
        of them computes)."""
        if version is None:
            self.computed += 1
            return compute()
        while True:
            with self._lock:
                hit = self._data.get(key)
                if hit is not None and hit[0] == version:
                    self._data.move_to_end(key)
                    return cast(T, hit[1])
                flight = self._inflight.get((key, version))
                if flight is None:
                    flight = self._inflight[(key, version)] = threading.Event()
                    break
            flight.wait()  # then it is kept (or failed, or was dropped: look again)
        try:
            self.computed += 1
            value = compute()
        except BaseException:
            with self._lock:
                del self._inflight[(key, version)]
            flight.set()
            raise
        with self._lock:
            del self._inflight[(key, version)]
            self._data[key] = (version, value)
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        flight.set()
        return value


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "never retrieved" warning when nobody waited
