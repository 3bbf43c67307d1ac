"""Launches started ahead of the tests that read them, a few at a time.

A real launch (a lab run, an experiment) is mostly start-up: rendezvous, and imports in
one rank while the other waits, leave a core idle for much of it. Two at once on this
2-core machine take about two thirds of the time of two in a row (measured on the zoo,
whose conftest started this), so the session queues the launches its tests declare and
runs them in the background, in test order, while the tests read the finished ones.

A test that asks for a launch still queued does not wait behind the others: the queued
one is taken off the queue and run on the test's own thread at once."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")

# Launches in the background at once (0: none ahead, each runs when a test asks for it).
JOBS = max(0, int(os.environ.get("SYNCDOCTOR_AHEAD_JOBS", "2")))


class Ahead(Generic[T]):
    def __init__(self, name: str, jobs: int = JOBS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix=name) if jobs else None
        self._futures: dict[Hashable, Future[T]] = {}
        self._lock = threading.Lock()

    def submit(self, key: Hashable, work: Callable[[], T]) -> None:
        """Queue `work` under `key` (once: a key already queued or done is left as it is)."""
        with self._lock:
            if self._pool is not None and key not in self._futures:
                self._futures[key] = self._pool.submit(work)

    def get(self, key: Hashable, work: Callable[[], T]) -> T:
        """The result of `key`: waited for when it is running or done, run here and now
        when it was never queued or has not started yet. An exception is raised again
        to every test that asks."""
        with self._lock:
            future = self._futures.get(key)
            mine = future is None or future.cancel()
            if mine:
                future = self._futures[key] = Future()
        assert future is not None
        if mine:
            try:
                future.set_result(work())
            except BaseException as error:
                future.set_exception(error)
        return future.result()

    def close(self) -> None:
        """Drops what is still queued and waits for what is running (each launch has its
        own deadline and ends its processes itself)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
