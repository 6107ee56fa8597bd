"""The server's thread pool (dpsql/server/workers.py): tasks run, at most max_workers at once, idle workers end
and the next task starts one again; shutdown cancels what was queued. Real threads, short idle times."""

from __future__ import annotations

import threading
import time

import pytest

from dpsql.server.workers import IdleEndingExecutor


def wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_tasks_return_their_results_and_exceptions():
    pool = IdleEndingExecutor(2, "t")
    try:
        assert pool.submit(lambda a, b=0: a + b, 2, b=3).result(5) == 5
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(5)
    finally:
        pool.shutdown()


def test_no_task_waits_while_fewer_than_max_workers_run():
    """Four tasks that each wait for all four to be running: they finish only if none waits for a worker."""
    pool = IdleEndingExecutor(4, "t")
    started = threading.Barrier(4, timeout=5)
    try:
        for _ in range(3):  # workers that have been busy and idle before, as after a wave of clients
            pool.submit(time.sleep, 0.01).result(5)
        futures = [pool.submit(started.wait) for _ in range(4)]
        assert all(f.result(5) is not None for f in futures)
        assert pool.threads <= 4
    finally:
        pool.shutdown()


def test_at_most_max_workers_run_at_once():
    pool = IdleEndingExecutor(3, "t")
    running, most, lock = [0], [0], threading.Lock()

    def task():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    try:
        for future in [pool.submit(task) for _ in range(12)]:
            future.result(10)
        assert most[0] == 3 and pool.threads <= 3
    finally:
        pool.shutdown()


def test_idle_workers_end_and_the_next_task_starts_one():
    before = threading.active_count()
    pool = IdleEndingExecutor(8, "t", idle_seconds=0.2)
    gate = threading.Event()
    try:
        futures = [pool.submit(gate.wait, 5) for _ in range(8)]
        assert wait_for(lambda: pool.threads == 8)
        gate.set()
        assert all(f.result(5) for f in futures)
        assert wait_for(lambda: pool.threads == 0 and threading.active_count() == before)
        assert pool.submit(lambda: "again").result(5) == "again"
    finally:
        pool.shutdown()
    assert threading.active_count() == before


def test_shutdown_cancels_queued_tasks_and_refuses_new_ones():
    pool = IdleEndingExecutor(1, "t")
    gate = threading.Event()
    first = pool.submit(gate.wait, 5)
    queued = pool.submit(lambda: "never")
    assert wait_for(lambda: first.running())
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    gate.set()
    assert first.result(5) is True
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
