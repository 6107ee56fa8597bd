"""A thread pool whose idle workers end: `concurrent.futures.ThreadPoolExecutor` keeps every thread it ever
started, so a burst of clients left up to max_client_connections idle threads (and their stacks) for the
server's life. Here a worker that waits `idle_seconds` for work ends; the next task starts a new one."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

IDLE_SECONDS = 30.0


class IdleEndingExecutor(Executor):
    def __init__(self, max_workers: int, thread_name_prefix: str, idle_seconds: float = IDLE_SECONDS):
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self.max_workers, self.idle_seconds, self._prefix = max_workers, idle_seconds, thread_name_prefix
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: set[threading.Thread] = set()
        self._idle = 0  # workers waiting for a task
        self._queued = 0  # tasks no worker has taken yet
        self._started = 0  # for the threads' names
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queued += 1
            self._tasks.put((future, fn, args, kwargs))
            if self._queued > self._idle and len(self._workers) < self.max_workers:  # no waiting worker for it
                self._started += 1
                worker = threading.Thread(target=self._work, name=f"{self._prefix}_{self._started}", daemon=True)
                self._workers.add(worker)
                worker.start()
        return future

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._idle += 1
            try:
                task = self._tasks.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._queued == 0:  # no task came meanwhile (submit counts under the same lock)
                        self._workers.discard(me)
                        return
                continue
            with self._lock:
                self._idle -= 1
                if task is None:  # shutdown
                    self._workers.discard(me)
                    return
                self._queued -= 1
            future, fn, args, kwargs = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - the caller receives it
                    future.set_exception(exc)
            del task, future, fn, args, kwargs  # nothing of the task outlives it while the worker waits

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            workers = list(self._workers)
            if cancel_futures:
                while True:
                    try:
                        task = self._tasks.get_nowait()
                    except queue.Empty:
                        break
                    if task is not None:
                        self._queued -= 1
                        task[0].cancel()
            for _ in workers:
                self._tasks.put(None)
        if wait:
            for worker in workers:
                worker.join()

    @property
    def threads(self) -> int:
        """Workers alive now."""
        with self._lock:
            return len(self._workers)
